"""How often the streaming reply is drawn (ui/live.py `DrawPace`): at every tick while drawing is cheap,
less often while the UI thread's share of a core is over its budget, and back when it is cheap again; and
the garbage collector while it streams (`QuietHeap`)."""

from __future__ import annotations

import gc

from chatcli.ui.live import DrawPace, QuietHeap


class Machine:
    """A clock and the UI thread's CPU time: each draw costs `draw_s` of CPU."""

    def __init__(self) -> None:
        self.now = self.used = 0.0

    def clock(self) -> float:
        return self.now

    def cpu(self) -> float:
        return self.used


def ticks(pace: DrawPace, machine: Machine, seconds: float, draw_s: float, tick_s: float = 0.1) -> list[float]:
    """Ticks for `seconds`: the clock times of the draws."""
    drawn = []
    end = machine.now + seconds
    while machine.now < end:
        machine.now += tick_s
        if pace.due():
            drawn.append(machine.now)
            machine.used += draw_s
    return drawn


def test_cheap_draws_come_at_every_tick():
    machine = Machine()
    pace = DrawPace(0.1, machine.clock, machine.cpu)
    drawn = ticks(pace, machine, 5.0, draw_s=0.002)  # 2 % of a core
    assert len(drawn) >= 49 and pace.interval == 0.1


def test_costly_draws_come_less_often_and_back_when_cheap():
    machine = Machine()
    pace = DrawPace(0.1, machine.clock, machine.cpu)
    costly = ticks(pace, machine, 10.0, draw_s=0.03)  # 30 % of a core at every tick
    assert 0.2 < pace.interval <= DrawPace.SLOWEST_S and len(costly) <= 45
    late = [t for t in costly if t > 5.0]
    assert len(late) * 0.03 / 5.0 <= DrawPace.SHARE  # settled: the UI thread's share within the budget
    cheap = ticks(pace, machine, 5.0, draw_s=0.002)
    assert pace.interval == 0.1 and cheap[-1] - cheap[-2] < 0.11


def test_a_streaming_reply_collects_its_young_objects_less_often_and_gives_the_thresholds_back():
    before = gc.get_threshold()
    heap = QuietHeap()
    try:
        heap.streaming()
        assert gc.get_threshold() == QuietHeap.STREAMING_THRESHOLDS and gc.get_freeze_count() > 0
        heap.streaming()  # a turn that goes on (its tool calls, then the model again)
        heap.settled()
        assert gc.get_threshold() == before and gc.get_freeze_count() == 0
        heap.settled()  # twice: nothing more to give back
        assert gc.get_threshold() == before
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
