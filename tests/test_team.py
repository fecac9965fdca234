"""The kernel team's width per call (runners/team.py): learned from the decode steps' times, so a busy
core elsewhere costs one thread, not the whole team's speed; and never a different reply."""

from __future__ import annotations

import numpy as np
import pytest

from chatcli.engine.runners.team import FIRST_TRY, FIRST_WAIT_S, LAST_WAIT_S, TeamWidth, widths

IDLE = {2: 0.005, 1: 0.0085}  # seconds a step: two cores free, the whole team is fastest
BUSY = {2: 0.060, 1: 0.0085}  # a core busy elsewhere: the team waits at its barriers


def QUIET() -> int:  # a look at the machine finds nobody else running
    return 0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(team: TeamWidth, clock: Clock, cost: dict, seconds: float, rows: int = 1) -> list[tuple[float, int]]:
    """Decode steps for `seconds` of the clock, each taking `cost[width]` a row: (start, width) of each."""
    ran = []
    end = clock.now + seconds
    while clock.now < end:
        width = team.width(rows)
        ran.append((clock.now, width))
        clock.now += cost[width] * rows
        team.record(rows, width, cost[width] * rows)
    return ran


def tries(ran, width):
    return [t for t, w in ran if w == width]


def test_the_widths_tried():
    assert widths(1) == [1] and widths(2) == [2, 1] and widths(4) == [4, 3, 2, 1] and widths(16) == [16, 15, 8, 1]


def test_an_idle_machine_keeps_the_whole_team_and_tries_less_and_less():
    clock = Clock()
    team = TeamWidth(2, clock, QUIET, tolerant=False)
    ran = drive(team, clock, IDLE, 60.0)
    assert team.current == 2 and ran[0][1] == 2 and ran[FIRST_TRY - 1][1] == 1  # the second step tries one thread
    at = tries(ran, 1)
    gaps = np.diff(at)
    assert 8 <= len(at) <= 12  # 1 s, 2, 4, 8, 8 … apart: a dozen slower steps in a minute of decoding
    assert gaps[0] == pytest.approx(2 * FIRST_WAIT_S, abs=0.02) and max(gaps) == pytest.approx(LAST_WAIT_S, abs=0.02)
    assert len(at) / len(ran) < 0.002


def test_a_busy_core_moves_decode_to_one_thread_at_once_and_back_when_it_is_free():
    clock = Clock()
    team = TeamWidth(2, clock, QUIET, tolerant=False)
    drive(team, clock, IDLE, 30.0)
    busy = drive(team, clock, BUSY, 30.0)
    assert busy[2][1] == 1 and team.current == 1  # slowed past 1.5x: one thread from the next steps on
    slow = tries(busy, 2)
    assert len(slow) <= 8  # the whole team tried again 1, 2, 4, 8, 8 … s apart
    spent = sum(BUSY[w] for _, w in busy)
    assert sum(BUSY[2] for _ in slow) / spent < 0.02  # the tries cost under 2 % of the time
    free = drive(team, clock, IDLE, 20.0)
    back = next(t for t, w in free if w == 2) - free[0][0]
    assert back <= LAST_WAIT_S + 0.1 and team.current == 2  # the core is free again: the whole team


def test_a_process_started_on_a_busy_machine_learns_at_its_second_step():
    clock = Clock()
    team = TeamWidth(2, clock, QUIET, tolerant=False)
    ran = drive(team, clock, BUSY, 10.0)
    assert [w for _, w in ran[:3]] == [2, 1, 1] and len(tries(ran, 2)) <= 4


def test_a_prefill_runs_at_the_width_a_look_gives_and_teaches_nothing():
    clock = Clock()
    team = TeamWidth(2, clock, QUIET, tolerant=False)
    assert team.width(512) == 2  # a quiet machine: the whole team
    drive(team, clock, BUSY, 5.0)
    team.others = lambda: 1  # the look sees what slowed the steps
    assert team.width(512) == 1
    team.record(512, 1, 100.0)  # a slow prefill
    assert team.current == 1 and team.per_row[1] == pytest.approx(BUSY[1])


# -2: the whole team without barriers, the caller's thread asleep (2 and 1: with barriers)
TOLERANT_IDLE = {2: 0.0032, -2: 0.0034, 1: 0.0062}
TOLERANT_BUSY = {2: 0.0600, -2: 0.0045, 1: 0.0065}  # a core busy: the barriers wait, the team without does not


