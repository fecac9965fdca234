"""Group-wise 4- and 8-bit weights for the compiled kernel, and a GGUF's own blocks.

A `q4` or `q8` projection keeps, per output and group of 32 inputs, unsigned codes c and an
fp16 scale d (and, for Q4_1, an fp16 min m): w = d c + m, or d (c - 8) without mins (Q4_0),
or d (c - 128) (Q8_0). These are exactly GGUF's Q4_0 / Q4_1 / Q8_0 blocks, so a GGUF's
tensors are taken as they are (`gguf_codes`): no requantization, no fp32 copy at run time.
Weights that come as floats are quantized here (`quantize_q4`: Q4_1's min/max scheme;
`quantize_q8`: Q8_0's). `pack` lays codes out for the kernel's dot products (VNNI's, or
AVX2's byte multiplies; project.h: `group_block`): `[ceil(n/16), kp/32, quads, 64]` bytes,
16 outputs a block, each 64 bytes one quad of 4 inputs for 16 outputs; q4 puts quad 2j in the low nibble and 2j + 1 in
the high one (4 quads of bytes a group), q8 has 8. Scales and mins: `[ceil(n/16), kp/32, 16]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chatcli.engine.weights.gguf_file import TYPES
from chatcli.engine.weights.lean_file import GROUP, scales_length  # GROUP: GGUF's block size for Q4_0, Q4_1, Q8_0


@dataclass
class Codes:
    """A projection `[n, k]` as codes `[n, kp]` (uint8), scales and mins `[n, kp/32]` (fp16; mins None: Q4_0 / Q8_0)."""

    bits: int
    codes: np.ndarray
    d: np.ndarray
    m: np.ndarray | None

    def dequantized(self, k: int) -> np.ndarray:
        """`[n, k]` fp32: what the kernel multiplies by."""
        n, kp = self.codes.shape
        c = self.codes.reshape(n, kp // GROUP, GROUP).astype(np.float32)
        d = self.d.astype(np.float32)[..., None]
        if self.m is not None:
            w = c * d + self.m.astype(np.float32)[..., None]
        else:
            w = (c - (128 if self.bits == 8 else 8)) * d
        return w.reshape(n, kp)[:, :k]


def _grouped(weight: np.ndarray) -> np.ndarray:
    n, k = weight.shape
    kp = -(-k // GROUP) * GROUP
    out = np.zeros((n, kp), np.float32)
    out[:, :k] = weight
    return out.reshape(n, kp // GROUP, GROUP)


def quantize_q4(weight: np.ndarray) -> Codes:
    """`[n, k]` floats → Q4_1: per group d = (max - min) / 15, m = min, c = round((w - m) / d)."""
    g = _grouped(np.asarray(weight, np.float32))
    lo, hi = g.min(-1), g.max(-1)
    m = lo.astype(np.float16)
    d = ((hi - lo) / 15).astype(np.float16)
    inv = np.divide(1.0, d.astype(np.float32), out=np.zeros(d.shape, np.float32), where=d > 0)
    c = np.clip(np.rint((g - m.astype(np.float32)[..., None]) * inv[..., None]), 0, 15).astype(np.uint8)
    return Codes(4, c.reshape(len(g), -1), d, m)


def quantize_q8(weight: np.ndarray) -> Codes:
    """`[n, k]` floats → Q8_0: per group d = amax / 127, c = round(w / d) + 128."""
    g = _grouped(np.asarray(weight, np.float32))
    d = (np.abs(g).max(-1) / 127).astype(np.float16)
    inv = np.divide(1.0, d.astype(np.float32), out=np.zeros(d.shape, np.float32), where=d > 0)
    c = (np.clip(np.rint(g * inv[..., None]), -127, 127) + 128).astype(np.uint8)
    return Codes(8, c.reshape(len(g), -1), d, None)


def concat(parts: list[Codes]) -> Codes:
    """Codes stacked along the outputs (fused q/k/v, gate/up): one bit width; mins where any has them."""
    bits = {p.bits for p in parts}
    if len(bits) != 1:
        raise ValueError("fused parts of different bit widths")
    if all(p.m is None for p in parts):
        m = None
    else:  # Q4_0 beside Q4_1: d (c - 8) = d c + (-8 d)
        m = np.concatenate(
            [p.m if p.m is not None else (-8 * p.d.astype(np.float32)).astype(np.float16) for p in parts]
        )
    return Codes(bits.pop(), np.concatenate([p.codes for p in parts]), np.concatenate([p.d for p in parts]), m)


def pack(codes: Codes) -> dict[str, np.ndarray]:
    """Codes → the kernel's arrays: `w` uint8 `[B, G, quads, 64]`, `d` (and `m`) fp16 `[B, G, 16]` flat
    (`scales_length`), padded to 16 outputs."""
    n, kp = codes.codes.shape
    blocks, groups = -(-n // 16), kp // GROUP
    c = np.zeros((blocks * 16, kp), np.uint8)
    c[:n] = codes.codes
    quads = c.reshape(blocks, 16, groups, 8, 4).transpose(0, 2, 3, 1, 4)  # [B, G, quad, 16 outputs, 4 inputs]
    if codes.bits == 4:
        quads = quads[:, :, 0::2] | (quads[:, :, 1::2] << 4)
    out = {"w": np.ascontiguousarray(quads).reshape(blocks, groups, codes.bits, 64)}  # 4 or 8 quads of 64 bytes

    def per_block(t: np.ndarray) -> np.ndarray:  # [B, G, 16], flat, padded to 64 bytes
        full = np.zeros((blocks * 16, groups), np.float16)
        full[:n] = t
        flat = full.reshape(blocks, 16, groups).transpose(0, 2, 1).ravel()
        return np.concatenate([flat, np.zeros(scales_length(n, kp) - flat.size, np.float16)])

    out["d"] = per_block(codes.d)
    if codes.m is not None:
        out["m"] = per_block(codes.m)
    return out


# ---- a GGUF's blocks --------------------------------------------------------------------------

_BLOCK_BYTES = {name: size for name, _, size in TYPES.values() if name in ("Q4_0", "Q4_1", "Q8_0")}


def gguf_codes(type_name: str, data: np.ndarray) -> Codes | None:
    """A GGUF tensor's raw rows (uint8 `[n, bytes]`) as codes, or None where its type is not Q4_0/Q4_1/Q8_0."""
    size = _BLOCK_BYTES.get(type_name)
    if size is None:
        return None
    n = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(n, -1, size)  # [n, G, block]
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if type_name == "Q8_0":
        c = (blocks[..., 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return Codes(8, c.reshape(n, -1), d, None)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0] if type_name == "Q4_1" else None
    qs = blocks[..., 4:20] if type_name == "Q4_1" else blocks[..., 2:18]
    c = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # low nibbles: inputs 0..15 of the block, high: 16..31
    return Codes(4, c.reshape(n, -1), d, m)


class GGUFBlocks:
    """A GGUF file's quantized blocks by the transformers parameter each was loaded into (memory-mapped,
    read per tensor at conversion)."""

    def __init__(self, path, model) -> None:
        import gguf
        from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

        self.reader = gguf.GGUFReader(str(path))
        by_name = {t.name: t for t in self.reader.tensors}
        mapping = get_gguf_hf_weights_map(model, TensorProcessor())  # GGUF name -> transformers name
        self.tensors = {hf: by_name[g] for g, hf in mapping.items() if g in by_name}
        c = model.config
        self.heads = {c.num_attention_heads, getattr(c, "num_key_value_heads", None) or c.num_attention_heads}
        self.taken = 0  # tensors taken as they are

    def codes(self, name: str | None, weight, rows=None) -> Codes | None:
        """The parameter `name` (`weight [n, k]`, its rows then put in `rows` order) as the GGUF's own
        blocks, or None where the file has none for it or they do not dequantize to `weight`."""
        tensor = self.tensors.get(name) if name else None
        codes = gguf_codes(tensor.tensor_type.name, tensor.data) if tensor is not None else None
        want = weight.detach().float().numpy()
        n, k = want.shape
        if codes is None or codes.codes.shape != (n, -(-k // GROUP) * GROUP):
            return None
        have = codes.dequantized(k)
        tolerance = 1e-6 * float(np.abs(want).max() or 1.0)
        for order in self._row_orders(n):
            if np.allclose(have[order], want, rtol=0, atol=tolerance):
                self.taken += 1
                order = order if rows is None else order[np.asarray(rows)]
                return Codes(
                    codes.bits, codes.codes[order], codes.d[order], None if codes.m is None else codes.m[order]
                )
        return None

    def _row_orders(self, n: int) -> list[np.ndarray]:
        """The GGUF rows in transformers' order: as they are, or un-permuted as llama.cpp's converter
        permutes q and k for its rope (pairs (2i, 2i + 1) within each head)."""
        orders = [np.arange(n)]
        for heads in sorted(self.heads):
            if n % (2 * heads) == 0:
                half = n // heads // 2  # transformers row h, j < half ← GGUF row h, 2j; j >= half ← 2(j - half) + 1
                per_head = np.concatenate([np.arange(half) * 2, np.arange(half) * 2 + 1])
                orders.append((np.arange(heads)[:, None] * 2 * half + per_head[None]).ravel())
        return orders
