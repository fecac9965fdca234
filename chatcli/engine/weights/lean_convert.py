"""Converting a transformers decoder of a lean family into a lean file (see `lean_file` for the format).

Runs once per model and kind, with torch and transformers: the weights are fused, transposed,
norm-folded and rope-ordered (`fused_transposed`), then written in the kind's layout. For
`int8` the weights are quantized here, symmetric per output row, after SmoothQuant scales for
the MLP's down projection were measured on a calibration text through the model
(`quantize.down_smoothing`): no start pays for it again. The write is atomic and the file's
sidecar (size, mtime, hash) is written last, so a killed conversion leaves nothing that loads.

This path loads the whole model in fp32 and gathers every output before it writes: the loader takes
it for `int8` (whose calibration runs the model), for a model the caller already holds, and for a
folder `lean_stream` does not read; a folder's safetensors of any other kind are converted a block at
a time by `lean_stream`, through the functions here, into the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from chatcli.engine.weights import Status
from chatcli.engine.weights.families import (
    GEMMA,
    POST_NORMED,
    context_limit,
    lean_support,
    no_rope_layers,
    sliding_layers,
    softcap,
)
from chatcli.engine.weights.layouts import dense, grouped_arrays, pack_int8, padded_vector, panels
from chatcli.engine.weights.lean_file import GROUPED, INT8, LeanConfig, head_rows, rope_order
from chatcli.engine.weights.quant_blocks import GGUFBlocks
from chatcli.engine.weights.sidecar import record


def fused_transposed(parts: list[torch.Tensor], scale=None) -> torch.Tensor:
    """nn.Linear weights `[out_i, in]` → one contiguous `[in, sum out_i]`; `scale [in]` multiplies
    the input rows (a folded RMSNorm weight). q and k come already in rope order (`head_rows`)."""
    parts = [p.detach() for p in parts]
    dim_in = parts[0].shape[1]
    out = torch.empty(dim_in, sum(p.shape[0] for p in parts), dtype=parts[0].dtype, device=parts[0].device)
    col = 0
    for weight in parts:
        n = weight.shape[0]
        dest = out[:, col : col + n]  # [in, n], a view
        src = weight.t()  # [in, n], a view
        if scale is not None:
            torch.mul(src, scale.detach().view(-1, 1), out=dest)
        else:
            dest.copy_(src)
        col += n
    return out


@dataclass
class Block:
    """One decoder layer's weights in the lean vocabulary, whatever the family calls them."""

    q: torch.Tensor  # [H hd, D]
    k: torch.Tensor  # [KV hd, D]
    v: torch.Tensor  # [KV hd, D]
    o: torch.Tensor  # [D, H hd]
    gate: torch.Tensor  # [F, D]
    up: torch.Tensor  # [F, D]
    down: torch.Tensor  # [D, F]
    attn_norm: torch.Tensor | None  # [D]: before attention (folded into qkv); None: OLMo 2 has none
    mlp_norm: torch.Tensor | None  # [D]: before the MLP (folded into gate_up); None: OLMo 2 has none
    qkv_bias: tuple | None = None  # (q [H hd], k [KV hd], v [KV hd])
    q_norm: torch.Tensor | None = None  # [hd], or [H hd] (OLMo 2: over all of q)
    k_norm: torch.Tensor | None = None  # [hd], or [KV hd]
    post_attn_norm: torch.Tensor | None = None  # [D]: on the attention's output (Gemma, OLMo 2)
    post_ffn_norm: torch.Tensor | None = None  # [D]: on the MLP's output (Gemma, OLMo 2)


def norm_weight(module, gemma: bool) -> torch.Tensor:
    """An RMSNorm's multiplier: its weight, or 1 + weight for Gemma's norms."""
    w = module.weight.detach().float()
    return 1.0 + w if gemma else w