def test_a_busy_machine_moves_decode_to_the_team_without_barriers_and_back():
    """On an idle machine the whole team with barriers; a look that sees another process running starts
    the steps without barriers (the prefill one thread narrower); when it has gone, barriers again."""
    clock = Clock()
    team = TeamWidth(2, clock, QUIET)
    assert team.widths == [2, 1, -2]
    idle = drive(team, clock, TOLERANT_IDLE, 20.0)
    assert team.current == 2 and len(tries(idle, -2)) + len(tries(idle, 1)) <= 10
    team.others = lambda: 1
    assert team.width(512) == 1 and team.current == -2  # the prefill narrower, the steps without barriers
    busy = drive(team, clock, TOLERANT_BUSY, 20.0)
    assert busy[0][1] == -2 and team.current == -2 and len(tries(busy, 2)) <= 5  # barriers tried now and then
    team.others = QUIET
    clock.now += 1.0
    assert team.width(512) == 2 and team.current == 2  # the next turn's look: barriers again


def test_a_process_that_comes_mid_reply_moves_the_steps_off_barriers():
    clock = Clock()
    team = TeamWidth(2, clock, QUIET)
    drive(team, clock, TOLERANT_IDLE, 10.0)
    slowed = drive(team, clock, TOLERANT_BUSY, 2.0)  # the step that slows tries the others at once
    assert team.current == -2 and len(tries(slowed, 2)) <= 4
    drive(team, clock, TOLERANT_IDLE, 30.0)
    assert team.current == 2  # the core is free again: a try with barriers is faster, and takes over


def test_steps_without_barriers_that_vary_keep_the_team():
    """Beside a busy process a step without barriers now and then takes longer (a worker held back); that
    is no reason to try the others at once, and a try is held to the team's best."""
    clock = Clock()
    team = TeamWidth(2, clock, lambda: 1)
    team.width(512)  # the look: steps without barriers
    ran = []
    for i in range(4000):
        width = team.width(1)
        ran.append(width)
        seconds = 0.020 if width == -2 and i % 50 == 49 else TOLERANT_BUSY[width]
        clock.now += seconds
        team.record(1, width, seconds)
    assert team.current == -2 and ran.count(1) <= 5 and ran.count(2) <= 5


def test_a_look_at_a_busy_machine_starts_the_turn_at_one_thread():
    """Where decode steps have barriers (CHATCLI_TOLERANT=off), the look sizes them too."""
    clock = Clock()
    team = TeamWidth(2, clock, lambda: 1, tolerant=False)  # another process runs on one of the two cores
    assert team.width(512) == 1  # the prefill, before any decode step
    ran = drive(team, clock, BUSY, 3.0)
    assert {w for _, w in ran} == {1} and team.current == 1  # the look is evidence: no slow try of the team
    later = drive(team, clock, BUSY, 3.0)
    assert 1 <= len(tries(later, 2)) <= 2 and team.current == 1  # tried after LOOKED_WAIT_S, and kept at one
    clock.now += 10.0
    team.others = QUIET  # the other process ended: the next turn's prefill looks again
    assert team.width(512) == 2 and team.current == 2
    clock.now += 0.1
    assert team.width(512) == 2  # within LOOK_EVERY_S the look is not repeated


def test_a_look_at_a_quiet_machine_spares_the_reply_a_slow_try():
    clock = Clock()
    team = TeamWidth(2, clock, QUIET, tolerant=False)
    assert team.width(512) == 2
    ran = drive(team, clock, IDLE, 3.0)  # a reply of a few seconds: no step at one thread
    assert {w for _, w in ran} == {2}
    slowed = drive(team, clock, BUSY, 1.0)  # a process comes mid-reply: the step that slows tries at once
    assert slowed[2][1] == 1 and team.current == 1


def test_a_short_prompt_that_begins_a_turn_is_a_prefill():
    """A turn after `-c` prefills a few new tokens, a call of as few rows as a step with its draft: the
    process's first call of several rows, or one after a pause, looks at the machine and runs at the
    look's width like a longer prefill (not on the whole team with barriers beside a busy process: 3.5 s
    for 15 tokens), and teaches nothing. A draft's verify right after a step is still a step."""
    from chatcli.engine.runners.team import DECODE_ROWS, PAUSE_S

    clock, looks = Clock(), []

    def busy() -> int:
        looks.append(clock.now)
        return 1

    team = TeamWidth(2, clock, busy)
    ran = []

    def call(rows: int, seconds: float):
        def run(width: int) -> int:
            ran.append(width)
            clock.now += seconds
            return 0

        return team.timed(rows, run)

    call(DECODE_ROWS, 3.5)  # a process's first call: the prompt's 15 new tokens
    assert ran == [1] and looks == [0.0] and team.current == -2  # the prefill on one thread, the steps without barriers
    assert team.steps == 0 and team.per_row == {}  # its time taught the steps nothing
    for _ in range(20):
        call(1, 0.0045)  # decode steps
    call(5, 0.01)  # a draft verified right after a step: at the steps' width, no look
    assert len(looks) == 1 and ran[-1] == team.current == -2 and team.steps == 20
    clock.now += PAUSE_S + 1.0  # the next turn, after the user typed
    call(12, 0.1)
    assert len(looks) == 2 and ran[-1] == 1 and team.steps == 20


