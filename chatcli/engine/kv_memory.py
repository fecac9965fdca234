"""How the lean runners' KV caches take memory (torch-free; used by `lean_cache` and `native`).

A cache is `[L, KV, capacity, hd]` keys and values (the native runner holds its keys in
transposed blocks of 16 positions: `native.NativeCache`). On the CPU it is reserved for the whole
context at once (up to `RESERVE_BYTES` of address space): the operating system backs a page
only when a forward first writes it, so a conversation's resident memory follows its length,
and the cache never moves (first-touch page faults cost about 1 ms per MB on this kind of
machine, and a grow-and-copy paid that for the whole cache again at every block). Longer
limits, and GPUs (whose memory is committed at allocation), grow in `CACHE_BLOCK` steps.
Where transparent huge pages are on for every mapping (`always`), the first write to each
`[cap, hd]` strip would back 2 MiB: the reservation is marked MADV_NOHUGEPAGE, or, if that
fails, the cache grows in blocks too.
"""

from __future__ import annotations

import mmap
from functools import lru_cache

from chatcli.engine.runner import KVCache

CACHE_BLOCK = 512  # past the up-front size, a KV cache grows in steps of this many positions
RESERVE_BYTES = 1 << 30  # address space a cache takes up front (only written pages use memory)
MADV_NOHUGEPAGE = 15  # Linux


def huge_pages_always() -> bool:
    """True where the kernel backs every large anonymous mapping with 2 MiB pages."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
            return "[always]" in f.read()
    except OSError:
        return False


def advise_no_huge_pages(address: int, nbytes: int) -> bool:
    """madvise(MADV_NOHUGEPAGE) over the whole pages of [address, address + nbytes); False if it failed."""
    import ctypes

    page = mmap.PAGESIZE
    first, last = -(-address // page) * page, (address + nbytes) // page * page
    if last <= first:
        return True  # nothing to advise: smaller than a page
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc.madvise(first, last - first, MADV_NOHUGEPAGE) == 0
    except (OSError, AttributeError, TypeError):
        return False


@lru_cache(maxsize=1)
def madvise_works() -> bool:
    probe = mmap.mmap(-1, 1 << 20)
    try:
        import ctypes

        return advise_no_huge_pages(ctypes.addressof(ctypes.c_char.from_buffer(probe)), 1 << 20)
    finally:
        probe.close()


def upfront_positions(limit: int, per_position: int, lazy: bool) -> int:
    """Positions to reserve at once: the whole context where pages are backed lazily (the CPU) and it
    fits `RESERVE_BYTES`, else one block; a block too where huge pages cannot be turned off."""
    if lazy and huge_pages_always() and not madvise_works():
        return min(limit, CACHE_BLOCK)
    return min(limit, max(CACHE_BLOCK, RESERVE_BYTES // per_position if lazy else 0))


def grown(n: int, upfront: int, limit: int) -> int:
    """The capacity to resize to for `n` positions."""
    size = -(-n // CACHE_BLOCK) * CACHE_BLOCK if n > upfront else upfront
    return min(max(limit, n), size)


class ReservedCache(KVCache):
    """What both lean runners' caches share: `[L, KV, capacity, hd]` keys and values in `self.k`,
    `self.v`, reserved by the policy above; crops only move the position (`len(self.ids)`).
    A subclass allocates (`_resize`), copies (`clone`) and (de)serialises (`state`, `restore`)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, limit: int, itemsize: int, lazy: bool) -> None:
        super().__init__()
        self._shape = (layers, kv_heads, head_dim)
        self.limit = limit
        self.written = 0  # the most positions ever written: what the pages behind the cache hold
        self._itemsize = itemsize
        self._upfront = upfront_positions(limit, 2 * layers * kv_heads * head_dim * itemsize, lazy)
        self._no_huge_pages = lazy and huge_pages_always()

    @property
    def capacity(self) -> int:
        return self.v.shape[2]

    def reserve(self, n: int) -> None:
        """Make room for `n` positions in all (copying what is held only past the up-front size)."""
        if n > self.capacity:
            self._resize(grown(n, self._upfront, self.limit))
        self.written = max(self.written, n)

    def _resize(self, cap: int) -> None:
        raise NotImplementedError

    def _crop(self, keep: int) -> None:
        pass  # positions past `keep` are simply overwritten by the next forward

    def _fits(self, ids: list[int], k_shape, v_shape) -> bool:
        """`restore`'s check: keys and values `[L, KV, len(ids), hd]` within the context limit."""
        layers, kv_heads, head_dim = self._shape
        want = (layers, kv_heads, len(ids), head_dim)
        return tuple(k_shape) == want and tuple(v_shape) == want and len(ids) <= self.limit

    @property
    def nbytes(self) -> int:
        """Bytes of the positions written so far (allocated but never written pages take no memory)."""
        layers, kv_heads, head_dim = self._shape
        return 2 * layers * kv_heads * min(self.written, self.capacity) * head_dim * self._itemsize
