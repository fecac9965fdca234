"""A GGUF tensor's own blocks, every type the kernel runs, laid out for it (no value changes, no fp32).

`tensor_parts` reads one GGUF tensor's raw rows (uint8 `[n, bytes]`, memory-mapped) and gives the
kernel's arrays for it, each value what the file holds:

- K-quants (`q4k`, `q5k`, `q6k`: GGUF's Q4_K, Q5_K, Q6_K, super-blocks of 256 inputs): the codes'
  low 4 bits packed as q4's (`quant_blocks.pack`), their high bits in `hi`, the fp16 `d` (and
  `dmin`) per super-block and the 6-bit (Q6_K: int8 per 16 inputs) scales (and mins) per group,
  16 outputs a block; see `kernels/project.h` for the layout and `kquant_block` for the sums.
- The low-bit K-quants (`q3k`, `q2k`: GGUF's Q3_K, Q2_K, scales per 16 inputs): the codes' low 2
  bits four to a byte in `w`, Q3_K's third bit in `hi` (one plane, as Q5_K's fifth), the fp16 `d`
  (Q2_K: and `dmin`) per super-block, and per output and 16 inputs Q3_K's 6-bit scale less 32 as
  int8, or Q2_K's byte as the file holds it (scale in the low nibble, min in the high one), the
  two of a group of 32 side by side; see `kernels/project_low.h`. No bit is added but Q3_K's
  scale's two spare ones: a Q3_K tensor takes 3.5625 bits a weight to the file's 3.4375 (1.036x),
  a Q2_K one 2.625, as in the file.
- Q4_0, Q4_1, Q8_0 as `q4` / `q8` (`quant_blocks.gguf_codes`); Q5_0 and Q5_1 as `q8` with their
  5-bit codes in bytes (Q5_0: c = q + 112, so d (c - 128) = d (q - 16); Q5_1: d c + m).
- F16, BF16 and F32 (`f16`, `bf16`, `f32`): each element as the file holds it, `[ceil(n/16), k, 16]`
  (input i of a block's 16 outputs side by side), which the kernel converts to fp32 in registers and
  multiplies by the fp32 activations (`kernels/project_float.h`): no fp32 copy of a 16-bit tensor.
- IQ4_NL and IQ4_XS (`iq4nl`, `iq4xs`): 4-bit indices into llama.cpp's table of 16 int8 values
  (`IQ4_VALUES`), packed as q4's codes; IQ4_NL's fp16 d per 32 inputs as q4's `d`, IQ4_XS's fp16 d per
  super-block of 256 as the K-quants' and its 6-bit scale less 32 per group of 32 as int8 `sc`; see
  `kernels/project_iq4.h`. IQ4_NL takes 4.5 bits a weight as in the file, IQ4_XS 4.3125 to the
  file's 4.25 (1.015x: a byte per scale).

A row order (rope's, for the q and k rows of a NEOX-rope family) is applied to whole rows of blocks.
The layouts of the blocks themselves are ggml's (`ggml-common.h`), as the `gguf` package's
dequantizers read them; the tests check every type against those.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chatcli.engine.weights.gguf_file import TYPES
from chatcli.engine.weights.lean_file import block_arrays
from chatcli.engine.weights.quant_blocks import Codes, gguf_codes, pack
from chatcli.engine.weights.tensorfile import padded

SUPER = 256  # inputs a K-quant super-block holds
KINDS = {"Q4_K": "q4k", "Q5_K": "q5k", "Q6_K": "q6k", "Q3_K": "q3k", "Q2_K": "q2k"}
SIGNED = {"q6k": 32, "q3k": 4}  # the kinds of signed scales, no mins: w = d sc (c - zero)
PER_16 = ("q6k", "q3k", "q2k")  # the kinds with a scale per 16 inputs (the rest: per 32)
GROUP_KINDS = {"Q4_0": "q4", "Q4_1": "q4", "Q5_0": "q8", "Q5_1": "q8", "Q8_0": "q8"}  # on the q4 / q8 blocks
FLOATS = {"F16": "f16", "BF16": "bf16", "F32": "f32"}  # float tensors, their elements as they are
FLOAT_DTYPES = {"F16": np.float16, "BF16": np.uint16, "F32": np.float32}  # bf16 held as its bits
IQ4 = {"IQ4_NL": "iq4nl", "IQ4_XS": "iq4xs"}  # indices into IQ4_VALUES
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
MINS = ("Q4_1", "Q5_1")  # the q4 / q8 types with mins (`m`, as long as `d`)
MXFP4 = {"MXFP4": "mxfp4"}  # gpt-oss's experts: indices into MXFP4_VALUES, a power-of-two scale per 32 (bf16 here)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)  # E2M1 doubled
RUN = {**KINDS, **GROUP_KINDS, **FLOATS, **IQ4, **MXFP4}  # every type the kernel runs, by GGUF name
TYPE_IDS = {name: i for i, (name, _, _) in TYPES.items() if name in RUN}  # ggml's ids
BLOCK_BYTES = {name: TYPES[i][2] for name, i in TYPE_IDS.items()}
BLOCK_INPUTS = {name: TYPES[i][1] for name, i in TYPE_IDS.items()}  # 256 (K-quants, IQ4_XS), 32, or 1 (floats)


@dataclass
class KBlocks:
    """A K-quant tensor `[n, k]` decoded: codes `[n, k]` (uint8, 0..3 / 7 / 15 / 31 / 63), fp16 `d` and
    `dmin` `[n, k/256]`, scales `[n, k/32]` (uint8) or `[n, k/16]` (Q6_K, Q3_K: int8 as uint8; Q2_K:
    uint8) and mins as long (Q4_K, Q5_K, Q2_K). IQ4_XS: indices 0..15, `d` per super-block, `sc` `[n, k/32]`
    (int8 as uint8); IQ4_NL: indices, `d` `[n, k/32]`, no scales."""

    kind: str
    codes: np.ndarray
    d: np.ndarray
    dmin: np.ndarray | None
    sc: np.ndarray | None
    sm: np.ndarray | None

    def rows(self, order: np.ndarray) -> KBlocks:
        pick = lambda a: None if a is None else a[order]  # noqa: E731
        return KBlocks(self.kind, self.codes[order], self.d[order], pick(self.dmin), pick(self.sc), pick(self.sm))

    def dequantized(self) -> np.ndarray:
        """`[n, k]` fp32: what the kernel multiplies by (for tests)."""
        n, k = self.codes.shape
        if self.kind in IQ4.values():
            d = np.repeat(self.d.astype(np.float32), 32 if self.sc is None else SUPER, axis=1)
            if self.sc is not None:  # IQ4_XS: d times the group's scale first, as llama.cpp
                d = d * np.repeat(self.sc.view(np.int8).astype(np.float32), 32, axis=1)
            return d * IQ4_VALUES[self.codes].astype(np.float32)
        c = self.codes.astype(np.float32)
        d = np.repeat(self.d.astype(np.float32), SUPER, axis=1)
        if self.kind in SIGNED:
            sc = np.repeat(self.sc.view(np.int8).astype(np.float32), 16, axis=1)
            return d * sc * (c - SIGNED[self.kind])
        per = 16 if self.kind in PER_16 else 32
        sc = np.repeat(self.sc.astype(np.float32), per, axis=1)
        return d * sc * c - np.repeat(self.dmin.astype(np.float32), SUPER, axis=1) * np.repeat(
            self.sm.astype(np.float32), per, axis=1
        )


def _scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins (`[..., 12]`) → 8 scales, 8 mins (`[..., 8]`)."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """Q3_K / Q2_K's 64 bytes of 2-bit codes (`[n, SB, 64]`) -> `[n, SB, 256]`: element 128h + 32j + l
    is bits 2j of byte 32h + l."""
    n, sb = qs.shape[:2]
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
    return ((qs.reshape(n, sb, 2, 1, 32) >> shifts) & 3).reshape(n, sb, 256)


def _decode_low(type_name: str, blocks: np.ndarray, half) -> KBlocks:
    """Q3_K / Q2_K blocks `[n, SB, bytes]` decoded (their scales per 16 inputs)."""
    n, sb = blocks.shape[:2]
    if type_name == "Q2_K":  # scales[16] (scale | min << 4) | qs[64] | d | dmin
        scales, codes = blocks[..., 0:16], _crumbs(blocks[..., 16:80])
        sc, sm = scales & 0x0F, scales >> 4
        d, dmin = half(blocks[..., 80:82]), half(blocks[..., 82:84])
        return KBlocks("q2k", codes.reshape(n, -1), d, dmin, sc.reshape(n, -1), sm.reshape(n, -1))
    hmask, packed = blocks[..., 0:32], blocks[..., 96:108]  # hmask[32] | qs[64] | scales[12] | d
    high = (hmask.reshape(n, sb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1  # bit j: 32j + l
    codes = _crumbs(blocks[..., 32:96]) | (high.reshape(n, sb, 256) << 2)
    low = np.concatenate([packed[..., 0:8] & 0x0F, packed[..., 0:8] >> 4], axis=-1)  # scales 0..7, 8..15
    top = (packed[..., None, 8:12] >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3  # [n, SB, 4t, b]: 4t + b
    sc = ((low | (top.reshape(n, sb, 16) << 4)).astype(np.int16) - 32).astype(np.int8).view(np.uint8)
    return KBlocks("q3k", codes.reshape(n, -1), half(blocks[..., 108:110]), None, sc.reshape(n, -1), None)


def decode_iq4(type_name: str, raw: np.ndarray) -> KBlocks:
    """An IQ4_NL / IQ4_XS tensor's raw rows decoded: indices, d, IQ4_XS's scales less 32."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, BLOCK_BYTES[type_name])
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if type_name == "IQ4_NL":  # d | qs[16]: byte j holds input j (low nibble) and j + 16 (high)
        qs = blocks[..., 2:18]
        return KBlocks("iq4nl", np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1), d, None, None, None)
    sb = blocks.shape[1]  # d | scales_h (uint16: 2 bits a group) | scales_l[4] (4 bits a group) | qs[128]
    high = (blocks[..., 2:4].copy().view(np.uint16) >> (2 * np.arange(8, dtype=np.uint16))) & 3  # [n, SB, 8]
    low = np.stack([blocks[..., 4:8] & 0x0F, blocks[..., 4:8] >> 4], axis=-1).reshape(n, sb, 8)
    sc = ((low | (high.astype(np.uint8) << 4)).astype(np.int16) - 32).astype(np.int8).view(np.uint8)
    qs = blocks[..., 8:136].reshape(n, sb, 8, 16)  # group g: byte 16g + j holds inputs j and j + 16
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return KBlocks("iq4xs", codes.reshape(n, -1), d, None, sc.reshape(n, -1), None)