def test_others_running_sees_a_busy_process():
    import subprocess
    import sys

    from chatcli.engine.runners.team import others_running

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)
        assert others_running() >= 1
        import os

        cpus = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(cpus)})  # one CPU of the machine's: the count is not about ours
        try:
            assert len(cpus) == 1 or others_running() == 0
        finally:
            os.sched_setaffinity(0, cpus)
    finally:
        busy.kill()
        busy.wait()


def test_a_burst_of_another_process_is_not_a_busy_one():
    """A look that sees another process for its first milliseconds, then none (a client sending its requests),
    counts none: the prompt it came with is prefilled on the whole team. One that stays is counted."""
    from chatcli.engine.runners.team import others_running

    def machine(busy_reads: int):
        reads = iter([1] * busy_reads + [0] * 100)
        return lambda: next(reads)

    slept: list[float] = []
    assert others_running(sample=machine(8), sleep=slept.append) == 0  # 8 reads: longer than the first five
    assert sum(slept) >= 0.01
    assert others_running(sample=machine(1000), sleep=lambda s: None) == 1
    assert others_running(confirm_s=0.0, sample=machine(8), sleep=lambda s: None) == 1  # five reads alone: fooled
    assert others_running(sample=lambda: None, sleep=lambda s: None) == 0  # no /proc


def test_one_thread_has_nothing_to_learn():
    clock = Clock()
    team = TeamWidth(1, clock, QUIET)
    assert {w for _, w in drive(team, clock, {1: 0.01}, 5.0)} == {1}


@pytest.fixture
def native_files(tiny_loaded, tmp_path_factory):
    from tests.tiny import lean_weights

    folder = tmp_path_factory.mktemp("team")
    return {kind: lean_weights(tiny_loaded.model, kind, folder, tiny_loaded.tokenizer) for kind in ("q4", "int8")}


@pytest.mark.parametrize("kind", ["q4", "int8"])
def test_the_runner_learns_its_width_and_the_bits_do_not_change(kernel, native_files, kind, monkeypatch):
    """A runner without a fixed thread count learns its width; whatever widths its calls ran at
    (forced here to alternate), prefills and decode steps give the bits of a fixed two-thread team."""
    from chatcli.engine.runners import native

    monkeypatch.setattr(native, "kernel_threads", lambda: 2)
    learning = native.NativeRunner(native_files[kind])
    fixed = native.NativeRunner(native_files[kind], threads=2)
    assert learning.team is not None and learning.team.most == 2 and fixed.team is None
    turns = iter([1, 2] * 100)
    monkeypatch.setattr(learning.team, "width", lambda rows: next(turns))
    ids = list(range(3, 40))
    a, b = learning.new_cache(), fixed.new_cache()
    assert np.array_equal(learning.forward(ids, a), fixed.forward(ids, b))
    for token in (5, 9, 200, 7):
        assert np.array_equal(learning.forward([token], a), fixed.forward([token], b))
    assert np.array_equal(learning.verify([4, 4, 31], a), fixed.verify([4, 4, 31], b))


def test_a_draft_s_check_runs_at_the_steps_width_and_teaches_nothing():
    """A check of 5 drafted ids reads the weights once, as a step does: its time a row is a fifth of a step's.
    Taken as a step's, a width tried on it (one thread) looked faster than the whole team and took over."""
    clock = Clock()
    team = TeamWidth(2, clock, QUIET, tolerant=False)
    check = {2: 0.004, 1: 0.007}  # a 5-row check: the whole team is faster, but 1.4 ms a row on one thread
    for _ in range(400):
        for rows in (1, 5):
            width = team.width(rows)
            seconds = check[width] if rows == 5 else IDLE[width]
            clock.now += seconds
            team.record(rows, width, seconds)
            if rows == 5:
                assert width == team.current
    assert team.current == 2 and set(team.per_row) <= {2, 1} and team.per_row[2] == pytest.approx(IDLE[2])
