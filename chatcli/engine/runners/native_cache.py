"""The native runner's KV cache: keys in transposed blocks of 16 positions, values as rows, in memory the
OS backs as it is written (`kv.memory.ReservedCache`), and the kernel's `Cache` struct over its arrays.

Keys `[Lf, KV, capacity/16, hd, 16]` (one vector holds a dimension of 16 keys) and values
`[Lf, KV, capacity, hd]`, fp32 or bf16 held as uint16; a model's sliding layers, where a strip is smaller
than the context, over `strip.size` positions of the same layout (`kv.memory.Strip`).
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

from chatcli.engine.kv import memory as kv_memory
from chatcli.engine.runners.kernels.structs import CACHE_BF16, CACHE_F32, Cache

CACHE_DTYPES = {"float32": (CACHE_F32, np.float32, "F32"), "bfloat16": (CACHE_BF16, np.uint16, "BF16")}

KEY_BLOCK = 16  # decode.cpp keeps keys in blocks of 16 positions, transposed


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


class NativeCache(kv_memory.ReservedCache):
    """Keys `[Lf, KV, capacity/16, hd, 16]` (blocks of 16 positions, transposed: one vector holds a
    dimension of 16 keys) and values `[Lf, KV, capacity, hd]`, fp32 or bf16 held as uint16, in anonymous
    memory; a model's sliding layers, where a strip is smaller than the context, in `wk`, `wv` of the
    same layout over `strip.size` positions (see `kv.memory.Strip`). `keys(n)` and `state()` give the
    keys as rows `[L, KV, n, hd]`, like every other cache."""

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, limit: int, dtype: str, window: int = 0, sliding=()
    ) -> None:
        self.kind, self._np, self._code = CACHE_DTYPES[dtype]
        itemsize = np.dtype(self._np).itemsize
        super().__init__(layers, kv_heads, head_dim, limit, itemsize, lazy=True, window=window, sliding=sliding)
        self.dtype = dtype
        self._view = None  # the kernel's Cache over these arrays, rebuilt when they move
        self.k, self.v, self._map = self._allocate(len(self.full), 0)
        if self.strip is not None:
            self.wk, self.wv, self._wmap = self._allocate(len(self.slid), self.strip.size)

    def _allocate(self, layers: int, cap: int):
        """Keys and values `[layers, KV, cap/16, hd, 16]`, `[layers, KV, cap, hd]` in anonymous memory."""
        cap = -(-cap // KEY_BLOCK) * KEY_BLOCK
        _, kv_heads, head_dim = self._shape
        count = layers * kv_heads * cap * head_dim
        memory = mmap.mmap(-1, 2 * count * np.dtype(self._np).itemsize) if count else None  # backed when written
        flat = np.frombuffer(memory, dtype=self._np) if count else np.empty(0, self._np)
        if self._no_huge_pages and count:
            kv_memory.advise_no_huge_pages(flat.ctypes.data, flat.nbytes)
        k = flat[:count].reshape(layers, kv_heads, cap // KEY_BLOCK, head_dim, KEY_BLOCK)
        return k, flat[count : 2 * count].reshape(layers, kv_heads, cap, head_dim), memory

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
        """The first n keys of the full-context layers as rows `[Lf, KV, n, hd]` (a copy)."""
        return _key_rows(self.k, n)

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
        return self._code, _key_rows(held, n) if keys else held[:, :, :n]

    def _rows_in(self, value: tuple[str, np.ndarray]) -> np.ndarray:
        code, rows = value
        if code != self._code:
            raise ValueError(f"a {code} cache, not {self._code}")
        return rows

    def _put_rows(self, held, rows, keys: bool) -> None:
        if keys:
            _put_key_rows(held, rows)
        else:
            held[:, :, : rows.shape[2]] = rows
