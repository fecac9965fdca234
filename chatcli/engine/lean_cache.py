"""The torch lean runner's KV cache: two preallocated tensors per conversation, an explicit position.

`[L, KV, capacity, hd]` keys and values, written in place at position `len(cache.ids)`;
cropping only moves the position. How it takes memory (reserved up front on the CPU, grown in
blocks on GPUs): see `kv_memory`.
"""

from __future__ import annotations

import torch

from chatcli.engine import kv_memory
from chatcli.engine.torch_state import from_state, to_state


class LeanCache(kv_memory.ReservedCache):
    """Keys and values of every layer in two preallocated tensors; the position is `len(self.ids)`."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, limit: int, dtype, device) -> None:
        lazy = torch.device(device).type == "cpu"  # GPU memory is committed at allocation: grow there
        super().__init__(layers, kv_heads, head_dim, limit, torch.empty(0, dtype=dtype).element_size(), lazy)
        self.k = torch.empty(layers, kv_heads, 0, head_dim, dtype=dtype, device=device)  # [L, KV, cap, hd]
        self.v = torch.empty_like(self.k)  # [L, KV, cap, hd]

    def _resize(self, cap: int) -> None:
        layers, kv_heads, head_dim = self._shape
        held = len(self.ids)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = torch.empty(layers, kv_heads, cap, head_dim, dtype=old.dtype, device=old.device)
            if self._no_huge_pages:
                kv_memory.advise_no_huge_pages(new.data_ptr(), new.numel() * new.element_size())
            new[:, :, :held] = old[:, :, :held]
            setattr(self, name, new)

    def clone(self, keep: int) -> LeanCache:
        """A copy of the first `keep` positions (the pool's forks)."""
        keep = max(0, min(keep, len(self.ids)))
        layers, kv_heads, head_dim = self._shape
        other = LeanCache(layers, kv_heads, head_dim, self.limit, self.k.dtype, self.k.device)
        other.reserve(keep)
        other.k[:, :, :keep] = self.k[:, :, :keep]
        other.v[:, :, :keep] = self.v[:, :, :keep]
        other.ids = self.ids[:keep]
        return other

    def state(self) -> dict:
        n = len(self.ids)
        return {"k": to_state(self.k[:, :, :n]), "v": to_state(self.v[:, :, :n])}  # [L, KV, n, hd]

    def restore(self, ids: list[int], state: dict) -> bool:
        try:
            k, v = (from_state(state[name], self.k.device) for name in ("k", "v"))
        except (KeyError, ValueError):
            return False
        if not self._fits(ids, k.shape, v.shape):
            return False
        self.ids = []
        self.reserve(len(ids))
        self.k[:, :, : len(ids)] = k.to(self.k.dtype)
        self.v[:, :, : len(ids)] = v.to(self.v.dtype)
        self.ids = list(ids)
        return True
