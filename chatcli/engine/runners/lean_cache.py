"""The torch lean runner's KV cache: preallocated tensors per conversation, an explicit position.

`[Lf, KV, capacity, hd]` keys and values of the layers that attend to every position, and
`[Ls, KV, strip.size, hd]` of a model's sliding layers where a strip is smaller than the
context (`kv_memory.Strip`), written in place at position `len(cache.ids)`; cropping only moves
the position. How it takes memory (reserved up front on the CPU, grown in blocks on GPUs): see
`kv_memory`.
"""

from __future__ import annotations

import torch

from chatcli.engine.kv import memory as kv_memory
from chatcli.engine.runners.torch_state import from_state, to_state


class LeanCache(kv_memory.ReservedCache):
    """Keys and values in preallocated tensors; the position is `len(self.ids)`."""

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, limit: int, dtype, device, window: int = 0, sliding=()
    ) -> None:
        lazy = torch.device(device).type == "cpu"  # GPU memory is committed at allocation: grow there
        itemsize = torch.empty(0, dtype=dtype).element_size()
        super().__init__(layers, kv_heads, head_dim, limit, itemsize, lazy, window, sliding)
        self._layers = layers
        self.k = torch.empty(len(self.full), kv_heads, 0, head_dim, dtype=dtype, device=device)  # [Lf, KV, cap, hd]
        self.v = torch.empty_like(self.k)  # [Lf, KV, cap, hd]
        if self.strip is not None:
            self.wk = self._allocate(len(self.slid), self.strip.size)  # [Ls, KV, size, hd]
            self.wv = self._allocate(len(self.slid), self.strip.size)

    def _allocate(self, layers: int, cap: int) -> torch.Tensor:
        _, kv_heads, head_dim = self._shape
        new = torch.empty(layers, kv_heads, cap, head_dim, dtype=self.k.dtype, device=self.k.device)
        if self._no_huge_pages and new.numel():
            kv_memory.advise_no_huge_pages(new.data_ptr(), new.numel() * new.element_size())
        return new

    def _resize(self, cap: int) -> None:
        held = len(self.ids)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = self._allocate(old.shape[0], cap)
            new[:, :, :held] = old[:, :, :held]
            setattr(self, name, new)

    def _slide(self, shift: int, count: int) -> None:
        for strip in (self.wk, self.wv):
            strip[:, :, :count] = strip[:, :, shift : shift + count].clone()  # the parts overlap

    def _empty(self) -> LeanCache:
        _, kv_heads, head_dim = self._shape
        return LeanCache(
            self._layers, kv_heads, head_dim, self.limit, self.k.dtype, self.k.device, self.window, self.sliding_layers
        )

    def _copy_to(self, other: LeanCache, n: int) -> None:
        other.k[:, :, :n] = self.k[:, :, :n]
        other.v[:, :, :n] = self.v[:, :, :n]
        if self.strip is not None:
            held = max(0, n - self.strip.base)
            other.wk[:, :, :held] = self.wk[:, :, :held]
            other.wv[:, :, :held] = self.wv[:, :, :held]

    def _rows_out(self, held, n: int, keys: bool) -> tuple[str, object]:
        return to_state(held[:, :, :n])

    def _rows_in(self, value: tuple[str, object]) -> torch.Tensor:
        return from_state(value, self.k.device)

    def _put_rows(self, held, rows, keys: bool) -> None:
        held[:, :, : rows.shape[2]] = rows.to(held.dtype)