def decode_k(type_name: str, raw: np.ndarray) -> KBlocks:
    """A K-quant tensor's raw rows (uint8 `[n, k/256 * block bytes]`) decoded, every value kept."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, BLOCK_BYTES[type_name])  # [n, SB, bytes]
    sb = blocks.shape[1]
    half = lambda a: a.copy().view(np.float16)[..., 0]  # noqa: E731 - [n, SB, 2] bytes -> [n, SB]
    if type_name in ("Q3_K", "Q2_K"):
        return _decode_low(type_name, blocks, half)
    if type_name == "Q6_K":
        ql, qh = blocks[..., 0:128], blocks[..., 128:192]
        sc, d = blocks[..., 192:208], half(blocks[..., 208:210])
        halves = ql.reshape(n, sb, 2, 64)
        low = np.stack([halves & 0x0F, halves >> 4], axis=2)  # [n, SB, nibble, half, 64]
        low = low.transpose(0, 1, 3, 2, 4).reshape(n, sb, 256)  # element h*128 + nib*64 + i
        shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
        high = (qh.reshape(n, sb, 2, 1, 32) >> shifts) & 3  # [n, SB, 2(h), 4(j), 32]: element h*128 + j*32 + i
        codes = low | (high.reshape(n, sb, 256) << 4)
        return KBlocks("q6k", codes.reshape(n, -1), d, None, np.ascontiguousarray(sc).reshape(n, -1), None)
    d, dmin = half(blocks[..., 0:2]), half(blocks[..., 2:4])
    sc, mn = _scale_min(blocks[..., 4:16])
    qs = blocks[..., -128:].reshape(n, sb, 4, 32)  # chunk c: low nibbles sub-block 2c, high ones 2c + 1
    codes = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(n, sb, 256)
    if type_name == "Q5_K":
        qh = blocks[..., 16:48].reshape(n, sb, 1, 32)
        codes = codes | (((qh >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1) << 4).reshape(n, sb, 256)
    return KBlocks(KINDS[type_name], codes.reshape(n, -1), d, dmin, sc.reshape(n, -1), mn.reshape(n, -1))


def decode_q5(type_name: str, raw: np.ndarray) -> Codes:
    """Q5_0 / Q5_1 raw rows as `q8` codes in bytes (see the module docstring), every value kept."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, BLOCK_BYTES[type_name])  # [n, G, bytes]
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    at = 4 if type_name == "Q5_1" else 2
    qh = blocks[..., at : at + 4].copy().view(np.uint32)  # [n, G, 1]: bit i is element i's 5th
    qs = blocks[..., at + 4 : at + 20]
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # elements 0..15, 16..31
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [n, G, 32]
    q = low | (high << 4)
    if type_name == "Q5_1":
        return Codes(8, q.reshape(n, -1), d, blocks[..., 2:4].copy().view(np.float16)[..., 0])
    return Codes(8, (q + 112).astype(np.uint8).reshape(n, -1), d, None)