def block_parts(block, config) -> Block:
    """The lean view of one decoder layer of a model of a lean family (see `families`)."""
    attn, mlp = block.self_attn, block.mlp
    gemma = config.model_type in GEMMA
    if hasattr(attn, "qkv_proj"):  # Phi-3: fused
        hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        q_rows, kv_rows = config.num_attention_heads * hd, config.num_key_value_heads * hd
        q, k, v = attn.qkv_proj.weight.split([q_rows, kv_rows, kv_rows])
    else:
        q, k, v = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight
    if hasattr(mlp, "gate_up_proj"):
        gate, up = mlp.gate_up_proj.weight.chunk(2, 0)
    else:
        gate, up = mlp.gate_proj.weight, mlp.up_proj.weight
    post_only = config.model_type in POST_NORMED  # OLMo 2: norms on the blocks' outputs, none before them
    parts = Block(
        q, k, v, attn.o_proj.weight, gate, up, mlp.down_proj.weight,
        attn_norm=None if post_only else norm_weight(block.input_layernorm, gemma),
        mlp_norm=None if post_only else norm_weight(
            block.pre_feedforward_layernorm if gemma else block.post_attention_layernorm, gemma
        ),
    )  # fmt: skip
    if getattr(attn, "q_proj", None) is not None and attn.q_proj.bias is not None:
        parts.qkv_bias = (attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias)
    if getattr(attn, "q_norm", None) is not None:
        parts.q_norm, parts.k_norm = norm_weight(attn.q_norm, gemma), norm_weight(attn.k_norm, gemma)
    if gemma or post_only:
        parts.post_attn_norm = norm_weight(block.post_attention_layernorm, gemma)
        parts.post_ffn_norm = norm_weight(block.post_feedforward_layernorm, gemma)
    return parts


Parts = list[
    tuple[torch.Tensor, "torch.Tensor | None"]
]  # a fused projection's weights [n_i, k], each with its row order


def projection_parts(model, smooth=None, rotary: int | None = None) -> dict[str, tuple[Parts, torch.Tensor | None]]:
    """Every projection of a transformers decoder, by tensor name, as the weights it fuses (q/k
    with their rope row order) and the RMSNorm weight before it (None where there is none);
    `smooth`: per-layer SmoothQuant scales for down (up / s, down * s)."""
    config, inner = model.config, model.model
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    out = {}
    for i, block in enumerate(inner.layers):
        b = block_parts(block, config)
        up, down = b.up, b.down  # [F, D], [D, F]
        if smooth is not None:  # act(gate) * up is linear in up: down's input j / s_j, its column j * s_j
            up, down = up / smooth[i][:, None], down * smooth[i][None, :]
        q_rows, k_rows = head_rows(b.q.shape[0], heads, rotary), head_rows(b.k.shape[0], kv_heads, rotary)
        out[f"layers.{i}.qkv"] = ([(b.q, q_rows), (b.k, k_rows), (b.v, None)], b.attn_norm)
        out[f"layers.{i}.out"] = ([(b.o, None)], None)
        out[f"layers.{i}.gate_up"] = ([(b.gate, None), (up, None)], b.mlp_norm)
        out[f"layers.{i}.down"] = ([(down, None)], None)
    final_norm = norm_weight(inner.norm, config.model_type in GEMMA)
    out["head"] = ([(model.get_output_embeddings().weight, None)], final_norm)
    return out


def projections(model, smooth: list[torch.Tensor] | None = None, rotary: int | None = None) -> dict[str, torch.Tensor]:
    """Every projection of a transformers decoder as `w_t [k, n]` (norms folded, q/k rope-ordered),
    by tensor name; `smooth`: per-layer SmoothQuant scales for down (up / s, down * s)."""
    return {
        name: fused_transposed([w if rows is None else w[rows] for w, rows in parts], norm)
        for name, (parts, norm) in projection_parts(model, smooth, rotary).items()
    }


def vectors(model, config: LeanConfig, rotary: int | None = None) -> dict[str, torch.Tensor]:
    """The per-layer fp32 vectors of `config.vectors()`, rope-ordered where they meet q and k."""
    hd, out = config.head_dim, {}
    for i, block in enumerate(model.model.layers):
        b = block_parts(block, model.config)
        if config.qkv_bias:
            q, k, v = (t.detach().float() for t in b.qkv_bias)
            q, k = q[head_rows(len(q), config.heads, rotary)], k[head_rows(len(k), config.kv_heads, rotary)]
            out[f"layers.{i}.qkv_bias"] = torch.cat([q, k, v])
        if config.qk_norm and config.qk_norm_whole:  # over all of q and of k: each head's dims in rope order
            q_rows, k_rows = (
                head_rows(len(b.q_norm), config.heads, rotary),
                head_rows(len(b.k_norm), config.kv_heads, rotary),
            )
            out[f"layers.{i}.q_norm"], out[f"layers.{i}.k_norm"] = b.q_norm[q_rows], b.k_norm[k_rows]
        elif config.qk_norm:
            order = rope_order(hd, rotary)
            out[f"layers.{i}.q_norm"], out[f"layers.{i}.k_norm"] = b.q_norm[order], b.k_norm[order]
        if config.post_norms:
            out[f"layers.{i}.post_attn_norm"], out[f"layers.{i}.post_ffn_norm"] = b.post_attn_norm, b.post_ffn_norm
    return {name: padded_vector(v) for name, v in out.items()}


