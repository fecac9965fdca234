"""Prefix arithmetic on token ids, shared by the engine, the cache pool and the bench (no torch)."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share (compared a block at a time, in C)."""
    n = min(len(a), len(b))
    i, step = 0, 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def reusable_prefix(held: Sequence[int], target: Sequence[int]) -> int:
    """How many of `target`'s ids a cache holding `held` can keep: never all of them,
    since the last prompt id is always fed again for its logits."""
    return min(common_prefix(held, target), max(len(target) - 1, 0))
