"""Converting a transformers Llama into a lean file (see `lean_weights` for the format).

Runs once per model and kind, with torch and transformers: the weights are fused, transposed,
norm-folded and rope-ordered (`fused_transposed`), then written in the kind's layout. For
`int8` the weights are quantized here, symmetric per output row, after SmoothQuant scales for
the MLP's down projection were measured on a calibration text through the model
(`quantize.down_smoothing`): no start pays for it again. The write is atomic and the file's
sidecar (size, mtime, hash) is written last, so a killed conversion leaves nothing that loads.
"""

from __future__ import annotations

from pathlib import Path

import torch

from chatcli.engine.lean_weights import INT8, PANEL, LeanConfig, Status, lean_support, record


def fused_transposed(parts: list[torch.Tensor], scale=None, interleave: tuple = ()) -> torch.Tensor:
    """nn.Linear weights `[out_i, in]` → one contiguous `[in, sum out_i]`, written once, in place.

    `scale [in]` multiplies the input rows (a folded RMSNorm weight). The first
    `len(interleave)` parts (q, k with that many heads) get their rows reordered per head
    from rotate-half pairs (i, i + hd/2) to adjacent pairs (2i, 2i + 1); q and k get the
    same order, so attention scores are unchanged.
    """
    parts = [p.detach() for p in parts]
    dim_in = parts[0].shape[1]
    out = torch.empty(dim_in, sum(p.shape[0] for p in parts), dtype=parts[0].dtype, device=parts[0].device)
    col = 0
    for i, weight in enumerate(parts):
        n = weight.shape[0]
        dest = out[:, col : col + n]  # [in, n], a view
        src = weight.t()  # [in, n], a view
        if i < len(interleave):
            heads = interleave[i]
            half = n // heads // 2
            dest = dest.view(dim_in, heads, half, 2)  # adjacent pairs
            src = src.view(dim_in, heads, 2, half).transpose(2, 3)  # rotate-half pairs, as a view
        if scale is not None:
            torch.mul(src, scale.detach().view(-1, *([1] * (src.dim() - 1))), out=dest)
        else:
            dest.copy_(src)
        col += n
    return out