def rope_table(model, limit: int, layer_type: str | None = None) -> tuple[torch.Tensor, int]:
    """(`[T, hd/2, 2]` cos, sin per position, the rotated dims): the model's own rotary embedding
    over positions 0..limit-1 (rope scaling and attention scaling as transformers computes them),
    pairs past the rotated dims (partial rotary) as (1, 0)."""
    rotary = model.model.rotary_emb
    positions = torch.arange(limit)[None]  # [1, T]
    x = torch.zeros(1, dtype=torch.float32)
    args = (layer_type,) if getattr(rotary, "layer_types", None) else ()
    cos, sin = rotary(x, positions, *args)  # [1, T, r] each, rotate-half: both halves the same
    r = cos.shape[-1]
    c = model.config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    table = torch.zeros(limit, hd // 2, 2)
    table[:, :, 0] = 1.0
    table[:, : r // 2, 0], table[:, : r // 2, 1] = cos[0, :, : r // 2].float(), sin[0, :, : r // 2].float()
    return table.contiguous(), r


def attention_scale(model) -> float:
    return float(model.model.layers[0].self_attn.scaling)


def lean_config(model, limit: int, kind: str, source: str) -> LeanConfig:
    c = model.config
    heads = c.num_attention_heads
    family = c.model_type
    first = block_parts(model.model.layers[0], c)
    sliding = sliding_layers(c)
    kinds = set(getattr(model.model.rotary_emb, "layer_types", None) or ())
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return LeanConfig(
        layers=c.num_hidden_layers,
        hidden=c.hidden_size,
        heads=heads,
        kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        ffn=c.intermediate_size,
        vocab=model.get_output_embeddings().weight.shape[0],
        embed_rows=model.model.embed_tokens.weight.shape[0],
        eps=float(c.rms_norm_eps),
        positions=limit,
        kind=kind,
        source=source,
        family=family,
        qkv_bias=first.qkv_bias is not None,
        qk_norm=first.q_norm is not None,
        post_norms=first.post_attn_norm is not None,
        act="gelu_tanh" if family in GEMMA else "silu",
        attn_scale=attention_scale(model),
        attn_softcap=softcap(c, "attn_logit_softcapping"),
        final_softcap=softcap(c, "final_logit_softcapping"),
        window=int(getattr(c, "sliding_window", None) or 0) if sliding else 0,
        sliding=sliding,
        sliding_rope=bool(sliding) and {"sliding_attention", "full_attention"} <= kinds,
        nope=no_rope_layers(c),
        pre_norms=first.attn_norm is not None,
        qk_norm_whole=first.q_norm is not None and first.q_norm.shape[0] != head_dim,
        residual_scale=float(getattr(c, "residual_multiplier", None) or 1.0),
        logits_scaling=float(getattr(c, "logits_scaling", None) or 1.0),
    )


def embed_scale(model) -> torch.Tensor | None:
    """What every embedding row looked up is multiplied by (Gemma's sqrt(D), Granite's multiplier), or None."""
    scale = getattr(model.model.embed_tokens, "embed_scale", None)
    if scale is None and model.config.model_type in GEMMA:
        scale = torch.tensor(model.config.hidden_size**0.5)
    if scale is None and getattr(model.config, "embedding_multiplier", None) not in (None, 1.0):
        scale = torch.tensor(float(model.config.embedding_multiplier))
    return None if scale is None else torch.as_tensor(scale).float()


def embedding(model) -> torch.Tensor:
    """`[V, D]` fp32, Gemma's sqrt(D) scale folded in (it multiplies every row looked up)."""
    weight = model.model.embed_tokens.weight.detach().float()
    scale = embed_scale(model)
    return (weight * scale).contiguous() if scale is not None else weight.contiguous()


def rope_tables(model, limit: int, config: LeanConfig) -> tuple[dict, int]:
    """({"rope": `[T, hd/2, 2]`, and "rope_sliding" where sliding layers rotate by their own base}
    as numpy arrays, the rotated dims): see `rope_table`."""
    types = sorted(getattr(model.model.rotary_emb, "layer_types", None) or [None])
    rope, rotary = rope_table(model, limit, "full_attention" if "full_attention" in types else types[0])
    tables = {"rope": rope.numpy()}
    if config.sliding_rope:
        tables["rope_sliding"] = rope_table(model, limit, "sliding_attention")[0].numpy()
    return tables, rotary


def grouped_parts(model, config: LeanConfig, rotary: int | None) -> tuple[LeanConfig, dict]:
    """A q4 / q8 file's config (whether the head is the embedding, the embedding's scale) and its
    projections (`projection_parts`), with the embedding where the head is not tied to it."""
    parts = projection_parts(model, None, rotary)
    embed, head = model.model.embed_tokens.weight, model.get_output_embeddings().weight
    tied = embed.data_ptr() == head.data_ptr() and embed.shape == head.shape
    if not tied:  # the embedding as blocks too: a lookup reads one row's blocks, not a page of floats
        parts["embed"] = ([(embed, None)], None)
    scale = embed_scale(model)
    return replace(config, tied=tied, embed_scale=1.0 if scale is None else float(scale)), parts


def lean_arrays(
    model,
    limit: int,
    kind: str,
    source: str,
    calibration_ids: list[int] | None = None,
    status: Status | None = None,
    gguf=None,
) -> tuple[LeanConfig, dict]:
    """The lean file's tensors for `model` (numpy arrays, BF16 as (code, uint16 array)) and its config;
    `gguf`: the source GGUF's blocks, for a grouped kind (see `grouped_arrays`)."""
    status = status or (lambda *_a, **_k: None)
    reason = lean_support(model.config)
    if reason:
        raise ValueError(f"the lean path cannot run this model: {reason}")
    config = lean_config(model, limit, kind, source)
    dtype = config.weights
    smooth = None
    if dtype == INT8:
        from chatcli.engine.weights.quantize import down_smoothing

        if calibration_ids is None:
            raise ValueError("an int8 lean file needs calibration ids (quantize.CALIBRATION_TEXT, tokenized)")
        status("Measuring activation ranges for int8")
        smooth = down_smoothing(model, calibration_ids)
    arrays, rotary = rope_tables(model, limit, config)
    if kind not in GROUPED:
        arrays["embed"] = embedding(model).numpy()  # [V, D]
    arrays.update({name: v.numpy() for name, v in vectors(model, config, rotary).items()})
    if kind in GROUPED:
        names = {p.data_ptr(): name for name, p in model.named_parameters()}
        config, parts = grouped_parts(model, config, rotary)
        arrays.update(grouped_arrays(parts, names, kind, gguf, status))
        return config, arrays
    weights = projections(model, smooth, rotary)
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
            arrays[name] = dense(w_t, dtype)
    status("Writing the lean weights", len(weights), len(weights))
    return config, arrays


def convert_lean(
    folder: Path,
    path: Path,
    kind: str,
    source: str,
    status: Status | None = None,
    model_loader=None,
    gguf_file: Path | None = None,
) -> None:
    """Write the lean file of `kind` for the model in `folder` at `path` (see `load.lean.lean_weights`);
    a grouped kind takes the blocks of `gguf_file`, or of the GGUF `folder` was converted from."""
    from chatcli.engine.weights.tensorfile import write_tensors

    status = status or (lambda *_a, **_k: None)
    status(f"Converting {folder.name} for the lean runner (once)")
    model, tokenizer = (model_loader or (lambda: _load(folder)))()
    limit = context_limit(model.config, tokenizer)
    ids = None
    if kind == INT8:
        from chatcli.engine.weights.quantize import calibration_ids

        ids = calibration_ids(tokenizer)
    gguf = None
    if kind in GROUPED:
        from chatcli.engine.weights.gguf_convert import source_gguf

        path_gguf = gguf_file or source_gguf(folder)
        gguf = GGUFBlocks(path_gguf, model) if path_gguf else None
    with torch.inference_mode():
        config, arrays = lean_arrays(model, limit, kind, source, ids, status, gguf)
    if gguf is not None:
        status(f"Took {gguf.taken} weights from {path_gguf.name}'s own blocks")
    _pad_all(arrays)
    status("Saving the lean weights")
    write_tensors(path, arrays, {"chatcli": config.to_json()})
    record(path)


def _pad_all(arrays: dict) -> None:
    """Every tensor's byte size a multiple of 64 (the file aligns each tensor; see tensorfile)."""
    from chatcli.engine.weights.tensorfile import ALIGN

    for name, value in arrays.items():
        array = value[1] if isinstance(value, tuple) else value
        if array.nbytes % ALIGN:
            raise ValueError(f"{name} ({array.shape}, {array.dtype}) is not a multiple of {ALIGN} bytes")


def _load(folder: Path):
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True)
    return model.eval(), tokenizer


def load_tokenizer(folder: Path):
    """The folder's transformers tokenizer (its `model_max_length` bounds the context), transformers quiet."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
