"""Replies caught in a loop: the last ids repeating one short cycle.

Contract. `repeats(ids)` says whether the last LOOP_IDS of `ids` repeat one cycle of at most MAX_PERIOD ids
(a small model writing ` Paris, Paris, …` for ever). Two readers stop a reply on it, each where nothing else
would stop it sooner than the context's end, which without a `max_tokens` can be minutes or hours of decode
away: `steer.Steer.looping`, over a call's string, and `LoopWatch`, over the whole reply of a turn bounded
only by the context (serve's requests without `max_tokens`, Ollama's `num_predict: -1`). The second ends the
reply with finish reason `length`, as the context's end would have; the first takes the string's repeats back
and closes it (below), REWINDS times a reply, then ends it the same way.
Looked at every LOOP_EVERY ids: a look is MAX_PERIOD comparisons of LOOP_IDS ids. `excess(ids)` is what a loop
wrote past its first cycle: a call's string is taken back to there and closed (`steer.Steer.rewind`).
"""

from __future__ import annotations

import numpy as np

LOOP_IDS, MAX_PERIOD = 512, 64  # a cycle of <= MAX_PERIOD ids repeated over the last LOOP_IDS
LOOP_EVERY = 16  # ids between two looks
REWINDS = 4  # a reply's call strings taken back to their loop's start (`excess`); one more loop ends the reply


def period(ids) -> int:
    """The shortest cycle, of at most MAX_PERIOD ids, that the last LOOP_IDS of `ids` repeat (0: none; it takes at
    least LOOP_IDS + 1 ids)."""
    last = np.asarray(ids)
    for p in range(1, min(MAX_PERIOD, len(last) - LOOP_IDS) + 1):
        if np.array_equal(last[-LOOP_IDS:], last[-LOOP_IDS - p : -p]):
            return p
    return 0


def repeats(ids) -> bool:
    """The last LOOP_IDS of `ids` (at least LOOP_IDS + 1 of them) repeat one cycle of at most MAX_PERIOD ids."""
    return period(ids) > 0


def excess(ids) -> int:
    """How many of the last `ids` repeat what the loop in them already wrote (0 where they do not loop): `ids`
    less its start, the run before the repeats (the longest that ends where the shortest cycle begins to
    repeat) and that cycle once. ` Meet Bob at 3pm at 3pm at 3pm …`: all but ` Meet Bob at 3pm`."""
    p = period(ids)
    if not p:
        return 0
    last = np.asarray(ids)
    start = len(last) - LOOP_IDS - p  # last[start:] repeats with period p: how far back does it?
    while start > 0 and last[start - 1] == last[start - 1 + p]:
        start -= 1
    return len(last) - (start + p)


class LoopWatch:
    """A reply's last ids, and whether they loop (`push` says so every LOOP_EVERY ids)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.taken = 0

    def push(self, token: int) -> bool:
        self.taken += 1
        self.ids.append(token)
        del self.ids[: -(LOOP_IDS + MAX_PERIOD)]
        return self.taken % LOOP_EVERY == 0 and repeats(self.ids)