def _per_block(t: np.ndarray, n: int, dtype, inner: int = 1) -> np.ndarray:
    """`[n, X * inner]` per output → `[ceil(n/16), X, 16, inner]` flat, outputs padded with zeros, the byte
    size a multiple of 64."""
    blocks = -(-n // 16)
    full = np.zeros((blocks * 16, t.shape[1]), dtype)
    full[:n] = t
    flat = full.reshape(blocks, 16, -1, inner).transpose(0, 2, 1, 3).ravel()
    pad = -flat.nbytes % 64 // flat.itemsize
    return np.concatenate([flat, np.zeros(pad, dtype)]) if pad else flat


def pack_k(blocks: KBlocks) -> dict[str, np.ndarray]:
    """Decoded K-quant (or IQ4) blocks → the kernel's arrays `w`, `hi` (Q5_K, Q6_K), `d`, `m` (dmin), `sc`, `sm`."""
    if blocks.kind == "iq4nl":  # q4's codes and d
        return pack(Codes(4, blocks.codes, blocks.d, None))
    n, kp = blocks.codes.shape
    count, groups = -(-n // 16), kp // 32
    c = np.zeros((count * 16, kp), np.uint8)
    c[:n] = blocks.codes
    quads = c.reshape(count, 16, groups, 8, 4).transpose(0, 2, 3, 1, 4)  # [B, G, quad, 16 outputs, 4 inputs]
    if blocks.kind in ("q3k", "q2k"):
        return _pack_low(blocks, quads)
    low = quads & 0x0F
    out = {"w": np.ascontiguousarray(low[:, :, 0::2] | (low[:, :, 1::2] << 4)).reshape(count, groups, 4, 64)}
    if blocks.kind == "q5k":
        bits = (quads >> 4) & 1  # [B, G, 8, 16, 4]
        hi = sum(bits[:, :, q].astype(np.uint8) << q for q in range(8))
        out["hi"] = np.ascontiguousarray(hi, np.uint8).reshape(count, groups, 64)
    elif blocks.kind == "q6k":
        bits = ((quads >> 4) & 3).reshape(count, groups, 2, 4, 16, 4)  # [B, G, vector, quad % 4, 16, 4]
        hi = sum(bits[:, :, :, j].astype(np.uint8) << (2 * j) for j in range(4))
        out["hi"] = np.ascontiguousarray(hi, np.uint8).reshape(count, groups, 2, 64)
    out["d"] = _per_block(blocks.d, n, np.float16)
    if blocks.dmin is not None:
        out["m"] = _per_block(blocks.dmin, n, np.float16)
    out["sc"] = _per_block(blocks.sc, n, np.uint8)
    if blocks.sm is not None:
        out["sm"] = _per_block(blocks.sm, n, np.uint8)
    return out


def _pack_low(blocks: KBlocks, quads: np.ndarray) -> dict[str, np.ndarray]:
    """Q3_K / Q2_K (`pack_k`'s quads `[B, G, 8, 16, 4]`) → `w` `[B, G, 2, 64]` (vector v, byte lane L: quad
    4v + j's low 2 bits in bits 2j), Q3_K's `hi` `[B, G, 64]` (bit q: quad q's third), `d` (`m`: dmin)
    and `sc` `[B, G, 16, 2]` (output, then the two 16s of the group: int8 scale, or scale | min << 4)."""
    n = blocks.codes.shape[0]
    count, groups = quads.shape[:2]
    crumbs = (quads & 3).reshape(count, groups, 2, 4, 16, 4)
    out = {"w": sum(crumbs[:, :, :, j] << (2 * j) for j in range(4)).astype(np.uint8).reshape(count, groups, 2, 64)}
    if blocks.kind == "q3k":
        hi = sum(((quads[:, :, q] >> 2) & 1) << q for q in range(8)).astype(np.uint8)
        out["hi"] = np.ascontiguousarray(hi).reshape(count, groups, 64)
    out["d"] = _per_block(blocks.d, n, np.float16)
    sc = blocks.sc
    if blocks.kind == "q2k":
        out["m"] = _per_block(blocks.dmin, n, np.float16)
        sc = sc | (blocks.sm << 4)
    out["sc"] = _per_block(sc, n, np.uint8, inner=2)
    return out


def pack_float(type_name: str, raw: np.ndarray) -> dict[str, np.ndarray]:
    """An F16 / BF16 / F32 tensor's raw rows → `w` `[ceil(n/16), k, 16]` flat (outputs padded with zeros,
    the byte size a multiple of 64), each element's bits as the file holds them."""
    dtype = FLOAT_DTYPES[type_name]
    values = np.ascontiguousarray(raw).view(dtype)
    n, k = values.shape
    blocks = -(-n // 16)
    full = np.zeros((blocks * 16, k), dtype)
    full[:n] = values
    flat = full.reshape(blocks, 16, k).transpose(0, 2, 1).ravel()
    pad = -flat.nbytes % 64 // flat.itemsize
    return {"w": np.concatenate([flat, np.zeros(pad, dtype)]) if pad else flat}


def e8m0_half_bf16(e: np.ndarray) -> np.ndarray:
    """MXFP4's scale bytes as the bf16 bits of d = 2^(e - 128) (llama.cpp's half scale; exact, e = 0, 1 subnormal)."""
    e = e.astype(np.uint16)
    return np.where(e < 2, np.uint16(0x20) << e, (e - 1) << 7).astype(np.uint16)


def pack_mxfp4(raw: np.ndarray) -> dict[str, np.ndarray]:
    """An MXFP4 tensor's raw rows (e | 16 bytes: input j in byte j's low nibble, j + 16 in its high one) → IQ4_NL's
    arrays, `d` the scale as bf16 bits (`kernels/project_iq4.h`); no value changes."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, 17)
    qs = blocks[..., 1:17]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1)
    bits = e8m0_half_bf16(blocks[..., 0])
    out = pack(Codes(4, codes, bits.view(np.float16), None))  # the bits ride in fp16's slots, copied as they are
    out["d"] = out["d"].view(np.uint16)
    return out


def kind_of(type_name: str) -> str | None:
    """The kernel's type for a GGUF type (None: one it does not run)."""
    return RUN.get(type_name)


def packed_by(packer, type_name: str, raw: np.ndarray, arena: dict | None = None) -> dict[str, np.ndarray]:
    """The arrays `tensor_parts` gives (`lean_file.block_arrays`' shapes), made by the compiled kernel's
    `chatcli_pack` (`packer`: its library). `arena`: where to carve them from, one buffer kept from call
    to call (`arena["out"]`, grown where need be), so that a first start's chunks are packed into the
    same pages, not ~0.8 GB of new ones; the arrays returned are then overwritten by the next call."""
    n = raw.shape[0]
    kind = kind_of(type_name)
    k = raw.shape[1] // BLOCK_BYTES[type_name] * BLOCK_INPUTS[type_name]
    arrays = block_arrays(kind, n, k)
    if type_name in MINS:
        arrays["m"] = arrays["d"]
    dtypes = {code: FLOAT_DTYPES.get(code, np.uint8) for code in ("U8", "F16", "BF16", "F32")}  # by safetensors code
    if arena is None:
        out = {key: np.zeros(shape, dtypes[code]) for key, (code, shape) in arrays.items()}
    else:
        sizes = {key: int(np.prod(shape)) * np.dtype(dtypes[code]).itemsize for key, (code, shape) in arrays.items()}
        total = sum(map(padded, sizes.values()))
        if len(arena.get("out", ())) < total:
            arena["out"] = np.empty(total, np.uint8)
        buffer = arena["out"]
        buffer[:total] = 0  # chatcli_pack leaves the padding alone
        out, at = {}, 0
        for key, (code, shape) in arrays.items():
            out[key] = buffer[at : at + sizes[key]].view(dtypes[code]).reshape(shape)
            at += padded(sizes[key])
    raw = np.ascontiguousarray(raw)
    ptr = lambda key: out[key].ctypes.data if key in out else None  # noqa: E731
    if packer.chatcli_pack(TYPE_IDS[type_name], raw.ctypes.data, n, k, *map(ptr, ("w", "hi", "d", "m", "sc", "sm"))):
        raise ValueError(f"the kernel does not pack {type_name}")
    return out


def tensor_parts(
    type_name: str, raw: np.ndarray, order: np.ndarray | None = None, packer=None, arena: dict | None = None
) -> tuple[str, dict] | None:
    """One GGUF tensor's raw rows as (its kernel type: q4, q8, q2k, q3k, q4k, q5k, q6k, f16, bf16, f32,
    iq4nl or iq4xs; the kernel's arrays), rows in `order`; None where the kernel has no type for it (the
    caller converts).
    `packer`: the compiled kernel's library, which packs ~20x faster than numpy (the same bytes, unpadded);
    `arena`: a buffer to pack into, kept from call to call (`packed_by`)."""
    raw = raw if order is None else raw[order]
    if packer is not None and type_name in TYPE_IDS:
        return kind_of(type_name), packed_by(packer, type_name, raw, arena)
    if type_name in KINDS:
        return KINDS[type_name], pack_k(decode_k(type_name, raw))
    if type_name in FLOATS:
        return FLOATS[type_name], pack_float(type_name, raw)
    if type_name in IQ4:
        return IQ4[type_name], pack_k(decode_iq4(type_name, raw))
    if type_name in MXFP4:
        return "mxfp4", pack_mxfp4(raw)
    codes = decode_q5(type_name, raw) if type_name in ("Q5_0", "Q5_1") else gguf_codes(type_name, raw)
    if codes is None:
        return None
    return ("q4" if codes.bits == 4 else "q8"), pack(codes)
