"""A call's string in a loop (`Steer.looping`, issue 48): a small model that repeats one short cycle of ids
inside a call's JSON string is told apart from one that writes a long string of its own, the cycle found
whatever its length up to MAX_PERIOD, and only inside a string; then taken back to the end of the cycle's
first time (`rewind`), where the string closes."""

from __future__ import annotations

import numpy as np

from chatcli.engine.sample.steer import LOOP_IDS, MAX_PERIOD, Steer
from chatcli.engine.sample.tools import CallText

OPEN, QUOTE, LETTERS = 0, 1, 2  # ids: the call's opening up to its string, the closing quote, then letters


class Spelling:
    """A vocabulary by bytes, as `steer.Vocab` gives it: the opening, `"`, then 40 one-letter ids."""

    bytes = [b'{"text": "', b'"'] + [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"]
    quotes = np.array([b[:1] == b'"' for b in bytes])


def steer_in_string() -> Steer:
    steer = Steer(Spelling(), CallText(b"", b"", b""), limit=100_000)
    steer.advance(OPEN)
    return steer


def looped_after(steer: Steer, ids) -> int | None:
    """How many of `ids` were taken when `looping` first said so (None: never)."""
    for n, token in enumerate(ids, 1):
        steer.advance(int(token))
        if steer.looping:
            return n
    return None


def test_a_string_of_the_models_own_is_never_a_loop():
    ids = np.random.default_rng(0).integers(LETTERS, LETTERS + 40, size=4 * LOOP_IDS)
    assert looped_after(steer_in_string(), ids) is None


def test_a_repeated_cycle_is_a_loop_once_it_covers_loop_ids():
    for period in (1, 7, MAX_PERIOD):
        cycle = np.random.default_rng(period).integers(LETTERS, LETTERS + 40, size=period)
        steer = steer_in_string()
        looped_after(steer, np.random.default_rng(1).integers(LETTERS, LETTERS + 40, size=300))  # its own text first
        n = looped_after(steer, np.tile(cycle, 4 * LOOP_IDS // period + 2))
        assert n is not None and LOOP_IDS + period <= n <= LOOP_IDS + period + 16, (period, n)


def test_a_cycle_longer_than_max_period_is_not_a_loop():
    cycle = np.random.default_rng(2).integers(LETTERS, LETTERS + 40, size=MAX_PERIOD + 5)
    assert looped_after(steer_in_string(), np.tile(cycle, 3 * LOOP_IDS // len(cycle))) is None


def test_outside_a_string_nothing_is_counted():
    steer = Steer(Spelling(), CallText(b"", b"", b""), limit=100_000)
    assert looped_after(steer, [OPEN, QUOTE, *[QUOTE, QUOTE] * LOOP_IDS]) is None  # empty strings, opened and closed


def test_a_loop_is_taken_back_to_its_first_cycle_and_the_string_closes_there():
    from chatcli.engine.sample.loops import excess

    rng = np.random.default_rng(3)
    for period in (1, 3, 7, MAX_PERIOD):
        own = [int(t) for t in rng.integers(LETTERS, LETTERS + 20, size=50)]  # letters of its own: it does not
        cycle = [int(t) for t in rng.integers(LETTERS + 20, LETTERS + 40, size=period)]  # end as the cycle does
        steer = steer_in_string()
        looped_after(steer, own)
        assert looped_after(steer, cycle * (4 * LOOP_IDS // period + 2)) is not None
        drop = steer.excess()
        assert steer.ids[: len(steer.ids) - drop] == [OPEN, *own, *cycle]  # its own text, then the cycle once
        assert excess(steer.ids[: len(steer.ids) - drop]) == 0
        steer.rewind(drop)
        assert steer.ids == [OPEN, *own, *cycle] and steer.in_call_string and not steer.looping
        everything = np.ones(len(Spelling.bytes), dtype=bool)
        assert np.flatnonzero(steer.narrow(everything, None)).tolist() == [QUOTE]  # the string closes next
        steer.advance(QUOTE)
        assert not steer.in_call_string and not steer.closing
