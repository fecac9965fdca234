"""How many threads the compiled kernel's team gets for a call, learned from the decode steps' times.

A forward is one OpenMP parallel region in which every stage ends at a barrier: about eight a
layer. On an idle machine every core is ours and a team as wide as the machine is fastest. When
another process keeps a core busy (a browser, a build), the scheduler takes one of our threads off
its core for a time slice now and then, and the whole team waits at the next barrier until it is
back: decode fell from ~300 to 1-22 tok/s on 2 cores. One thread fewer runs on the cores that are
free and never waits, but gets under half of the idle speed (one core's memory bandwidth). So a
decode step has one more way to run: a negative width, the whole team without barriers
(kernels/tolerant.h: a thread does the items of one the scheduler has taken off its core), on the
kernel's own threads while the caller's sleeps (kernels/pool.h: the caller is then given a core as
soon as the step is done, and the team's threads get their share: 1.3 cores of 2 beside a busy
process). It is a few percent slower than barriers on an idle machine, two thirds of the idle speed
beside a busy process.

So the decode steps (calls of one row: many, alike, and cheap to try another width on) keep a
moving average of the seconds a step took at each width tried, run at the fastest, and try another
width now and then: at the second step (a process starts knowing nothing), then after 1 s, 2 s,
4 s … up to 8 s while the others keep losing (contention comes and goes on a person's time scale;
a try of the whole team under contention costs a slow step, so tries are spaced in time, not in
steps), and at the next step when the current width slows down past 1.5x its best. A draft's check (a
call of a few rows right after a step, `lookup`) runs at the steps' width and teaches nothing: it reads
the weights once for all its rows, so its time a row is a fraction of a step's, and a width tried on
one looked faster than the steps' (one thread took over the checks of a story's repeated end). A prefill (many
rows) teaches nothing (its time varies too much with its length); it runs at the width a look at
the machine gives: the whole team less one thread per thread of another process running now
(`others_running`: /proc/stat's count less ours, the least of a few reads a millisecond apart and,
where those see one, of reads for 30 ms more, so that a process in a burst is not taken for a busy
one: the benchmark's own clients sending their requests halved the prefill of their prompts). That
look also starts the decode steps there, or without barriers where another process is running (they
try another width 4 s later, not at their second step: the look is evidence, and the next turn looks
again), so a turn, a one-shot's first included, starts right. A prompt of a few new tokens (a turn
after `-c` restored its cache: 15 tokens) is a call of as few rows as a step with a draft, but it is
a turn's first call: one of several rows that comes `PAUSE_S` after the last call ended (steps follow
each other within milliseconds), or the process's first, is a prefill too — it looks, runs at the
look's width and teaches nothing (run as a step, on the whole team with barriers in a process that
had learned nothing yet, 15 tokens took 3.5 s beside a busy process, a 38-token prefill 0.23 s).
Steps without barriers are kept only while they are clearly faster: a try with barriers that is
faster at all takes over.

A row's numbers do not depend on the width (the kernel computes every row alone, in a fixed
order), so switching changes the speed, never a reply.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

LOOK_EVERY_S = 0.5  # a prefill's look at the machine is reused this long (a long prompt's chunks)
LOOKED_WAIT_S = 4.0  # after a prefill's look: the decode steps' first try of another width
FIRST_TRY = 2  # the decode step that first tries another width
FIRST_WAIT_S = 1.0  # seconds to the next try after a width takes over, or the current one slows
LAST_WAIT_S = 8.0  # the longest wait between tries while the other widths keep losing
SLOWER = 1.5  # the current width this much slower than its own best: try the others at once
CLEARLY = 0.9  # a tried width takes over when it ran a row in this fraction of the current's time
DECODE_ROWS = 15  # calls of at most this many rows are decode steps (and drafts; on a negative width the kernel
# runs them without barriers, kernels/tolerant.h); more: prefill
PAUSE_S = 0.25  # a call of several rows this long after the last one ended begins a turn: a prefill
SMOOTH = 0.25  # weight of a step's time in the moving average of its width
CONFIRM_S = 0.03  # a look that sees another process running checks this much longer that it stays (a burst)


def others_running(reads: int = 5, confirm_s: float = CONFIRM_S, sample=None, sleep=time.sleep) -> int:
    """Threads of other processes on a CPU now: /proc/stat's procs_running less this process's own
    running threads, the least of `reads` reads 1 ms apart and, where those all saw some, of reads
    every 5 ms for `confirm_s` more: a process that runs in a burst (a client sending its requests, a
    terminal drawing) is not taken for a busy one, which would halve a prompt's prefill. 0 where there
    is no /proc (macOS), and where this process may use only some of the machine's CPUs (a container's
    cpuset, `taskset`): the count is the whole machine's, most of it on CPUs that are not ours.
    `sample`: one read (tests: a scripted machine)."""
    if sample is None:
        try:
            if len(os.sched_getaffinity(0)) < (os.cpu_count() or 1):
                return 0
        except (AttributeError, OSError):  # no affinity call (macOS): no /proc either
            return 0
        sample = _others_now
    least = None
    spacing = [0.001] * (reads - 1) + [0.005] * round(confirm_s / 0.005)
    for i in range(len(spacing) + 1):
        now = sample()
        if now is None:
            return 0
        least = now if least is None else min(least, now)
        if least <= 0:
            return 0
        if i < len(spacing):
            sleep(spacing[i])
    return max(0, least or 0)


def _others_now() -> int | None:
    """One read: /proc/stat's procs_running less this process's threads in state R (None: no /proc)."""
    import glob

    try:
        with open("/proc/stat", encoding="ascii") as f:
            running = next(int(line.split()[1]) for line in f if line.startswith("procs_running"))
    except (OSError, StopIteration, ValueError):
        return None
    ours = 0
    for path in glob.glob("/proc/self/task/*/stat"):
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:  # a thread that ended since the listing
            continue
        ours += stat[stat.rindex(")") + 2 : stat.rindex(")") + 3] == "R"
    return running - ours


def widths(most: int) -> list[int]:
    """The widths worth trying on `most` threads, widest first: all of them, one fewer (one core
    busy elsewhere), half, and one."""
    return sorted({most, max(1, most - 1), max(1, most // 2), 1}, reverse=True)


class TeamWidth:
    """`width(rows)` before a call, `record(rows, width, seconds)` after it (or `timed`). Thread-safe."""

    def __init__(
        self,
        most: int,
        clock: Callable[[], float] = time.perf_counter,
        others: Callable[[], int] = others_running,
        tolerant: bool = True,
    ) -> None:
        self.most = max(1, most)
        self.others = others  # threads of other processes running now (tests: a fixed answer)
        self.tolerant = tolerant  # decode steps may run without barriers (a negative width: kernels/pool.h)
        self.looked: float | None = None  # clock time of the last look
        # and the whole team without barriers, the caller's thread asleep (kernels/tolerant.h, pool.h)
        self.widths = widths(self.most) + ([-self.most] if tolerant and self.most > 1 else [])
        self.clock = clock
        self.current = self.most  # the decode steps' width
        self.prefill = self.most  # a prefill's: the last look's
        self.per_row: dict[int, float] = {}  # width -> moving average of a decode step's seconds (one row)
        self.best = float("inf")  # the current width's best average since it took over or slowed
        self.steps = 0
        self.ended: float | None = None  # clock time the last call ended (None: none yet)
        self.wait_s = FIRST_WAIT_S
        self.next_try: float | None = None  # clock time of the next try (None: at step FIRST_TRY)
        self._turn = 0  # which other width the next try takes (round robin)
        self._lock = threading.Lock()

    def width(self, rows: int) -> int:
        """The width for a call of `rows` rows: the fastest known, or, for a decode step, another to try."""
        return self._pick(rows)[0]

    def _pick(self, rows: int) -> tuple[int, bool]:
        """(the width for a call of `rows` rows, whether its time teaches: a decode step's)."""
        with self._lock:
            if self.prefills(rows):
                self._look()
                return self.prefill, False
            if rows > 1:  # a draft's check: its time is no step's (the weights are read once for all its rows)
                return self.current, False
            self.steps += 1
            others = [w for w in self.widths if w != self.current]
            due = self.steps >= FIRST_TRY if self.next_try is None else self.clock() >= self.next_try
            if others and due:
                self._turn = (self._turn + 1) % len(others)
                self.next_try = self.clock() + self.wait_s  # unless record() decides sooner
                return others[self._turn], True
            return self.current, True

    def prefills(self, rows: int) -> bool:
        """Whether a call of `rows` rows now is a prefill: more than DECODE_ROWS, or several rows that
        begin a turn (the process's first call, or one PAUSE_S after the last ended)."""
        if rows > DECODE_ROWS:
            return True
        return rows > 1 and (self.ended is None or self.clock() - self.ended >= PAUSE_S)

    def _look(self) -> None:
        """A prefill: the width the machine allows now is the prefill's (the look is reused for
        LOOK_EVERY_S); the decode steps start there too, or, where they can run without barriers and
        another process is running, at the whole team without barriers (a negative width)."""
        now = self.clock()
        if self.most == 1 or (self.looked is not None and now - self.looked < LOOK_EVERY_S):
            return
        self.looked = now
        self.prefill = want = max(1, self.most - self.others())
        if self.tolerant and want < self.most:
            want = -self.most
        if want != self.current:
            self.current, self.best, self.wait_s = want, float("inf"), FIRST_WAIT_S
        # the look is evidence either way, and the next turn's prefill looks again: the steps wait
        # before trying another width (a try costs a slow step); a step that slows still tries at once
        self.next_try = now + LOOKED_WAIT_S

    def record(self, rows: int, width: int, seconds: float) -> None:
        """What a call of `rows` rows at `width` took (only a decode step of one row teaches: see above)."""
        with self._lock:
            self.ended = self.clock()
        if rows > 1:
            return
        per = seconds
        with self._lock:
            if width != self.current:  # a try: its own time now, not an average of old ones
                self.per_row[width] = per
                # the caller's thread asleep (a negative width) is kept only while it is clearly faster; its
                # steps vary beside a busy process (a worker held back), so a try is held to its best
                margin = 1.0 if self.current < 0 < width else CLEARLY
                incumbent = self.per_row.get(self.current, float("inf"))
                if per < margin * (min(incumbent, self.best) if self.current < 0 else incumbent):
                    self.current, self.best, self.wait_s = width, per, FIRST_WAIT_S
                else:
                    self.wait_s = min(2 * self.wait_s, LAST_WAIT_S)
                self.next_try = self.clock() + self.wait_s
                return
            old = self.per_row.get(width)
            self.per_row[width] = average = per if old is None else old + SMOOTH * (per - old)
            self.best = min(self.best, average)
            if average > SLOWER * self.best and width > 0:  # slowed down: another process came? try the others now
                self.best, self.wait_s = average, FIRST_WAIT_S
                self.next_try = self.clock()

    def timed(self, rows: int, call: Callable[[int], int]) -> int:
        """`call(width)` at the width for `rows` rows, its time recorded; returns what it returned."""
        width, teaches = self._pick(rows)
        start = self.clock()
        status = call(width)
        if teaches:
            self.record(rows, width, self.clock() - start)
        else:
            with self._lock:
                self.ended = self.clock()
        return status
