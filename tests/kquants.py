"""A test-only quantizer for llama.cpp's K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_NL / IQ4_XS, and
random valid blocks.

The `gguf` package dequantizes every type but quantizes only the 32-wide ones (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0) and F16 / BF16; tests that need GGUF files with K-quant tensors get them here. The
block layouts are those of `gguf/quants.py`'s `dequantize_blocks` (the ground truth: a block made
here is checked by dequantizing it there). Super-blocks are 256 weights of one row:

    Q4_K (144 bytes): d, dmin (fp16) | scales[12] | qs[128]            w = d sc_j q - dmin m_j, 8 x 32, q 0..15
    Q5_K (176 bytes): d, dmin (fp16) | scales[12] | qh[32] | qs[128]   the same with q 0..31 (5th bit in qh)
    Q6_K (210 bytes): ql[128] | qh[64] | scales[16] (int8) | d (fp16)  w = d sc_j (q - 32), 16 x 16, q 0..63
    Q3_K (110 bytes): hmask[32] | qs[64] | scales[12] | d (fp16)       w = d (sc_j - 32) (q - 4), 16 x 16, q 0..7
    Q2_K (84 bytes):  scales[16] | qs[64] | d, dmin (fp16)             w = d sc_j q - dmin m_j, 16 x 16, q 0..3
    IQ4_XS (136 bytes): d (fp16) | scales_h (uint16) | scales_l[4] | qs[128]
                      w = d (sc_j - 32) T[q], 8 x 32, q 0..15 an index into IQ4_VALUES (T), sc_j 6 bits
    and, 32 weights a block, IQ4_NL (18 bytes): d (fp16) | qs[16]   w = d T[q] (qs as Q4_0's)

The scheme is deliberately simple, not llama.cpp's rounding search: with mins (Q2_K, Q4_K, Q5_K)
each sub-block's range [min(x, 0), max(x)] is cut into equal steps, the sub-block scales and mins
quantized against the super-block's fp16 d / dmin (the mins first, the scales then fitted to what
the quantized min leaves); without (Q3_K, Q6_K) the value of largest magnitude maps to the most
negative code (-4 / -32), as llama.cpp does, and the signed scales are quantized against fp16 d. IQ4:
the value of largest magnitude maps to the table's -127 (IQ4_XS: each group's scale then quantized
against fp16 d to -32..31), every weight to the nearest table value at that scale.
"""

from __future__ import annotations

import numpy as np

QK_K = 256
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
IQ4_TYPES = {"IQ4_NL": 32, "IQ4_XS": QK_K}  # weights a block
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
CHUNK = 1 << 14  # super-blocks quantized at a time: bounds the temporaries (a few times 16 MiB)


def block_bytes(type_name: str) -> tuple[int, int]:
    """(weights per block, bytes per block) of a GGML type name."""
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]


