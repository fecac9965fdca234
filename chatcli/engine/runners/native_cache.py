"""The native runner's KV cache: keys in transposed blocks of 16 positions, values as rows, in memory the
OS backs as it is written (`kv.memory.ReservedCache`), and the kernel's `Cache` struct over its arrays.

Keys `[Lf, KV, capacity/16, hd, 16]` (one vector holds a dimension of 16 keys) and values
`[Lf, KV, capacity, hd]`, fp32, bf16 held as uint16 or fp16 (IEEE half, llama.cpp's default cache); a
model's sliding layers, where a strip is smaller than the context, over `strip.size` positions of the same
layout (`kv.memory.Strip`).
A q8_0 cache (GGUF's Q8_0: int8 codes and an fp16 scale per 32 dimensions of a position, quantized by the
kernel as a position is written) holds records instead: keys `[Lf, KV, capacity/16]` of a block's codes
`[hd, 16]` and scales `[hd/32, 16]`, values `[Lf, KV, capacity]` of a row's codes `[hd]` and scales
`[hd/32]` (the kernel's `Q8` bytes, kernels/common.h): 17/16 bytes an element, 0.53x bf16's.
`keys(n)` gives them dequantized; `state()` their codes and scales as they are ("k" and "ks", ...), so a
saved cache comes back to the bit, and a state of another dtype is refused (`restore` is False).
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

from chatcli.engine.kv import memory as kv_memory
from chatcli.engine.runners.kernels.structs import CACHE_BF16, CACHE_F16, CACHE_F32, CACHE_Q8, Cache

# a --kv-dtype -> the kernel's kind, the numpy type of an element (None: q8 records) and its safetensors code
CACHE_DTYPES = {
    "float32": (CACHE_F32, np.float32, "F32"),
    "bfloat16": (CACHE_BF16, np.uint16, "BF16"),
    "float16": (CACHE_F16, np.float16, "F16"),
    "q8_0": (CACHE_Q8, None, "I8"),
}
Q8_GROUP = 32  # a q8_0 cache's dimensions per scale
Q8_ITEMSIZE = 17 / 16  # its bytes per element: a byte, and 2 bytes of scale per 32
SCALES = {"k": "ks", "v": "vs", "wk": "wks", "wv": "wvs"}  # a q8_0 state: the scales of each array of codes

KEY_BLOCK = 16  # decode.cpp keeps keys in blocks of 16 positions, transposed


def q8_records(head_dim: int) -> tuple[np.dtype, np.dtype]:
    """A q8_0 cache's key block (codes `[hd, 16]`, fp16 scales `[hd/32, 16]`) and value row (codes `[hd]`,
    scales `[hd/32]`), packed as the kernel reads them."""
    groups = head_dim // Q8_GROUP
    keys = np.dtype([("codes", np.int8, (head_dim, KEY_BLOCK)), ("scales", "<f2", (groups, KEY_BLOCK))])
    return keys, np.dtype([("codes", np.int8, (head_dim,)), ("scales", "<f2", (groups,))])


def q8_reason(head_dim: int) -> str | None:
    """Why a model's heads cannot have a q8_0 cache (None: they can)."""
    if head_dim % Q8_GROUP:
        return f"a q8_0 KV cache takes heads of a multiple of {Q8_GROUP} dimensions; this model's have {head_dim}"
    return None


