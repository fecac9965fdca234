"""The lean runner's KV cache: two preallocated tensors per conversation, an explicit position.

`[L, KV, capacity, hd]` keys and values, written in place at position `len(cache.ids)`;
cropping only moves the position. On the CPU the cache is reserved for the whole context
at once and the OS backs only the pages written (see `LeanCache`); GPUs grow it in blocks.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from chatcli.engine.runner import KVCache

CACHE_BLOCK = 512  # past RESERVE_BYTES, the KV cache grows in steps of this many positions
RESERVE_BYTES = 1 << 30  # address space a cache takes up front (only written pages use memory)


def huge_pages_always() -> bool:
    """True where the kernel backs every large anonymous mapping with 2 MiB pages."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
            return "[always]" in f.read()
    except OSError:
        return False


def advise_no_huge_pages(tensor: torch.Tensor) -> bool:
    """madvise(MADV_NOHUGEPAGE) over the whole pages of a CPU tensor's memory; False if it failed."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first, last = -(-start // page) * page, end // page * page
    if last <= first:
        return True  # nothing to advise: smaller than a page
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc.madvise(first, last - first, 15) == 0  # 15: MADV_NOHUGEPAGE on Linux
    except (OSError, AttributeError, TypeError):
        return False


@lru_cache(maxsize=1)
def madvise_works() -> bool:
    return advise_no_huge_pages(torch.empty(1 << 20, dtype=torch.uint8))


class LeanCache(KVCache):
    """Keys and values of every layer in two preallocated tensors; the position is `len(self.ids)`.

    On the CPU the tensors are allocated for the whole context limit up front (up to
    `RESERVE_BYTES` of address space). The operating system backs a page only when a
    forward first writes it, so a conversation's resident memory follows its length, and
    the cache never moves: first-touch page faults cost about 1 ms per MB on this kind of
    machine, and a grow-and-copy paid that for the whole cache again at every block.
    Longer limits, and GPUs (whose memory is committed at allocation), grow in
    `CACHE_BLOCK` steps instead. Where transparent huge pages are on for every mapping
    (`always`), the first write to each `[cap, hd]` strip would back 2 MiB: the reservation
    is marked MADV_NOHUGEPAGE, or, if that fails, the cache grows in blocks too.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, limit: int, dtype, device) -> None:
        super().__init__()
        self._shape = (layers, kv_heads, head_dim)
        self.limit = limit
        self.written = 0  # the most positions ever written: what the pages behind the cache hold
        per_position = 2 * layers * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()
        lazy = torch.device(device).type == "cpu"  # GPU memory is committed at allocation: grow there
        self._upfront = min(limit, max(CACHE_BLOCK, RESERVE_BYTES // per_position if lazy else 0))
        self._no_huge_pages = lazy and huge_pages_always()
        if self._no_huge_pages and not madvise_works():
            self._upfront = CACHE_BLOCK  # resident memory must follow nbytes: grow in blocks
        self.k = torch.empty(layers, kv_heads, 0, head_dim, dtype=dtype, device=device)  # [L, KV, cap, hd]
        self.v = torch.empty_like(self.k)  # [L, KV, cap, hd]

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def reserve(self, n: int) -> None:
        """Make room for `n` positions in all (copying what is held only past the up-front size)."""
        if n > self.capacity:
            grown = -(-n // CACHE_BLOCK) * CACHE_BLOCK if n > self._upfront else self._upfront
            self._resize(min(max(self.limit, n), grown))
        self.written = max(self.written, n)

    def _resize(self, cap: int) -> None:
        layers, kv_heads, head_dim = self._shape
        held = len(self.ids)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = torch.empty(layers, kv_heads, cap, head_dim, dtype=old.dtype, device=old.device)
            if self._no_huge_pages:
                advise_no_huge_pages(new)
            new[:, :, :held] = old[:, :, :held]
            setattr(self, name, new)

    def _crop(self, keep: int) -> None:
        pass  # positions past `keep` are simply overwritten by the next forward

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

    def state(self) -> dict[str, torch.Tensor]:
        n = len(self.ids)
        return {"k": self.k[:, :, :n].contiguous(), "v": self.v[:, :, :n].contiguous()}  # [L, KV, n, hd]

    def restore(self, ids: list[int], state: dict[str, torch.Tensor]) -> bool:
        k, v = state.get("k"), state.get("v")
        layers, kv_heads, head_dim = self._shape
        want = (layers, kv_heads, len(ids), head_dim)
        if k is None or v is None or tuple(k.shape) != want or tuple(v.shape) != want or len(ids) > self.limit:
            return False
        self.ids = []
        self.reserve(len(ids))
        self.k[:, :, : len(ids)] = k.to(self.k.dtype)
        self.v[:, :, : len(ids)] = v.to(self.v.dtype)
        self.ids = list(ids)
        return True

    @property
    def nbytes(self) -> int:
        """Bytes of the positions written so far (allocated but never written pages take no memory)."""
        layers, kv_heads, head_dim = self._shape
        return 2 * layers * kv_heads * min(self.written, self.capacity) * head_dim * self.k.element_size()
