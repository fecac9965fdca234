"""How the lean runners' KV caches take memory (torch-free; used by `lean_cache` and `native`).

A cache is `[L, KV, capacity, hd]` keys and values (the native runner holds its keys in
transposed blocks of 16 positions: `native.NativeCache`). On the CPU it is reserved for the whole
context at once (up to `RESERVE_BYTES` of address space): the operating system backs a page
only when a forward first writes it, so a conversation's resident memory follows its length,
and the cache never moves (first-touch page faults cost about 1 ms per MB on this kind of
machine, and a grow-and-copy paid that for the whole cache again at every block). Longer
limits, and GPUs (whose memory is committed at allocation), start at one `CACHE_BLOCK` of
positions and double (`grown`): a conversation's copies then add up to less than its cache,
where growing a block at a time copied the whole cache at every block. The context itself
(the model's declared one, at most `families.MAX_CONTEXT`, or `--ctx-size`) only bounds it.
Where transparent huge pages are on for every mapping (`always`), the first write to each
`[cap, hd]` strip would back 2 MiB: the reservation is marked MADV_NOHUGEPAGE, or, if that
fails, the cache grows in blocks too.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from functools import lru_cache

from chatcli.engine.kv.cache import KVCache

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


def grown(n: int, capacity: int, upfront: int, limit: int) -> int:
    """The capacity to resize to for `n` positions from `capacity`: the up-front size, else twice the
    capacity (whole blocks, at least n), at most the limit."""
    size = max(-(-n // CACHE_BLOCK) * CACHE_BLOCK, 2 * capacity) if n > upfront else upfront
    return min(max(limit, n), size)


class Strip:
    """Where a cache keeps its sliding-window layers (Mistral, Gemma 2/3's local layers, Qwen2's where
    `use_sliding_window`): a strip of `size` positions per layer instead of the whole context, holding
    positions `base..` (a multiple of 16). A position attends to itself and the `window - 1` before
    it, so older keys are never read again; when a forward would write past the strip's end, the
    strip slides: it drops everything before the window of the forward's first row, less `keep_back`
    positions kept for crops. A crop back to `keep` keeps the cache where the window of position
    `keep` is still held (`reaches`); a longer one starts the cache over (llama.cpp re-processes the
    prompt in that case too). `room`: the most positions one forward may write (longer ones are split)."""

    def __init__(self, window: int, keep_back: int | None = None, room: int | None = None) -> None:
        self.window = window
        self.keep_back = KEEP_BACK if keep_back is None else keep_back
        self.room = room or STRIP_ROOM
        self.size = -(-(window + self.keep_back + self.room + 15) // 16) * 16  # + 15: the base is a block's start
        self.base = 0  # the first position held
        self.written = 0  # the most slots ever written: what the pages behind the strip hold

    def first_read(self, pos: int) -> int:
        """The first position a row at `pos` reads, rounded down to its key block."""
        return max(0, pos + 1 - self.window) // 16 * 16

    def slide(self, start: int, end: int) -> int:
        """Before positions start..end are written: how many positions to drop from the front (0: none)."""
        if end - start > self.room:
            raise ValueError(f"{end - start} positions in one forward exceed the strip's room of {self.room}")
        shift = 0
        if end - self.base > self.size:
            base = max(0, start + 1 - self.window - self.keep_back) // 16 * 16
            shift, self.base = base - self.base, base
        self.written = max(self.written, end - self.base)
        return shift

    def reaches(self, keep: int, held: int) -> bool:
        """Whether a cache holding `held` positions can be cropped to `keep` and go on from there."""
        return keep >= held or self.first_read(keep) >= self.base


KEEP_BACK = 512  # positions a strip keeps behind the window: crops back this far (an undo, a retry) keep the cache
STRIP_ROOM = 512  # the most positions one forward writes into a strip (the engine's prefill chunk)


def strip_for(window: int, sliding: Sequence[bool], limit: int) -> Strip | None:
    """The strip for a model's sliding layers, or None where it would not be smaller than the context."""
    if not window or not any(sliding):
        return None
    strip = Strip(window)
    return strip if strip.size < limit else None


