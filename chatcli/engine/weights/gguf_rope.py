"""A GGUF's rope table as llama.cpp computes it (`gguf_lean` writes it into the lean file): `rope.freq_base`
with `rope_freqs.weight` (Llama 3's per-frequency factors), a linear scaling, LongRoPE's short factors
(Phi-3) or YaRN (gpt-oss, OLMo 3's full layers: `gguf_oai.yarn`), and the context the table covers."""

from __future__ import annotations

import numpy as np

from chatcli.engine.weights import gguf_oai
from chatcli.engine.weights.families import MAX_CONTEXT
from chatcli.engine.weights.gguf_file import GGUFFile
from chatcli.engine.weights.gguf_windows import rope_bases


def rope_table(meta: GGUFFile, head_dim: int, limit: int, sliding: bool = False, start: int = 0) -> np.ndarray:
    """`[T, hd/2, 2]` cos, sin of positions start..limit-1: angle pos * base^(-2i/r) / factor_i (llama.cpp's
    rope: `rope_freqs` factors where the file has them, positions / the linear scaling factor), pairs past
    r as (1, 0). `sliding`: the sliding layers' own table, unscaled, by their base (`gguf_windows.rope_bases`).
    A LongRoPE file (Phi-3's `rope_factors_short` / `_long`) runs on its short factors, cos and sin times
    `rope.scaling.attn_factor`, up to its original context (`context_limit`), as llama.cpp does there."""
    r = int(meta.hp("rope.dimension_count", head_dim) or head_dim)
    base = rope_bases(meta)[1 if sliding else 0]
    inv = base ** (-np.arange(0, r, 2, dtype=np.float64) / r)  # [r/2]
    for factors in ("rope_freqs.weight", "rope_factors_short.weight"):
        if factors in meta.tensors:
            inv = inv / meta.vector(factors)[: r // 2].astype(np.float64)
    positions = np.arange(start, limit, dtype=np.float64)
    if str(meta.hp("rope.scaling.type", "none")) == "linear" and not sliding:
        positions = positions / float(meta.hp("rope.scaling.factor", 1.0) or 1.0)
    scaled = meta.hp("rope.scaling.type") == "yarn" and not sliding  # gpt-oss's, OLMo 3's full layers'
    inv, yarn = gguf_oai.yarn(meta, inv, r) if scaled else (inv, 1.0)
    angles = positions[:, None] * inv[None, :]  # [T, r/2]
    table = np.zeros((limit - start, head_dim // 2, 2), np.float32)
    table[:, :, 0] = 1.0
    scale = (
        float(meta.hp("rope.scaling.attn_factor", 1.0) or 1.0) if "rope_factors_short.weight" in meta.tensors else 1.0
    )
    scale *= yarn
    table[:, : r // 2, 0], table[:, : r // 2, 1] = scale * np.cos(angles), scale * np.sin(angles)
    return table


def context_limit(meta: GGUFFile, limit: int) -> int:
    """The context the lean file's rope covers: `limit`, the file's context, or a LongRoPE file's original
    one (past it llama.cpp switches every position to the long factors, which a cache cannot follow);
    at most `families.MAX_CONTEXT`."""
    limit = min(limit, int(meta.hp("context_length", limit) or limit), MAX_CONTEXT)
    if "rope_factors_long.weight" in meta.tensors:
        limit = min(limit, int(meta.hp("rope.scaling.original_context_length", limit) or limit))
    return limit
