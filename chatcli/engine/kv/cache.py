"""A conversation's keys and values, behind one small interface.

A `KVCache` holds the keys and values of the ids fed so far and remembers exactly which ids those
are (`cache.ids`), so the engine can compare them with the next turn's prompt and keep the common
prefix. Each runner has its own (`runners.native.NativeCache`, `runners.lean_cache.LeanCache`,
`runners.hf.HFCache`); the lean runners' share their memory policy (`kv.memory.ReservedCache`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class KVCache(ABC):
    """Keys/values of the ids fed so far; `len(cache) == len(cache.ids)`."""

    def __init__(self) -> None:
        self.ids: list[int] = []

    def __len__(self) -> int:
        return len(self.ids)

    def reachable(self, keep: int) -> int:
        """What `crop(keep)` keeps: `keep` (at most what is held), or 0 where the cache cannot go back
        that far (sliding-window layers that have dropped the keys position `keep` would read)."""
        return max(0, min(keep, len(self.ids)))

    def crop(self, keep: int) -> None:
        """Forget everything after the first `keep` ids (everything where it cannot keep those: `reachable`)."""
        keep = self.reachable(keep)
        if keep < len(self.ids):
            self._crop(keep)
            del self.ids[keep:]

    @abstractmethod
    def _crop(self, keep: int) -> None: ...

    @property
    @abstractmethod
    def nbytes(self) -> int: ...

    def state(self) -> dict[str, tuple[str, object]]:
        """The held keys/values as named (safetensors dtype code, numpy array) pairs, BF16 as uint16
        (for saving to disk; see persist); empty where unsupported."""
        return {}

    def restore(self, ids: list[int], state: dict[str, tuple[str, object]]) -> bool:
        """Load what `state()` gave, for exactly `ids`; False (and left empty) where unsupported."""
        return False