class ReservedCache(KVCache):
    """What both lean runners' caches share: keys and values `[Lf, KV, capacity, hd]` of the layers that
    attend to every position in `self.k`, `self.v`, reserved by the policy above, and those of the
    sliding layers (where a `Strip` is smaller than the context) `[Ls, KV, strip.size, hd]` in
    `self.wk`, `self.wv`; crops only move the position (`len(self.ids)`). A subclass allocates
    (`_resize`, `_allocate_strip`), moves the strip (`_slide`), copies (`_copy_to`) and turns its
    arrays into rows and back for `state` and `restore` (`_rows_out`, `_rows_in`, `_put_rows`).
    `itemsize`: bytes an element takes (a q8_0 cache's 17/16: a code, and a 2-byte scale per 32)."""

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        limit: int,
        itemsize: float,
        lazy: bool,
        window: int = 0,
        sliding: Sequence[bool] = (),
    ) -> None:
        super().__init__()
        self.window, self.sliding_layers = window, tuple(sliding)
        self.strip = strip_for(window, sliding, limit)
        on_strip = self.strip is not None
        self.full = tuple(i for i in range(layers) if not (on_strip and sliding[i]))  # layers in self.k
        self.slid = tuple(i for i in range(layers) if on_strip and sliding[i])  # layers in self.wk
        self._shape = (len(self.full), kv_heads, head_dim)
        self.limit = limit
        self.written = 0  # the most positions ever written: what the pages behind the cache hold
        self._itemsize = itemsize
        per_position = int(2 * max(1, len(self.full)) * kv_heads * head_dim * itemsize)
        self._upfront = upfront_positions(limit, per_position, lazy)
        self._no_huge_pages = lazy and huge_pages_always()

    @property
    def capacity(self) -> int:
        return self.v.shape[2]

    def part(self, layer: int) -> tuple[object, object, int]:
        """Layer `layer`'s keys and values (`[KV, ...]` of `self.k` / `self.wk`) and the first position they hold."""
        if layer in self.slid:
            j = self.slid.index(layer)
            return self.wk[j], self.wv[j], self.strip.base
        j = self.full.index(layer)
        return self.k[j], self.v[j], 0

    def reserve(self, n: int, base: int | None = None) -> None:
        """Make room for positions len(self.ids)..n in all (copying what is held only past the up-front
        size; sliding the strip where it is full). `base`: an empty cache's strip is to hold positions
        base..n (a fork's or a saved state's, copied in next)."""
        if n > self.capacity:
            self._resize(grown(n, self.capacity, self._upfront, self.limit))
        self.written = max(self.written, n)
        if self.strip is None:
            return
        if base is not None:
            assert not self.ids and n - base <= self.strip.size
            self.strip.base = base
            self.strip.written = max(self.strip.written, n - base)
            return
        held = len(self.ids)
        shift = self.strip.slide(held, n)
        if shift:
            self._slide(shift, held - self.strip.base)

    def _resize(self, cap: int) -> None:
        raise NotImplementedError

    def _slide(self, shift: int, count: int) -> None:
        """Move the strip's slots shift..shift+count to 0..count (the strip's base has moved on by `shift`)."""
        raise NotImplementedError

    def reachable(self, keep: int) -> int:
        keep = super().reachable(keep)
        if self.strip is not None and not self.strip.reaches(keep, len(self.ids)):
            return 0
        return keep

    def _crop(self, keep: int) -> None:
        if keep == 0 and self.strip is not None:
            self.strip.base = 0
        # positions past `keep` are simply overwritten by the next forward

    def clone(self, keep: int) -> ReservedCache:
        """A copy of the first `keep` positions (the pool's forks; an empty one where the strip no longer
        holds the window of position `keep`)."""
        keep = self.reachable(keep)
        other = self._empty()
        other.reserve(keep, self.strip.base if self.strip is not None and keep else None)
        self._copy_to(other, keep)
        other.ids = self.ids[:keep]
        return other

    def _empty(self) -> ReservedCache:
        raise NotImplementedError

    def _copy_to(self, other: ReservedCache, n: int) -> None:
        raise NotImplementedError

    def state(self) -> dict:
        """Keys and values `[Lf, KV, n, hd]` as rows ("k", "v") and, with a strip, the sliding layers'
        positions base..n `[Ls, KV, n - base, hd]` ("wk", "wv"): (safetensors dtype code, array) each."""
        n = len(self.ids)
        out = {"k": self._rows_out(self.k, n, keys=True), "v": self._rows_out(self.v, n, keys=False)}
        if self.strip is not None:
            held = n - self.strip.base
            out["wk"], out["wv"] = self._rows_out(self.wk, held, keys=True), self._rows_out(self.wv, held, keys=False)
        return out

    def restore(self, ids: list[int], state: dict) -> bool:
        try:
            arrays = {name: self._rows_in(value) for name, value in state.items()}
            base = self._fits(ids, {name: tuple(a.shape) for name, a in arrays.items()})
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            return False
        if base is None:
            return False
        self.ids = []
        self.reserve(len(ids), base if self.strip is not None else None)
        self._put_rows(self.k, arrays["k"], keys=True)
        self._put_rows(self.v, arrays["v"], keys=False)
        if self.strip is not None:
            self._put_rows(self.wk, arrays["wk"], keys=True)
            self._put_rows(self.wv, arrays["wv"], keys=False)
        self.ids = list(ids)
        return True

    def _rows_out(self, held, n: int, keys: bool) -> tuple[str, object]:
        """The first n positions of `held` (self.k, self.v, self.wk or self.wv) as (code, rows `[L, KV, n, hd]`)."""
        raise NotImplementedError

    def _rows_in(self, value: tuple[str, object]):
        """A saved (code, rows) pair as this cache's array type; ValueError where it is not one of its own."""
        raise NotImplementedError

    def _put_rows(self, held, rows, keys: bool) -> None:
        """Rows `[L, KV, n, hd]` into the first n positions of `held`."""
        raise NotImplementedError

    def _fits(self, ids: list[int], shapes: dict) -> int | None:
        """`restore`'s check of the shapes of `state()`'s arrays: keys and values `[Lf, KV, len(ids), hd]`
        and, with a strip, `[Ls, KV, len(ids) - base, hd]`; the strip's base, or None where they do not fit."""
        n = len(ids)
        if n > self.limit:
            return None
        full, kv_heads, head_dim = self._shape
        if shapes.get("k") != (full, kv_heads, n, head_dim) or shapes.get("v") != shapes["k"]:
            return None
        if self.strip is None:
            return 0 if "wk" not in shapes else None
        wk = shapes.get("wk")
        if wk is None or shapes.get("wv") != wk or wk[:2] != (len(self.slid), kv_heads) or wk[3] != head_dim:
            return None
        base = n - wk[2]
        if base < 0 or base % 16 or base > self.strip.first_read(n) or wk[2] > self.strip.size:
            return None
        return base

    @property
    def nbytes(self) -> int:
        """Bytes of the positions written so far (allocated but never written pages take no memory)."""
        layers, kv_heads, head_dim = self._shape
        per_position = 2 * kv_heads * head_dim * self._itemsize
        held = layers * min(self.written, self.capacity) * per_position
        if self.strip is not None:
            held += len(self.slid) * min(self.strip.written, self.strip.size) * per_position
        return int(held)


def default_budget_bytes() -> int:
    """An eighth of the machine's memory, between 256 MiB and 4 GiB (1 GiB where it cannot be read)."""
    import os

    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 1 << 30
    return max(256 << 20, min(4 << 30, total // 8))
