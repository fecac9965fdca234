"""gpt-oss (GGUF architecture `gpt-oss`: gpt-oss-20b / 120b) read from its file as llama.cpp runs it.

What it has beyond qwen3moe's shape, each read here into the lean file's vectors and fields:
- biases on q, k, v (the family's `qkv_bias`), on attention's output (`out_bias`), on the router
  (`ffn_gate_inp.bias`: `router_bias`) and on each expert's gate, up and down (`ffn_{gate,up,down}_exps.bias`
  [experts, rows]: `experts_bias`, every expert's gate then up, then every expert's down);
- attention sinks (`attn_sinks.weight`, a logit per head added to each softmax's denominator: `sinks`);
- its SwiGLU (`swiglu_oai`: llama.cpp's alpha 1.702 and limit 7, which no key holds), the FFN's norm as
  `post_attention_norm` (no sandwich: it has no `post_ffw_norm`), every other layer sliding from the first;
- YaRN rope (`rope.scaling.type` "yarn", `.factor`, `.original_context_length`): `yarn` gives the
  frequencies and the cos/sin scale as llama.cpp's `rope_yarn` does (the correction dims floored and
  ceiled as `ggml_rope_yarn_corr_dims` does, beta_fast 32, beta_slow 1; mscale 1 + 0.1 ln(factor)).
The router takes the top 4 of its logits and a softmax over them: the kernel's softmax over all,
the top k, renormalised (`norm_topk`), is the same choice and the same weights.
"""

from __future__ import annotations

import math

import numpy as np

from chatcli.engine.weights.gguf_file import GGUFFile

ARCH = "gpt-oss"
BETA_FAST, BETA_SLOW = 32.0, 1.0  # llama.cpp's defaults (the file has no key for them)


def yarn(meta: GGUFFile, inv: np.ndarray, rotary: int) -> tuple[np.ndarray, float]:
    """YaRN's frequencies from the plain ones `inv` [r/2] (theta_i = base^(-2i/r)), and the factor cos and sin
    are scaled by: each pair's angle interpolated (divided by the factor) below the correction range,
    extrapolated (kept) above it, a linear ramp between."""
    factor = float(meta.hp("rope.scaling.factor", 1.0) or 1.0)
    if factor <= 1.0:
        return inv, 1.0
    original = float(meta.hp("rope.scaling.original_context_length", 4096) or 4096)
    base = float(meta.hp("rope.freq_base", 10000.0) or 10000.0)

    def dim(rotations: float) -> float:  # the pair whose wavelength makes `rotations` turns in the original context
        return rotary * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(0.0, math.floor(dim(BETA_FAST))), min(rotary - 1.0, math.ceil(dim(BETA_SLOW)))
    i = np.arange(len(inv), dtype=np.float64)
    ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)  # 1: extrapolated, 0: interpolated
    mixed = inv / factor * (1.0 - ramp) + inv * ramp
    return mixed, 1.0 + 0.1 * math.log(factor)


def oai_vectors(meta: GGUFFile, layers: int, padded) -> dict:
    """Per layer, the lean file's `out_bias`, `router_bias`, `experts_bias` and `sinks` (`padded`: to 16 floats);
    none where the file has no output bias (every other family)."""
    out = {}
    for i in range(layers):
        b = f"blk.{i}."
        if b + "attn_output.bias" not in meta.tensors:
            return {}
        out[f"layers.{i}.out_bias"] = padded(meta.vector(b + "attn_output.bias"))
        out[f"layers.{i}.router_bias"] = padded(meta.vector(b + "ffn_gate_inp.bias"))
        gate, up, down = (_rows(meta, b + f"ffn_{x}_exps.bias") for x in ("gate", "up", "down"))  # [E, rows]
        out[f"layers.{i}.experts_bias"] = padded(np.concatenate([np.concatenate([gate, up], 1).ravel(), down.ravel()]))
        out[f"layers.{i}.sinks"] = padded(meta.vector(b + "attn_sinks.weight"))
    return out


def _rows(meta: GGUFFile, name: str) -> np.ndarray:
    """A 2-D F32 tensor [rows, k] (GGUF's shape [k, rows]) as numpy's [rows, k]."""
    t = meta.tensors[name]
    return meta.vector(name).reshape(int(t.shape[1]), int(t.shape[0]))


def missing(meta: GGUFFile) -> str | None:
    """What a gpt-oss file lacks that the kernel needs (None: nothing): every layer's biases and sinks."""
    for i in range(int(meta.hp("block_count"))):
        b = f"blk.{i}."
        wanted = ["attn_output.bias", "ffn_gate_inp.bias", "attn_sinks.weight", "attn_q.bias", "attn_k.bias"]
        wanted += ["attn_v.bias", *(f"ffn_{x}_exps.bias" for x in ("gate", "up", "down")), "post_attention_norm.weight"]
        for name in wanted:
            if b + name not in meta.tensors:
                return f"{b}{name} is missing"
    return None