def quantize(weights: np.ndarray, type_name: str) -> np.ndarray:
    """`weights [..., k]` (float) as raw blocks of `type_name`: uint8 `[..., k // block * block_bytes]`.

    The K-quants (k a multiple of 256) and IQ4_NL / IQ4_XS are quantized here; any other type goes to
    `gguf.quants.quantize` (which returns F32 / F16 arrays as floats, not bytes)."""
    import gguf

    if type_name not in K_TYPES and type_name not in IQ4_TYPES:
        return gguf.quants.quantize(np.asarray(weights, np.float32), gguf.GGMLQuantizationType[type_name])
    weights = np.asarray(weights, np.float32)
    *lead, k = weights.shape
    width = IQ4_TYPES.get(type_name, QK_K)
    if k % width:
        raise ValueError(f"{type_name} needs rows that are a multiple of {width} wide, not {k}")
    blocks = weights.reshape(-1, width)
    size = block_bytes(type_name)[1]
    out = np.empty((len(blocks), size), np.uint8)
    encode = _ENCODERS[type_name]
    for start in range(0, len(blocks), CHUNK):
        out[start : start + CHUNK] = encode(blocks[start : start + CHUNK])
    return out.reshape(*lead, k // width * size)


def random_blocks(n: int, k: int, type_name: str, rng: np.random.Generator) -> np.ndarray:
    """Random but valid raw blocks for `[n, k]` weights of `type_name`: uint8 `[n, k // block * block_bytes]`.

    Code and sub-block scale bytes are random; every fp16 block scale (d, dmin, or Q4_1 / Q5_1's m) is
    a finite positive 1e-3..1e-2, never NaN or inf, so the weights are finite (up to ~10 in magnitude:
    Q6_K's int8 scales times 32). F32 / F16 / BF16 are random weights of about 1e-2, as bytes."""
    if type_name in ("F32", "F16", "BF16"):
        w = (rng.standard_normal((n, k)) * 1e-2).astype(np.float32)
        if type_name == "F16":
            return w.astype(np.float16).view(np.uint8)
        if type_name == "BF16":
            return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return w.view(np.uint8)
    block, size = block_bytes(type_name)
    if k % block:
        raise ValueError(f"{type_name} needs rows that are a multiple of {block} wide, not {k}")
    raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    for offset in FP16_OFFSETS[type_name]:
        scale = rng.uniform(1e-3, 1e-2, size=(n, k // block)).astype(np.float16)
        raw[..., offset : offset + 2] = scale.view(np.uint8).reshape(n, k // block, 2)
    if type_name == "MXFP4":  # its E8M0 scale byte: 2^-10 .. 2^2 (weights up to ~50)
        raw[..., 0] = rng.integers(118, 131, size=(n, k // block), dtype=np.uint8)
    return raw.reshape(n, k // block * size)


# where each block keeps its fp16 scales (gguf/quants.py's hsplits)
FP16_OFFSETS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "MXFP4": (),
}


def _f16(x: np.ndarray) -> np.ndarray:
    """x rounded to fp16, back as float32 (what the dequantizer will multiply by)."""
    return x.astype(np.float16).astype(np.float32)


def _divide(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """x / d, 0 where d is 0."""
    return np.divide(x, d, out=np.zeros(np.broadcast_shapes(x.shape, d.shape), np.float32), where=d != 0)


def _with_mins(blocks: np.ndarray, sub: int, levels: int, scale_bits: int):
    """Asymmetric codes: w ~ d sc_j q - dmin m_j, q in 0..levels, sc_j and m_j in 0..2^scale_bits - 1.

    Returns (q uint8 [nb, 256 // sub, sub], sc uint8 [nb, 256 // sub], m likewise, d fp16 [nb], dmin fp16 [nb])."""
    nb = len(blocks)
    g = blocks.reshape(nb, QK_K // sub, sub)
    top = float(2**scale_bits - 1)
    lo = np.minimum(g.min(-1), 0.0)  # the min is subtracted: m >= 0 so that 0 stays representable
    hi = g.max(-1)
    dmin = _f16((-lo).max(-1, keepdims=True) / top)
    m = np.clip(np.rint(_divide(-lo, dmin)), 0, top)
    mins = dmin * m  # the quantized mins; the steps then span what they leave to the max
    step = np.maximum(hi + mins, 0.0) / levels
    d = _f16(step.max(-1, keepdims=True) / top)
    sc = np.clip(np.rint(_divide(step, d)), 0, top)
    steps = d * sc
    q = np.clip(np.rint(_divide(g + mins[..., None], steps[..., None])), 0, levels)
    return q.astype(np.uint8), sc.astype(np.uint8), m.astype(np.uint8), d[:, 0], dmin[:, 0]


def _symmetric(blocks: np.ndarray, sub: int, low: int, scale_max: int):
    """Signed codes: w ~ d sc_j q, q in low..-low - 1 (the largest magnitude maps to `low`), sc_j in
    -scale_max..scale_max. Returns (q int [nb, 256 // sub, sub], sc int [nb, 256 // sub], d fp16 [nb])."""
    nb = len(blocks)
    g = blocks.reshape(nb, QK_K // sub, sub)
    at = np.abs(g).argmax(-1)[..., None]
    extreme = np.take_along_axis(g, at, -1)[..., 0]
    scale = extreme / low  # signed: extreme / scale = low
    d = _f16(np.abs(scale).max(-1, keepdims=True) / scale_max)
    sc = np.clip(np.rint(_divide(scale, d)), -scale_max, scale_max)
    steps = d * sc
    q = np.clip(np.rint(_divide(g, steps[..., None])), low, -low - 1)
    return q.astype(np.int32), sc.astype(np.int32), d[:, 0]


def _fp16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(len(x), 2)


def _pack_scales_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K's 12 bytes of eight 6-bit scales and mins (inverse of `Q4_K.get_scale_min`)."""
    out = np.empty((len(sc), 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return out


def _nibbles(q: np.ndarray) -> np.ndarray:
    """[nb, 8, 32] 4-bit codes -> qs[128]: byte 32c + l holds sub-block 2c (low nibble) and 2c + 1 (high)."""
    q = q.reshape(len(q), 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(len(q), 128)


def _crumbs(u: np.ndarray) -> np.ndarray:
    """[nb, 256] 2-bit codes -> qs[64]: weight 128h + 32t + l in bits 2t of byte 32h + l."""
    u = u.reshape(len(u), 2, 4, 32).astype(np.uint8)
    return (u[:, :, 0] | (u[:, :, 1] << 2) | (u[:, :, 2] << 4) | (u[:, :, 3] << 6)).reshape(len(u), 64)


def _bits(u: np.ndarray) -> np.ndarray:
    """[nb, 8, 32] bits -> 32 bytes: weight 32j + l in bit j of byte l."""
    shifts = np.arange(8, dtype=np.uint8)[None, :, None]
    return np.bitwise_or.reduce(u.astype(np.uint8) << shifts, axis=1)


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    q, sc, m, d, dmin = _with_mins(blocks, 32, 15, 6)
    return np.concatenate([_fp16_bytes(d), _fp16_bytes(dmin), _pack_scales_k4(sc, m), _nibbles(q)], axis=1)


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    q, sc, m, d, dmin = _with_mins(blocks, 32, 31, 6)
    qh = _bits(q >> 4)
    return np.concatenate([_fp16_bytes(d), _fp16_bytes(dmin), _pack_scales_k4(sc, m), qh, _nibbles(q & 0x0F)], axis=1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    q, sc, d = _symmetric(blocks, 16, -32, 127)
    u = (q + 32).astype(np.uint8).reshape(len(q), QK_K)
    lo = (u & 0x0F).reshape(len(u), 2, 2, 64)  # weight 128h + 64s + l: nibble s of ql[64h + l]
    ql = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(len(u), 128)
    qh = _crumbs(u >> 4)  # weight 128h + 32t + l: bits 2t of qh[32h + l]
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _fp16_bytes(d)], axis=1)


def _q3_k(blocks: np.ndarray) -> np.ndarray:
    q, sc, d = _symmetric(blocks, 16, -4, 31)
    u = (q + 4).astype(np.uint8).reshape(len(q), QK_K)  # 0..7: low 2 bits in qs, the third in hmask
    hmask = _bits((u >> 2).reshape(len(u), 8, 32))
    qs = _crumbs(u & 3)
    s = (sc + 32).astype(np.uint8)  # 6 bits: low nibbles in bytes 0..7, high crumbs in bytes 8..11
    scales = np.empty((len(u), 12), np.uint8)
    scales[:, :8] = (s[:, :8] & 0x0F) | ((s[:, 8:] & 0x0F) << 4)
    hi = (s >> 4).reshape(len(u), 4, 4)  # scale 4t + b: bits 2t of byte 8 + b
    scales[:, 8:] = hi[:, 0] | (hi[:, 1] << 2) | (hi[:, 2] << 4) | (hi[:, 3] << 6)
    return np.concatenate([hmask, qs, scales, _fp16_bytes(d)], axis=1)


def _q2_k(blocks: np.ndarray) -> np.ndarray:
    q, sc, m, d, dmin = _with_mins(blocks, 16, 3, 4)
    scales = sc | (m << 4)
    return np.concatenate([scales, _crumbs(q.reshape(len(q), QK_K)), _fp16_bytes(d), _fp16_bytes(dmin)], axis=1)


def _nearest(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The index of the table value nearest x / step (step 0: the value nearest 0)."""
    scaled = _divide(x, step)
    return np.abs(scaled[..., None] - IQ4_VALUES).argmin(-1).astype(np.uint8)


def _extreme(g: np.ndarray) -> np.ndarray:
    """Each row's value of largest magnitude (the last axis), sign kept."""
    return np.take_along_axis(g, np.abs(g).argmax(-1)[..., None], -1)[..., 0]


def _iq4_nl(blocks: np.ndarray) -> np.ndarray:
    d = _f16(_extreme(blocks) / IQ4_VALUES[0])  # the largest magnitude at -127
    q = _nearest(blocks, d[:, None])
    return np.concatenate([_fp16_bytes(d), q[:, :16] | (q[:, 16:] << 4)], axis=1)


def _iq4_xs(blocks: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    g = blocks.reshape(nb, 8, 32)
    scale = _extreme(g) / IQ4_VALUES[0]  # [nb, 8] signed
    d = _f16(np.abs(scale).max(-1, keepdims=True) / 32)
    ls = np.clip(np.rint(_divide(scale, d)), -32, 31).astype(np.int32)  # less 32: -32..31
    q = _nearest(g, (d * ls)[..., None])  # [nb, 8, 32]
    u = (ls + 32).astype(np.uint16)
    high = np.bitwise_or.reduce((u >> 4) << (2 * np.arange(8, dtype=np.uint16)), axis=1).astype(np.uint16)
    low = (u & 0x0F).astype(np.uint8)
    qs = (q[..., :16] | (q[..., 16:] << 4)).reshape(nb, 128)
    parts = [_fp16_bytes(d[:, 0]), high.view(np.uint8).reshape(nb, 2), low[:, 0::2] | (low[:, 1::2] << 4), qs]
    return np.concatenate(parts, axis=1)


_ENCODERS = {
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl,
    "IQ4_XS": _iq4_xs,
}
