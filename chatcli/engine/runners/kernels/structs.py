"""ctypes mirrors of `decode.cpp`'s structs (keep the field order and types in step with it)."""

from __future__ import annotations

import ctypes

WEIGHT_F32, WEIGHT_I8, WEIGHT_Q4, WEIGHT_Q8 = 0, 1, 2, 3
WEIGHT_Q4K, WEIGHT_Q5K, WEIGHT_Q6K, WEIGHT_PARTS, WEIGHT_Q3K, WEIGHT_Q2K = 4, 5, 6, 7, 8, 9
WEIGHT_F16, WEIGHT_BF16, WEIGHT_F32R, WEIGHT_IQ4NL, WEIGHT_IQ4XS, WEIGHT_MXFP4 = 10, 11, 12, 13, 14, 15
WEIGHT_RAW_Q4K, WEIGHT_RAW_Q6K, WEIGHT_RAW_MXFP4 = 16, 17, 18  # a GGUF's rows as the file holds them (project_raw.h)
# the block types' kernel kinds, by their names in a lean file (quant_blocks, kquant_blocks)
BLOCK_KINDS = {
    "q4": WEIGHT_Q4,
    "q8": WEIGHT_Q8,
    "q2k": WEIGHT_Q2K,
    "q3k": WEIGHT_Q3K,
    "q4k": WEIGHT_Q4K,
    "q5k": WEIGHT_Q5K,
    "q6k": WEIGHT_Q6K,
    "f16": WEIGHT_F16,
    "bf16": WEIGHT_BF16,
    "f32": WEIGHT_F32R,
    "iq4nl": WEIGHT_IQ4NL,
    "iq4xs": WEIGHT_IQ4XS,
    "mxfp4": WEIGHT_MXFP4,
}
CACHE_F32, CACHE_BF16, CACHE_Q8, CACHE_F16 = 0, 1, 2, 3

_i32, _i64, _ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p


class Matrix(ctypes.Structure):
    """A projection: fp32 panels, int8 packed `[ceil(n/16), kp/4, 16, 4]` with scale and row sums,
    q4 / q8 codes with fp16 scales (and mins) and the RMSNorm weight its inputs take (quant_blocks),
    K-quant codes with their scales (kquant_blocks), or parts of those stacked along the outputs."""


Matrix._fields_ = [
    ("kind", _i32),
    ("n", _i64),
    ("k", _i64),
    ("kp", _i64),
    ("w", _ptr),
    ("scale", _ptr),
    ("wsum", _ptr),
    ("d", _ptr),
    ("mins", _ptr),
    ("norm", _ptr),
    ("sc", _ptr),
    ("sm", _ptr),
    ("hi", _ptr),
    ("parts", ctypes.POINTER(Matrix)),
    ("n_parts", _i64),
]


class Layer(ctypes.Structure):
    """A layer's projections, its rope table and window, and the family's vectors (null where absent)."""

    _fields_ = [
        ("qkv", Matrix),
        ("out", Matrix),
        ("gate_up", Matrix),
        ("down", Matrix),
        ("rope", _ptr),
        ("window", _i64),
        ("qkv_bias", _ptr),
        ("q_norm", _ptr),
        ("k_norm", _ptr),
        ("post_attn_norm", _ptr),
        ("post_ffn_norm", _ptr),
        ("router", ctypes.POINTER(Matrix)),  # a mixture of experts' (null: a dense FFN)
        ("experts", ctypes.POINTER(Matrix)),  # every expert's gate_up, then every one's down
        ("out_bias", _ptr),  # gpt-oss (null where absent): attention's output bias [D]
        ("router_bias", _ptr),  # [experts]
        ("experts_bias", _ptr),  # every expert's gate_up bias [2 ffn], then every one's down bias [D]
        ("sinks", _ptr),  # each head's sink logit [H]
    ]


ACT_SILU, ACT_GELU_TANH, ACT_SWIGLU_OAI = 0, 1, 2


class Model(ctypes.Structure):
    _fields_ = [
        ("n_layers", _i64),
        ("hidden", _i64),
        ("heads", _i64),
        ("kv_heads", _i64),
        ("head_dim", _i64),
        ("ffn", _i64),
        ("vocab", _i64),
        ("eps", ctypes.c_float),
        ("attn_scale", ctypes.c_float),
        ("attn_softcap", ctypes.c_float),
        ("act", _i32),
        ("embed", _ptr),
        ("layers", ctypes.POINTER(Layer)),
        ("head", Matrix),
        ("embed_rows", ctypes.POINTER(Matrix)),
        ("embed_scale", ctypes.c_float),
        ("experts", _i64),
        ("experts_used", _i64),
        ("expert_ffn", _i64),
        ("norm_topk", _i32),
        ("pre_norm", _i32),  # 1: RMSNorm before attention and the MLP (0: OLMo 2's norms on the outputs alone)
        ("qk_norm_whole", _i32),  # 1: q_norm / k_norm over all of q and of k (OLMo 2), not each head
        ("residual_scale", ctypes.c_float),  # each block's output times this as it joins the residual (Granite)
    ]


class Cache(ctypes.Structure):
    """Per layer: its keys' and values' arrays, the positions they hold and the first of them."""

    _fields_ = [
        ("kind", _i32),
        ("k", ctypes.POINTER(_ptr)),
        ("v", ctypes.POINTER(_ptr)),
        ("capacity", ctypes.POINTER(_i64)),
        ("base", ctypes.POINTER(_i64)),
    ]


class Segment(ctypes.Structure):
    """One sequence's rows in a batched step (`chatcli_decode_batch`): consecutive positions from `pos`,
    their keys and values into `cache`, logits for the last `logit_rows` of them."""

    _fields_ = [
        ("cache", ctypes.POINTER(Cache)),
        ("pos", _i64),
        ("rows", _i64),
        ("logit_rows", _i64),
    ]
