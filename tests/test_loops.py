"""A reply in a loop (`sample.loops`, issue 48): the last ids repeating one cycle of at most MAX_PERIOD ids over
LOOP_IDS, told apart from a reply of the model's own, whatever the cycle's length up to MAX_PERIOD."""

from __future__ import annotations

import numpy as np

from chatcli.engine.sample.loops import LOOP_EVERY, LOOP_IDS, MAX_PERIOD, LoopWatch, repeats


def looped_after(watch: LoopWatch, ids) -> int | None:
    """How many of `ids` were pushed when the watch first said so (None: never)."""
    for n, token in enumerate(ids, 1):
        if watch.push(int(token)):
            return n
    return None


def test_a_reply_of_the_models_own_never_loops():
    assert looped_after(LoopWatch(), np.random.default_rng(0).integers(0, 50_000, size=8 * LOOP_IDS)) is None


def test_a_repeated_cycle_loops_once_it_covers_loop_ids():
    for period in (1, 5, MAX_PERIOD):
        watch = LoopWatch()
        own = np.random.default_rng(1).integers(0, 50_000, size=300)
        assert looped_after(watch, own) is None
        cycle = np.random.default_rng(period).integers(0, 50_000, size=period)
        n = looped_after(watch, np.tile(cycle, 4 * LOOP_IDS // period + 2))
        assert n is not None and LOOP_IDS + period <= n <= LOOP_IDS + period + LOOP_EVERY, (period, n)


def test_a_cycle_longer_than_max_period_is_no_loop():
    cycle = np.random.default_rng(2).integers(0, 50_000, size=MAX_PERIOD + 3)
    assert not repeats(np.tile(cycle, 4 * LOOP_IDS // len(cycle)))
    assert repeats(np.tile(cycle[:MAX_PERIOD], 4 * LOOP_IDS // MAX_PERIOD))
