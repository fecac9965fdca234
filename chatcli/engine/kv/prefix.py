"""Prefix arithmetic on token ids, shared by the engine, the cache pool and the bench (no torch)."""

from __future__ import annotations

from collections.abc import Callable, Sequence


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


def realigned(
    held: Sequence[int],
    target: Sequence[int],
    piece: Callable[[int], bytes],
    decode: Callable[[Sequence[int]], str],
) -> list[int]:
    """`target` with the cache's own ids where both spell the same text: a reply the model sampled as
    `}` `}` comes back in the next turn's template as `}}`, and the cache would be dropped from there
    on. Past their common ids, the two are walked piece by piece (`piece`: an id's bytes) while their
    bytes agree; where they meet again at a token boundary of each, the common ids go on from there.
    The furthest meeting point (i in held, j in target) gives held[:i] + target[j:], checked by
    decoding both stretches from the last common id (`decode`, special tokens kept; the id before keeps
    a leading space where a decoder drops one at the start). `target` itself where nothing meets."""
    p = common_prefix(held, target)
    if p == 0 or p >= len(held) or p >= len(target):
        return list(target)
    i = j = p
    a = b = b""  # the bytes of held[..i] and target[..j] past the last meeting point
    meet = None
    while True:
        if len(a) <= len(b) and i < len(held):
            a += piece(held[i])
            i += 1
        elif j < len(target):
            b += piece(target[j])
            j += 1
        else:
            break
        n = min(len(a), len(b))
        if a[:n] != b[:n]:
            break
        if len(a) == len(b):  # both at a token boundary, the same bytes behind them
            k = common_prefix(held[i:], target[j:])
            i, j, a, b = i + k, j + k, b"", b""
            meet = (i, j)
            if i >= len(held) or j >= len(target):
                break
    if meet is None:
        return list(target)
    i, j = meet
    if decode(held[p - 1 : i]) != decode(target[p - 1 : j]):
        return list(target)
    return [*held[:i], *target[j:]]
