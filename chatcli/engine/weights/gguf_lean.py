"""A GGUF file → the `gguf` lean file, read from the file alone: no transformers model, no fp32 copy.

What llama.cpp reads, read the same way: the architecture's hyperparameters from the file's metadata
(`<arch>.block_count`, `.embedding_length`, … as `gguf.Keys` names them), the rope of
`<arch>.rope.freq_base` with `rope_freqs.weight` (Llama 3's per-frequency factors) or a linear
scaling, and every tensor by its GGUF name in the type the file holds it (`kquant_blocks`). The
families read so: `llama` (Llama 2/3/3.2, SmolLM, Mistral without a sliding window), `qwen2`
(q/k/v biases), `qwen3` (q/k norms), `qwen3moe` (qwen3's attention, every layer a mixture of experts), `gemma2`
and `gemma3` (Gemma 3's text model), `smollm3` (every fourth layer unrotated: llama.cpp's fixed step, no key
says so), `granite` (`embedding_scale`, `attention.scale`, `residual_scale`, `logit_scale`), `granitemoe` (Granite's
multipliers, every layer a mixture of experts; not its shared experts: `experts_reason`) and `olmo2` (no
`attn_norm` / `ffn_norm`: its `post_attention_norm` and `post_ffw_norm` on the blocks' outputs; `attn_q_norm` /
`attn_k_norm` over all of q and of k; OLMo 3's files with `attention.sliding_window`: its layers slide as
`attention.sliding_window_pattern` says, on plain rope, the others on the file's YaRN: `gguf_windows`).
llama.cpp stores a llama's (SmolLM3's, Granite's) q and k rows in rope's adjacent pairs, the lean order
already; the others rotate halves (NEOX), so their q/k rows (and biases and norms) are put in that order here.

A mixture of experts (`qwen3moe`, a `llama` with `expert_count`: Mixtral, `gpt-oss`: see `gguf_oai`) keeps its
router (`ffn_gate_inp`, F32 as llama.cpp leaves it) as a projection with the FFN's norm, and its experts' 3-D tensors
(`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`: [experts, rows, k]) as stacked 2-D ones, every expert's rows
in turn, so that an expert is a view of its own rows (`native.NativeRunner`); `ffn` is then an expert's width.

Gemma as llama.cpp runs it: the file's norms already hold 1 + w (llama.cpp's converter adds the 1),
the embedding is scaled by sqrt(D), GeGLU, sandwich norms (`post_attention_norm`, `post_ffw_norm`),
sliding layers by llama.cpp's fixed pattern (Gemma 2: every other layer from the first, a window of
4096 where the file does not say; Gemma 3: five of every six, rotated by a base of 10000 unscaled),
scores scaled by 1/sqrt(head_dim) (the 27B's by 1/sqrt(D / heads)), Gemma 2's soft-capping (50 and
30 where the file does not say). Phi-3 (`phi3`): its fused `attn_qkv` and `ffn_up` (gate then up),
partial rotary, LongRoPE's short factors up to the original context, and no sliding window (llama.cpp
leaves Phi-3's window off). `direct_reason` says why a file is not read so (another family, a
sliding window elsewhere, a rope scaling or a tensor type the kernel lacks): the loader then
converts it through transformers as before (`gguf_convert`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from chatcli.engine.weights import Status, gguf_meta, gguf_oai
from chatcli.engine.weights.families import GEMMA
from chatcli.engine.weights.gguf_check import check_header
from chatcli.engine.weights.gguf_file import GGUFFile
from chatcli.engine.weights.gguf_map import raw_experts_plan
from chatcli.engine.weights.gguf_rope import context_limit, rope_table
from chatcli.engine.weights.gguf_windows import SWA_DEFAULT, SWA_PATTERN, own_sliding_rope, sliding_layers
from chatcli.engine.weights.kquant_blocks import kind_of
from chatcli.engine.weights.lean_file import GGUF, LeanConfig, head_rows, norm_before, padded16, rope_order
from chatcli.engine.weights.lean_writer import ChunkWriter, declare_part, write_part

FAMILIES = {arch: model_type for arch, (model_type, _) in gguf_meta.FAMILIES.items()}  # read directly
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")  # [experts, rows, k] each, stacked
NEOX = (
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "phi3",
    "olmo2",
    "gpt_oss",
    *GEMMA,
)  # rope on rotate-half pairs: q/k rows reordered here
SOFTCAP_DEFAULTS = {"gemma2": (50.0, 30.0)}  # attention's and the logits' where the file does not say
LAYERS_27B = {"gemma2": 46, "gemma3": 62}  # llama.cpp scales a 27B's scores by 1/sqrt(D / heads)


def direct_reason(meta: GGUFFile) -> str | None:
    """Why the file is not read directly into a `gguf` lean file (None: it is)."""
    if meta.arch not in FAMILIES:
        return f"architecture {meta.arch!r}"
    if meta.hp("attention.sliding_window") and meta.arch not in (*SWA_PATTERN, "phi3"):
        return "a sliding window"
    scaling = str(meta.hp("rope.scaling.type", "none") or "none")
    if scaling not in ("none", "linear", *(("yarn",) if meta.arch in (gguf_oai.ARCH, "olmo2") else ())):
        return f"rope scaling {scaling!r}"
    if meta.arch == gguf_oai.ARCH and gguf_oai.missing(meta):  # its biases and sinks
        return gguf_oai.missing(meta)
    for name, t in meta.tensors.items():
        if len(t.shape) in (2, 3) and name.endswith(".weight") and kind_of(t.type_name) is None:
            return f"{name} is {t.type_name}"
    if "token_embd.weight" not in meta.tensors:
        return "no token_embd.weight"
    return experts_reason(meta)


def experts_reason(meta: GGUFFile) -> str | None:
    """Why a mixture of experts is not read directly (None: it is, or the file has none): every layer must
    have its router and experts (`ffn_gate_inp`, `ffn_{gate,up,down}_exps`), each expert's rows whole blocks
    of 16 (the kernel's view of one expert in the stacked tensors), and no shared experts (GraniteMoeShared's
    `ffn_{gate,up,down}_shexp`, which the kernel does not compute)."""
    if not meta.hp("expert_count"):
        return None
    if meta.hp("expert_shared_feed_forward_length") or any("_shexp." in name for name in meta.tensors):
        return "shared experts (ffn_*_shexp: GraniteMoeShared's), which the kernel does not compute"
    for i in range(int(meta.hp("block_count"))):
        for part in ("ffn_gate_inp", *EXPERT_TENSORS):
            if f"blk.{i}.{part}.weight" not in meta.tensors:
                return f"blk.{i}.{part}.weight is missing (a layer without experts)"
    rows = int(meta.tensors["blk.0.ffn_gate_exps.weight"].shape[1])
    if rows % 16:
        return f"experts of {rows} rows (the kernel takes a multiple of 16)"
    return None


def plan(meta: GGUFFile) -> dict[str, tuple[list, str | None]]:
    """Every projection by lean name: its parts (GGUF tensor, row order or None) in output order, and
    the GGUF name of the RMSNorm weight before it (None where there is none)."""
    heads = int(meta.hp("attention.head_count"))
    kv_heads = int(meta.hp("attention.head_count_kv", heads) or heads)
    neox = FAMILIES[meta.arch] in NEOX
    tied = "output.weight" not in meta.tensors
    hd = head_dim_of(meta)
    rotary = int(meta.hp("rope.dimension_count", hd) or hd)

    def ordered(name: str, count: int) -> list[int] | None:  # q/k rows in rope's adjacent pairs
        return head_rows(int(meta.tensors[name].shape[1]), count, rotary) if neox else None

    def fused_order() -> list[int]:  # Phi-3's attn_qkv: q's and k's rows ordered, v's as they are
        q, kv = heads * hd, kv_heads * hd
        k = [q + r for r in head_rows(kv, kv_heads, rotary)]
        return head_rows(q, heads, rotary) + k + list(range(q + kv, q + 2 * kv))

    out = {}
    for i in range(int(meta.hp("block_count"))):
        b = f"blk.{i}."
        if b + "attn_qkv.weight" in meta.tensors:
            qkv = [(b + "attn_qkv.weight", fused_order())]
        else:
            qkv = [
                (b + "attn_q.weight", ordered(b + "attn_q.weight", heads)),
                (b + "attn_k.weight", ordered(b + "attn_k.weight", kv_heads)),
                (b + "attn_v.weight", None),
            ]
        pre = b + "attn_norm.weight" in meta.tensors  # OLMo 2: no norm before a block (its norms on the outputs)
        out[f"layers.{i}.qkv"] = (qkv, b + "attn_norm.weight" if pre else None)
        out[f"layers.{i}.out"] = ([(b + "attn_output.weight", None)], None)
        if b + "ffn_gate_inp.weight" in meta.tensors:  # a mixture of experts: the router, then the stacked experts
            norm = b + ("ffn_norm.weight" if b + "ffn_norm.weight" in meta.tensors else "post_attention_norm.weight")
            out[f"layers.{i}.router"] = ([(b + "ffn_gate_inp.weight", None)], norm)  # gpt-oss: its post_attention_norm
            gate, up, down = (b + name + ".weight" for name in EXPERT_TENSORS)
            out[f"layers.{i}.experts_gate_up"] = ([(gate, None), (up, None)], None)
            out[f"layers.{i}.experts_down"] = ([(down, None)], None)
            continue
        gate_up = [(b + "ffn_gate.weight", None)] if b + "ffn_gate.weight" in meta.tensors else []  # Phi-3: in up
        out[f"layers.{i}.gate_up"] = ([*gate_up, (b + "ffn_up.weight", None)], b + "ffn_norm.weight" if pre else None)
        out[f"layers.{i}.down"] = ([(b + "ffn_down.weight", None)], None)
    out["head"] = ([("token_embd.weight" if tied else "output.weight", None)], "output_norm.weight")
    if not tied:
        out["embed"] = ([("token_embd.weight", None)], None)
    return out


def head_dim_of(meta: GGUFFile) -> int:
    hidden, heads = int(meta.hp("embedding_length")), int(meta.hp("attention.head_count"))
    return int(meta.hp("attention.key_length", hidden // heads) or hidden // heads)


def attention_scale(meta: GGUFFile, hidden: int, heads: int, head_dim: int) -> float:
    """The scores' scale (0: the kernel's 1/sqrt(head_dim)): Gemma's as llama.cpp sets it, Granite's (and
    GraniteMoE's) `attention.scale` where the file has one."""
    if meta.arch in gguf_meta.GRANITE:
        return float(meta.hp("attention.scale", 0.0) or 0.0)
    if meta.arch not in LAYERS_27B:
        return 0.0
    if int(meta.hp("block_count")) == LAYERS_27B[meta.arch]:
        return float(hidden // heads) ** -0.5
    return float(head_dim) ** -0.5


def lean_config(
    meta: GGUFFile, limit: int, source: str, parts: dict, vectors: dict, raw: dict | None = None
) -> LeanConfig:
    hidden, heads = int(meta.hp("embedding_length")), int(meta.hp("attention.head_count"))
    head_dim = head_dim_of(meta)
    tied = "output.weight" not in meta.tensors
    gemma = FAMILIES[meta.arch] in GEMMA
    sliding = sliding_layers(meta)
    caps = SOFTCAP_DEFAULTS.get(meta.arch)  # None: the family caps nothing
    experts = int(meta.hp("expert_count", 0) or 0)
    return LeanConfig(
        layers=int(meta.hp("block_count")),
        hidden=hidden,
        heads=heads,
        kv_heads=int(meta.hp("attention.head_count_kv", heads) or heads),
        head_dim=head_dim,
        ffn=int(meta.tensors["blk.0.ffn_gate_exps.weight"].shape[1] if experts else meta.hp("feed_forward_length")),
        vocab=int(meta.tensors["token_embd.weight" if tied else "output.weight"].shape[1]),
        embed_rows=int(meta.tensors["token_embd.weight"].shape[1]),
        eps=float(meta.hp("attention.layer_norm_rms_epsilon", 1e-5)),
        positions=limit,
        kind=GGUF,
        source=source,
        family="olmo3" if meta.arch == "olmo2" and sliding else FAMILIES[meta.arch],  # OLMo 3: olmo2 with windows
        qkv_bias=any(k.endswith("qkv_bias") for k in vectors),
        qk_norm=any(k.endswith("q_norm") for k in vectors),
        post_norms=any(k.endswith("post_attn_norm") for k in vectors),
        act="gelu_tanh" if gemma else "swiglu_oai" if meta.arch == gguf_oai.ARCH else "silu",
        attn_scale=attention_scale(meta, hidden, heads, head_dim),
        attn_softcap=float(meta.hp("attn_logit_softcapping", caps[0])) if caps else 0.0,
        final_softcap=float(meta.hp("final_logit_softcapping", caps[1])) if caps else 0.0,
        window=int(meta.hp("attention.sliding_window", SWA_DEFAULT.get(meta.arch, 0)) or 0) if sliding else 0,
        sliding=sliding,
        sliding_rope=own_sliding_rope(meta, sliding),
        tied=tied,
        embed_scale=float(hidden) ** 0.5 if gemma else float(meta.hp("embedding_scale", 0.0) or 1.0),
        parts={name: [[kind, n] for kind, n, _ in listed] for name, listed in parts.items()},
        types="+".join(sorted({extra[2] for listed in parts.values() for _, _, extra in listed})),
        experts=experts,
        experts_used=int(meta.hp("expert_used_count", 0) or 0) if experts else 0,
        norm_topk=True,  # llama.cpp's qwen3moe, llama (Mixtral), granitemoe normalise; gpt-oss: softmax of the top k
        biases=any(k.endswith("out_bias") for k in vectors),
        sinks=any(k.endswith("sinks") for k in vectors),
        raw_experts=raw or {},
        **family_fields(meta, head_dim),
    )


def family_fields(meta: GGUFFile, head_dim: int) -> dict:
    """The `LeanConfig` fields of SmolLM3 (its unrotated layers, by llama.cpp's fixed step), Granite and
    GraniteMoE (their `residual_scale`, on the attention's and the FFN's or experts' outputs, and `logit_scale`,
    0 or absent: none; their `embedding_scale` and `attention.scale` are read with Gemma's) and
    OLMo 2 (no norm before a block, q/k norms over all of q and of k), as llama.cpp runs them."""
    layers = int(meta.hp("block_count"))
    step = gguf_meta.NO_ROPE_STEP.get(meta.arch)
    out: dict = {"nope": tuple((i + 1) % step == 0 for i in range(layers)) if step else ()}
    out["pre_norms"] = "blk.0.attn_norm.weight" in meta.tensors
    q_norm = meta.tensors.get("blk.0.attn_q_norm.weight")
    out["qk_norm_whole"] = q_norm is not None and int(q_norm.shape[0]) != head_dim
    if meta.arch in gguf_meta.GRANITE:
        out["residual_scale"] = float(meta.hp("residual_scale", 0.0) or 1.0)
        out["logits_scaling"] = float(meta.hp("logit_scale", 0.0) or 1.0)
    return out


ROPE_CHUNK = 4096  # rope table rows computed at once


def write_lean_file(
    meta: GGUFFile,
    path: Path,
    limit: int,
    source: str,
    status: Status | None = None,
    packer=None,
    raw_experts: bool = False,
) -> tuple[LeanConfig, str]:
    """Write the `gguf` lean file at `path` a chunk of rows at a time (the peak memory a chunk's, not the
    model's), every tensor read with `pread` (the GGUF's pages stay page cache, not this process's):
    its config and the file's BLAKE3, hashed as it was written. `raw_experts`: a mixture's experts are left in
    the GGUF where the kernel reads their types as they are (`raw_experts_plan`): a first start then writes only
    the rest (a 9.9 GB Qwen3-MoE file's: 732 MiB)."""
    from chatcli.engine.weights.tensorfile import StreamedTensors

    status = status or (lambda *_a, **_k: None)
    check_header(meta)
    reason = direct_reason(meta)
    if reason:
        raise ValueError(f"the GGUF is not read directly: {reason}")
    heads = int(meta.hp("attention.head_count"))
    head_dim = head_dim_of(meta)
    limit = context_limit(meta, limit)
    projections = plan(meta)
    raw = raw_experts_plan(meta, projections) if raw_experts else {}
    ropes = {"rope": False, **({"rope_sliding": True} if own_sliding_rope(meta, sliding_layers(meta)) else {})}
    small = {}
    for name, (_parts, norm) in projections.items():
        if norm is not None:
            small[norm_before(name)] = _padded(meta.vector(norm))
    kv_heads, rotary = (
        int(meta.hp("attention.head_count_kv", heads) or heads),
        int(meta.hp("rope.dimension_count", head_dim) or head_dim),
    )
    vectors = _family_vectors(
        meta, int(meta.hp("block_count")), heads, kv_heads, head_dim, FAMILIES[meta.arch] in NEOX, rotary
    )
    small.update(vectors)
    out = StreamedTensors(path)
    try:
        for name in ropes:
            out.declare(name, "F32", (limit, head_dim // 2, 2))
        for name, array in small.items():
            out.declare(name, "F32", array.shape)
        parts = {}
        for name, (listed, _norm) in projections.items():
            parts[name] = []
            for j, (tensor, order) in enumerate(listed):
                t = meta.tensors[tensor]
                type_name, n = t.type_name, t.rows  # an expert tensor: every expert's rows
                if name not in raw:
                    declare_part(out, f"{name}.{j}.", t)
                parts[name].append((kind_of(type_name), n, (tensor, order, type_name)))
        config = lean_config(meta, limit, source, parts, vectors, raw)
        out.start({"chatcli": config.to_json()})  # the header first: the file is hashed as it fills
        for name, sliding in ropes.items():  # a chunk of rows at a time: 2^17 rows' float64 angles are 32 MiB
            for start in range(0, limit, ROPE_CHUNK):
                rows = rope_table(meta, head_dim, min(limit, start + ROPE_CHUNK), sliding, start)
                out.write(name, start * rows[0].nbytes, rows)
        for name, array in small.items():
            out.write(name, 0, np.ascontiguousarray(array))
        with ChunkWriter(out) as writer:  # a chunk written while the next is read and packed
            for count, (name, listed) in enumerate(parts.items()):
                status("Writing the lean weights", count, len(parts))
                for j, (_kind, n, (tensor, order, type_name)) in enumerate(listed if name not in raw else ()):
                    write_part(writer, f"{name}.{j}.", meta, tensor, order, type_name, n, packer)
        status("Writing the lean weights", len(parts), len(parts))
        digest = out.close()
    except BaseException:
        out.abort()
        raise
    return config, digest


def _padded(v: np.ndarray) -> np.ndarray:
    out = np.zeros(padded16(len(v)), np.float32)
    out[: len(v)] = v
    return out


def _family_vectors(meta: GGUFFile, layers: int, heads: int, kv_heads: int, hd: int, neox: bool, rotary: int) -> dict:
    """qwen2's q/k/v biases (`qkv_bias`), qwen3's and Gemma 3's q/k norms, in the lean order, Gemma's
    sandwich norms (`post_attn_norm`, `post_ffn_norm`), gpt-oss's biases and sinks (`gguf_oai`)."""
    out = {}
    for i in range(layers):
        b = f"blk.{i}."
        if b + "attn_q.bias" in meta.tensors:
            q, k, v = (meta.vector(b + f"attn_{x}.bias") for x in "qkv")
            if neox:
                q, k = q[head_rows(len(q), heads, rotary)], k[head_rows(len(k), kv_heads, rotary)]
            out[f"layers.{i}.qkv_bias"] = _padded(np.concatenate([q, k, v]))
        q_norm = meta.tensors.get(b + "attn_q_norm.weight")
        if q_norm is not None and int(q_norm.shape[0]) != hd:  # OLMo 2's, over all of q and of k
            q, k = meta.vector(b + "attn_q_norm.weight"), meta.vector(b + "attn_k_norm.weight")
            if neox:
                q, k = q[head_rows(len(q), heads, rotary)], k[head_rows(len(k), kv_heads, rotary)]
            out[f"layers.{i}.q_norm"], out[f"layers.{i}.k_norm"] = _padded(q), _padded(k)
        elif q_norm is not None:
            order = rope_order(hd, rotary) if neox else np.arange(hd)
            out[f"layers.{i}.q_norm"] = _padded(meta.vector(b + "attn_q_norm.weight")[order])
            out[f"layers.{i}.k_norm"] = _padded(meta.vector(b + "attn_k_norm.weight")[order])
        if b + "post_ffw_norm.weight" in meta.tensors:  # gpt-oss's post_attention_norm is its FFN's norm
            out[f"layers.{i}.post_attn_norm"] = _padded(meta.vector(b + "post_attention_norm.weight"))
            out[f"layers.{i}.post_ffn_norm"] = _padded(meta.vector(b + "post_ffw_norm.weight"))
    return {**out, **gguf_oai.oai_vectors(meta, layers, _padded)}


def convert_gguf_lean(gguf_path: Path, path: Path, limit: int, source: str, status: Status | None = None, **how):
    """Write the `gguf` lean file for `gguf_path` at `path` (atomic; its sidecar last); `how`: `write_lean_file`'s
    `packer` (the compiled kernel's library, to repack the blocks; else numpy does, ~20x slower) and
    `raw_experts`."""
    from chatcli.engine.weights.sidecar import record

    status = status or (lambda *_a, **_k: None)
    status(f"Repacking {gguf_path.name}'s blocks for the kernel (once)")
    _config, digest = write_lean_file(GGUFFile(gguf_path), path, limit, source, status, **how)
    record(path, digest)