def _key_rows(kt: np.ndarray, n: int) -> np.ndarray:
    """Transposed key blocks `[L, KV, blocks, hd, 16]` -> the first n keys as rows `[L, KV, n, hd]` (a copy)."""
    blocks = -(-n // KEY_BLOCK)
    rows = kt[:, :, :blocks].transpose(0, 1, 2, 4, 3)  # [L, KV, blocks, 16, hd]
    return rows.reshape(*rows.shape[:2], blocks * KEY_BLOCK, rows.shape[-1])[:, :, :n]


def _put_key_rows(kt: np.ndarray, rows: np.ndarray) -> None:
    """Key rows `[L, KV, n, hd]` into the first blocks of `kt` `[L, KV, blocks, hd, 16]`."""
    layers, kv_heads, n, head_dim = rows.shape
    blocks, full = n // KEY_BLOCK, n // KEY_BLOCK * KEY_BLOCK
    whole = rows[:, :, :full].reshape(layers, kv_heads, blocks, KEY_BLOCK, head_dim)
    kt[:, :, :blocks] = whole.transpose(0, 1, 2, 4, 3)
    if full < n:  # the last, partly filled block
        kt[:, :, blocks, :, : n - full] = rows[:, :, full:].transpose(0, 1, 3, 2)


def _rows(held: np.ndarray, n: int, keys: bool) -> np.ndarray:
    """The first n positions of key blocks or value rows as rows `[L, KV, n, ...]`."""
    return _key_rows(held, n) if keys else held[:, :, :n]


def _put(held: np.ndarray, rows: np.ndarray, keys: bool) -> None:
    if keys:
        _put_key_rows(held, rows)
    else:
        held[:, :, : rows.shape[2]] = rows


def dequantized(held: np.ndarray, n: int, keys: bool) -> np.ndarray:
    """q8_0 records (key blocks or value rows) -> their first n positions as fp32 rows `[L, KV, n, hd]`."""
    codes = _rows(held["codes"], n, keys).astype(np.float32)
    scales = _rows(held["scales"], n, keys).astype(np.float32)  # [L, KV, n, hd/32]
    return codes * np.repeat(scales, Q8_GROUP, axis=-1)


class NativeCache(kv_memory.ReservedCache):
    """Keys `[Lf, KV, capacity/16, hd, 16]` (blocks of 16 positions, transposed: one vector holds a
    dimension of 16 keys) and values `[Lf, KV, capacity, hd]`, fp32, bf16 held as uint16 or fp16 (q8_0: records
    of codes and scales, see the module's docstring), in anonymous memory; a model's sliding layers, where
    a strip is smaller than the context, in `wk`, `wv` of the same layout over `strip.size` positions (see
    `kv.memory.Strip`). `keys(n)` and `state()` give the keys as rows `[L, KV, n, hd]`, like every other
    cache (q8_0: `keys` dequantized, `state` codes and scales)."""

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, limit: int, dtype: str, window: int = 0, sliding=()
    ) -> None:
        self.kind, self._np, self._code = CACHE_DTYPES[dtype]
        self.q8 = self.kind == CACHE_Q8
        if self.q8 and q8_reason(head_dim):
            raise ValueError(q8_reason(head_dim))
        itemsize = Q8_ITEMSIZE if self.q8 else np.dtype(self._np).itemsize
        super().__init__(layers, kv_heads, head_dim, limit, itemsize, lazy=True, window=window, sliding=sliding)
        self.dtype = dtype
        self._view = None  # the kernel's Cache over these arrays, rebuilt when they move
        self.k, self.v, self._map = self._allocate(len(self.full), 0)
        if self.strip is not None:
            self.wk, self.wv, self._wmap = self._allocate(len(self.slid), self.strip.size)

    def _allocate(self, layers: int, cap: int):
        """Keys and values `[layers, KV, cap/16, hd, 16]`, `[layers, KV, cap, hd]` (q8_0: `[layers, KV, cap/16]`
        and `[layers, KV, cap]` records) in anonymous memory."""
        cap = -(-cap // KEY_BLOCK) * KEY_BLOCK
        _, kv_heads, head_dim = self._shape
        if self.q8:
            (key, value), key_shape, value_shape = q8_records(head_dim), (cap // KEY_BLOCK,), (cap,)
        else:
            key = value = np.dtype(self._np)
            key_shape, value_shape = (cap // KEY_BLOCK, head_dim, KEY_BLOCK), (cap, head_dim)
        key_shape, value_shape = (layers, kv_heads, *key_shape), (layers, kv_heads, *value_shape)
        key_bytes = int(np.prod(key_shape)) * key.itemsize
        size = key_bytes + int(np.prod(value_shape)) * value.itemsize
        memory = mmap.mmap(-1, size) if size else None  # backed when written
        flat = np.frombuffer(memory, dtype=np.uint8) if size else np.empty(0, np.uint8)
        if self._no_huge_pages and size:
            kv_memory.advise_no_huge_pages(flat.ctypes.data, flat.nbytes)
        k = flat[:key_bytes].view(key).reshape(key_shape)
        return k, flat[key_bytes:].view(value).reshape(value_shape), memory

    def _resize(self, cap: int) -> None:
        k, v, memory = self._allocate(len(self.full), cap)
        blocks, held = -(-len(self.ids) // KEY_BLOCK), len(self.ids)
        k[:, :, :blocks], v[:, :, :held] = self.k[:, :, :blocks], self.v[:, :, :held]
        self.k, self.v, self._map, self._view = k, v, memory, None

    def _slide(self, shift: int, count: int) -> None:
        first, blocks = shift // KEY_BLOCK, -(-count // KEY_BLOCK)
        self.wk[:, :, :blocks] = self.wk[:, :, first : first + blocks]  # numpy copies overlapping parts first
        self.wv[:, :, :count] = self.wv[:, :, shift : shift + count]
        self._view = None

    def kernel_cache(self) -> Cache:
        """The kernel's view: each layer's key and value arrays, capacity and first position."""
        if self._view is None or (self.strip is not None and self._view.base[self.slid[0]] != self.strip.base):
            layers = len(self.full) + len(self.slid)
            k, v = (ctypes.c_void_p * layers)(), (ctypes.c_void_p * layers)()
            capacity, base = (ctypes.c_int64 * layers)(), (ctypes.c_int64 * layers)()
            for i in range(layers):
                kl, vl, first = self.part(i)
                k[i], v[i], capacity[i], base[i] = kl.ctypes.data, vl.ctypes.data, vl.shape[1], first
            self._view = Cache(self.kind, k, v, capacity, base)
            self._view.arrays = (k, v, capacity, base)  # kept alive with the view
        return self._view

    def keys(self, n: int) -> np.ndarray:
        """The first n keys of the full-context layers as rows `[Lf, KV, n, hd]` (a copy; q8_0: dequantized)."""
        return dequantized(self.k, n, keys=True) if self.q8 else _key_rows(self.k, n)

    def _empty(self) -> NativeCache:
        layers = len(self.full) + len(self.slid)
        return NativeCache(
            layers, self._shape[1], self._shape[2], self.limit, self.dtype, self.window, self.sliding_layers
        )

    def _copy_to(self, other: NativeCache, n: int) -> None:
        blocks = -(-n // KEY_BLOCK)
        other.k[:, :, :blocks], other.v[:, :, :n] = self.k[:, :, :blocks], self.v[:, :, :n]
        if self.strip is not None:
            held = max(0, n - self.strip.base)
            blocks = -(-held // KEY_BLOCK)
            other.wk[:, :, :blocks], other.wv[:, :, :held] = self.wk[:, :, :blocks], self.wv[:, :, :held]

    def _rows_out(self, held, n: int, keys: bool) -> tuple[str, np.ndarray]:
        return self._code, _rows(held["codes"] if self.q8 else held, n, keys)

    def _rows_in(self, value: tuple[str, np.ndarray]) -> np.ndarray:
        code, rows = value
        if code != self._code:
            raise ValueError(f"a {code} cache, not {self._code}")
        return rows

    def _put_rows(self, held, rows, keys: bool) -> None:
        _put(held["codes"] if self.q8 else held, rows, keys)

    def _held(self) -> dict[str, tuple[np.ndarray, bool]]:
        """Each array by its name in `state()`, and whether it holds keys."""
        held = {"k": (self.k, True), "v": (self.v, False)}
        if self.strip is not None:
            held |= {"wk": (self.wk, True), "wv": (self.wv, False)}
        return held

    def state(self) -> dict:
        """As every cache's (`ReservedCache.state`); q8_0: the codes ("I8"), and beside each array its
        scales `[L, KV, n, hd/32]` ("F16": "ks", "vs", "wks", "wvs")."""
        out = super().state()
        if self.q8:
            for name, (held, keys) in self._held().items():
                out[SCALES[name]] = ("F16", _rows(held["scales"], out[name][1].shape[2], keys))
        return out

    def restore(self, ids: list[int], state: dict) -> bool:
        """As every cache's; q8_0: codes and scales, each scale array `[L, KV, n, hd/32]` of its codes' n."""
        if not self.q8:
            return super().restore(ids, state)
        try:
            scales = {name: state[SCALES[name]] for name in state if name in SCALES}
            if set(state) != set(scales) | {SCALES[name] for name in scales}:
                return False
            for name, (code, rows) in scales.items():
                codes = state[name][1]
                if code != "F16" or rows.dtype != np.float16 or rows.shape != (*codes.shape[:3], codes.shape[3] // 32):
                    return False
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            return False
        if not super().restore(ids, {name: state[name] for name in scales}):
            return False
        for name, (held, keys) in self._held().items():
            _put(held["scales"], scales[name][1], keys)
        return True