def panels(w_t: torch.Tensor) -> torch.Tensor:
    """`w_t [k, n]` → `[ceil(n/64), k, 64]` fp32, zero past n: the kernel's fp32 layout."""
    k, n = w_t.shape
    count = -(-n // PANEL)
    out = torch.zeros(count * PANEL, k, dtype=torch.float32)
    out[:n] = w_t.t()
    return out.view(count, PANEL, k).transpose(1, 2).contiguous()


def pack_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`weight [n, k]` → (packed `[ceil(n/16), kp/4, 16, 4]` int8, scale `[ceil16(n)]`, row sums
    `[ceil16(n)]` int32): symmetric per row, 16 outputs' 4 consecutive inputs per 64 bytes."""
    w = weight.detach().float()
    n, k = w.shape
    kp, blocks = -(-k // 4) * 4, -(-n // 16)
    scale = torch.ones(blocks * 16)
    scale[:n] = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-8)
    q = torch.zeros(blocks * 16, kp, dtype=torch.int8)
    q[:n, :k] = torch.round(w / scale[:n, None]).clamp_(-127, 127).to(torch.int8)
    wsum = q.sum(dim=1, dtype=torch.int32)
    packed = q.view(blocks, 16, kp // 4, 4).transpose(1, 2).contiguous()
    return packed, scale, wsum


def unpack_int8(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """`pack_int8`'s packed weights back to `[n, k]` int8."""
    blocks, quads = packed.shape[0], packed.shape[1]
    return packed.transpose(1, 2).reshape(blocks * 16, quads * 4)[:n, :k]


def projections(model, smooth: list[torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Every projection of a transformers Llama as `w_t [k, n]` (norms folded, q/k rope-ordered),
    by tensor name; `smooth`: per-layer SmoothQuant scales for down (up / s, down * s)."""
    config, inner = model.config, model.model
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    out = {}
    for i, block in enumerate(inner.layers):
        attn, mlp = block.self_attn, block.mlp
        up, down = mlp.up_proj.weight, mlp.down_proj.weight  # [F, D], [D, F]
        if smooth is not None:  # silu(gate) * up is linear in up: down's input j / s_j, its column j * s_j
            up, down = up / smooth[i][:, None], down * smooth[i][None, :]
        out[f"layers.{i}.qkv"] = fused_transposed(
            [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight],
            block.input_layernorm.weight,
            interleave=(heads, kv_heads),
        )
        out[f"layers.{i}.out"] = fused_transposed([attn.o_proj.weight])
        out[f"layers.{i}.gate_up"] = fused_transposed([mlp.gate_proj.weight, up], block.post_attention_layernorm.weight)
        out[f"layers.{i}.down"] = fused_transposed([down])
    out["head"] = fused_transposed([model.get_output_embeddings().weight], inner.norm.weight)  # [D, V]
    return out


def rope_table(model, limit: int) -> torch.Tensor:
    """`[T, hd/2, 2]` cos, sin per position (rope scaling and attention scaling folded in)."""
    rotary = model.model.rotary_emb
    inv_freq = rotary.inv_freq.detach().float().cpu()  # [hd/2], rope scaling already folded in by transformers
    scale = float(getattr(rotary, "attention_scaling", 1.0))
    freqs = torch.outer(torch.arange(limit, dtype=torch.float32), inv_freq)  # [T, hd/2]
    return torch.stack([freqs.cos() * scale, freqs.sin() * scale], dim=-1).contiguous()


def lean_config(model, limit: int, kind: str, source: str) -> LeanConfig:
    c = model.config
    heads = c.num_attention_heads
    return LeanConfig(
        layers=c.num_hidden_layers,
        hidden=c.hidden_size,
        heads=heads,
        kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
        ffn=c.intermediate_size,
        vocab=model.get_output_embeddings().weight.shape[0],
        embed_rows=model.model.embed_tokens.weight.shape[0],
        eps=float(c.rms_norm_eps),
        positions=limit,
        kind=kind,
        source=source,
    )


def lean_arrays(
    model, limit: int, kind: str, source: str, calibration_ids: list[int] | None = None, status: Status | None = None
) -> tuple[LeanConfig, dict]:
    """The lean file's tensors for `model` (numpy arrays, BF16 as (code, uint16 array)) and its config."""
    status = status or (lambda *_a, **_k: None)
    reason = lean_support(model.config)
    if reason:
        raise ValueError(f"the lean path cannot run this model: {reason}")
    config = lean_config(model, limit, kind, source)
    dtype = config.weights
    smooth = None
    if dtype == INT8:
        from chatcli.engine.quantize import down_smoothing

        if calibration_ids is None:
            raise ValueError("an int8 lean file needs calibration ids (quantize.CALIBRATION_TEXT, tokenized)")
        status("Measuring activation ranges for int8")
        smooth = down_smoothing(model, calibration_ids)
    arrays: dict = {
        "embed": model.model.embed_tokens.weight.detach().float().contiguous().numpy(),  # [V, D]
        "rope": rope_table(model, limit).numpy(),  # [T, hd/2, 2]
    }
    weights = projections(model, smooth)
    for i, (name, w_t) in enumerate(weights.items()):
        status("Writing the lean weights", i, len(weights))
        if dtype == INT8:
            packed, scale, wsum = pack_int8(w_t.t())
            arrays[f"{name}.w"], arrays[f"{name}.scale"], arrays[f"{name}.wsum"] = (
                packed.numpy(),
                scale.numpy(),
                wsum.numpy(),
            )
        elif kind.endswith("-panels"):
            arrays[name] = panels(w_t).numpy()
        else:
            arrays[name] = _dense(w_t, dtype)
    status("Writing the lean weights", len(weights), len(weights))
    return config, arrays


def _dense(w_t: torch.Tensor, dtype: str):
    tensor = w_t.to(getattr(torch, dtype)).contiguous()
    if tensor.dtype == torch.bfloat16:
        return ("BF16", tensor.view(torch.int16).numpy().view("uint16"))
    return tensor.numpy()


def convert_lean(
    folder: Path, path: Path, kind: str, source: str, status: Status | None = None, model_loader=None
) -> None:
    """Write the lean file of `kind` for the model in `folder` at `path` (see `lean_weights.lean_file`)."""
    from chatcli.engine.tensorfile import write_tensors

    status = status or (lambda *_a, **_k: None)
    status(f"Converting {folder.name} for the lean runner (once)")
    model, tokenizer = (model_loader or (lambda: _load(folder)))()
    from chatcli.engine.load import context_limit

    limit = context_limit(model.config, tokenizer)
    ids = None
    if kind == INT8:
        from chatcli.engine.quantize import calibration_ids

        ids = calibration_ids(tokenizer)
    with torch.inference_mode():
        config, arrays = lean_arrays(model, limit, kind, source, ids, status)
    _pad_all(arrays)
    status("Saving the lean weights")
    write_tensors(path, arrays, {"chatcli": config.to_json()})
    record(path)


def _pad_all(arrays: dict) -> None:
    """Every tensor's byte size a multiple of 64 (the file aligns each tensor; see tensorfile)."""
    from chatcli.engine.tensorfile import ALIGN

    for name, value in arrays.items():
        array = value[1] if isinstance(value, tuple) else value
        if array.nbytes % ALIGN:
            raise ValueError(f"{name} ({array.shape}, {array.dtype}) is not a multiple of {ALIGN} bytes")


def _load(folder: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True)
    return model.eval(), tokenizer
