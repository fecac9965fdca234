"""ctypes mirrors of `decode.cpp`'s structs (keep the field order and types in step with it)."""

from __future__ import annotations

import ctypes

WEIGHT_F32, WEIGHT_I8 = 0, 1
CACHE_F32, CACHE_BF16 = 0, 1

_i32, _i64, _ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p


class Matrix(ctypes.Structure):
    """A projection: fp32 `w_t [k, n]`, or int8 packed `[ceil(n/16), kp/4, 16, 4]` with scale and row sums."""

    _fields_ = [("kind", _i32), ("n", _i64), ("k", _i64), ("kp", _i64), ("w", _ptr), ("scale", _ptr), ("wsum", _ptr)]


class Layer(ctypes.Structure):
    _fields_ = [("qkv", Matrix), ("out", Matrix), ("gate_up", Matrix), ("down", Matrix)]


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
        ("embed", _ptr),
        ("rope", _ptr),
        ("layers", ctypes.POINTER(Layer)),
        ("head", Matrix),
    ]


class Cache(ctypes.Structure):
    _fields_ = [("kind", _i32), ("k", _ptr), ("v", _ptr), ("capacity", _i64)]
