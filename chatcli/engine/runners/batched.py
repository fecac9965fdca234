"""Several turns at once on one runner: their forward and verify calls, each made from the turn's own
thread, run together as one `forward_batch` (serve's slots, `chatcli serve --parallel N`).

Contract. A turn runs in its own thread exactly as it runs alone: `Engine.complete` calls `forward`
or `verify` and blocks until its logits come back. Inside `slot()` a turn counts as running, and the
calls wait for those of the other running turns — until each of them has one pending, or `wait_s`
after the oldest pending call or the last batch's end, whichever is later — then one thread of the
runner's own (the step thread) runs all that are pending in one call: every weight is read once for
all their rows, and each call gets the bits it would get alone (`NativeRunner.forward_batch`), so a
greedy reply is the same beside other requests. A prompt chunk rides in the same batch as the
others' single decode rows, so a chunk is sized by time (`prefill_chunk`): a batch should take about
`BATCH_S`, its prompt rows shared among the running turns (`ALONE_S` alone), a row costing more the
more positions it attends to (learned from the batches run: on the embedded model a 128-row forward
took 165 ms at the start of the cache and 938 ms at 4,000 positions, so four turns' fixed 128-row
chunks made batches of ~4 s there). A call whose turn was cancelled (`cancel`) while it waited for
its batch drops out of it (`CallDropped`, nothing written to its cache): a client that left waits for
the batch in flight, not for its own. A batch that fails runs its calls one by one, so that one bad
call fails only itself. Only the step thread calls the runner: one OpenMP team, however many turns,
and let go while no turn runs (`runners/threads.py` says what a second team costs).

A runner without `forward_batch` (the torch runners) takes the calls one by one, in turn: the turns
then interleave step by step instead of queueing whole. Everything else (`new_cache`,
`context_limit`, ...) is the wrapped runner's. `batches`, `rows` and `widest` say what ran (`/metrics`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from chatcli.engine.runners.threads import release_cpu_threads

WAIT_S = 0.015  # the longest a call waits for the other running turns' calls of its step
BATCH_S = 0.25  # what a batch with prompt rows should take: the others' steps, a cancel, a new turn wait on it
ALONE_S = 0.5  # what a prefill call takes alone: only a cancel and a new turn wait on it, larger calls run faster
SHARED_CHUNK = 128  # the most prompt tokens a prefill call takes while other turns are running
PROBE_CHUNK = 32  # a prefill call's tokens before any batch was timed
MIN_CHUNK = 16  # the fewest, however slow the rows (a chunk much smaller reads the weights for little)
ROW_COST = 1024  # a row's own cost (its weights' share) in positions attended to: a row at depth d costs ROW_COST + d
TIMED_ROWS = 32  # a batch of fewer rows is bound by reading the weights, not by its rows: it times nothing


class CallDropped(Exception):
    """A call whose turn was cancelled before its batch ran: nothing was written to its cache."""


@dataclass(eq=False)
class _Call:
    ids: list[int]
    cache: object
    every: bool
    since: float
    start: int  # the cache's length when the call came: a batch that failed left it so, or not
    cancel: threading.Event | None = None
    result: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False

    @property
    def cost(self) -> float:
        """The call's work in positions attended to: each row its own share (ROW_COST) and those before it."""
        return len(self.ids) * (ROW_COST + self.start + len(self.ids) / 2)


class BatchedRunner:
    def __init__(self, runner, wait_s: float = WAIT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.runner = runner
        self.wait_s = wait_s
        self._clock = clock  # the calls' and batches' times (tests: a clock of their own)
        self._cond = threading.Condition()
        self._pending: list[_Call] = []
        self._running = 0  # turns inside slot()
        self._thread: threading.Thread | None = None
        self._free_since = 0.0  # when the last batch ended: a call waits from then, not from its own start
        self._closed = False
        self._unit_s: float | None = None  # seconds per unit of `_Call.cost`, from the last batch timed
        self.batches = self.rows = self.widest = 0  # calls run, their rows, the most sequences in one

    def __getattr__(self, name: str):
        return getattr(self.runner, name)

    @contextmanager
    def slot(self) -> Iterator[None]:
        """A turn's time on the runner: while inside, the others' steps wait for its calls (a little)."""
        with self._cond:
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()  # a step waiting for this turn's call need not

    def prefill_chunk(self, cache, most: int) -> int:
        """Prompt tokens for `cache`'s next prefill call (`Engine.prefill`; `most`: the engine's own chunk):
        as many as take about BATCH_S shared among the running turns (their steps ride in the same batch
        and wait for it), ALONE_S alone, at a row's cost where this cache stands; SHARED_CHUNK at most
        beside others, MIN_CHUNK at least; PROBE_CHUNK until a batch was timed."""
        if self._unit_s is None:
            return min(most, PROBE_CHUNK)
        shared = self._running > 1
        most, seconds = (min(most, SHARED_CHUNK), BATCH_S / self._running) if shared else (most, ALONE_S)
        rows = seconds / self._unit_s / (ROW_COST + len(cache.ids))
        return max(MIN_CHUNK, min(most, int(rows)))

    def forward(self, ids: list[int], cache, cancel: threading.Event | None = None) -> np.ndarray:
        """The runner's forward in the next batch; CallDropped where `cancel` is set before that batch runs."""
        return self._submit(ids, cache, False, cancel)

    def verify(self, ids: list[int], cache, cancel: threading.Event | None = None) -> np.ndarray:
        return self._submit(ids, cache, True, cancel)

    def close(self, timeout: float = 10.0) -> None:
        """End the step thread once the calls pending are answered (a server that stops leaves no thread
        behind); a call after this raises RuntimeError."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _submit(self, ids: list[int], cache, every: bool, cancel: threading.Event | None) -> np.ndarray:
        call = _Call(list(ids), cache, every, self._clock(), len(cache.ids), cancel)
        with self._cond:
            if self._closed:
                raise RuntimeError("the batched runner is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._steps, name="chatcli-step", daemon=True)
                self._thread.start()
            self._pending.append(call)
            self._cond.notify_all()
            self._cond.wait_for(lambda: call.done)
        if call.error is not None:
            raise call.error
        return call.result

    def _steps(self) -> None:
        """The step thread: gather the pending calls, run them, hand back their logits; until closed."""
        while True:
            with self._cond:
                while (wait := self._wait()) is not None:
                    if not self._pending and not self._running:  # idle: its OpenMP team goes (threads.py)
                        release_cpu_threads()
                    if self._closed and not self._pending:
                        return
                    self._cond.wait(wait)
                batch, self._pending = self._pending, []
                batch = self._drop_cancelled(batch)
            if batch:
                self._run(batch)
            with self._cond:
                self._free_since = self._clock()
                self._cond.notify_all()

    def _wait(self) -> float | None:
        """None where the pending calls should run now; else how long to sleep before looking again."""
        if not self._pending:
            return 60.0  # woken by the next call
        # from the later of the oldest call and the last batch's end: a call that came during a batch
        # waits for the turns that batch just answered, or two groups would take turns, half-full
        left = max(self._pending[0].since, self._free_since) + self.wait_s - self._clock()
        if len(self._pending) >= self._running or left <= 0:
            return None
        return left

    def _drop_cancelled(self, batch: list[_Call]) -> list[_Call]:
        """The calls of `batch` whose turn is not cancelled; the others end at once (CallDropped)."""
        kept = []
        for call in batch:
            if call.cancel is not None and call.cancel.is_set():
                call.error, call.done = CallDropped(), True
            else:
                kept.append(call)
        if len(kept) < len(batch):
            self._cond.notify_all()
        return kept

    def _run(self, batch: list[_Call]) -> None:
        t0 = self._clock()
        self.batches += 1
        self.rows += sum(len(c.ids) for c in batch)
        self.widest = max(self.widest, len(batch))
        batched = getattr(self.runner, "forward_batch", None)
        try:
            if batched is not None and len(batch) > 1:
                try:
                    logits = batched([(c.ids, c.cache, c.every) for c in batch])
                    for call, rows in zip(batch, logits, strict=True):
                        call.result = rows
                except Exception:  # noqa: BLE001 - each call again alone: its own error, or its logits
                    pass
            for call in batch:
                if call.result is None:
                    self._alone(call)
        finally:
            for call in batch:
                call.done = True
        self._timed(batch, self._clock() - t0)

    def _timed(self, batch: list[_Call], seconds: float) -> None:
        """Learn a unit's seconds from a batch that ran whole and wide enough to be bound by its rows."""
        if sum(len(c.ids) for c in batch) >= TIMED_ROWS and all(c.error is None for c in batch) and seconds > 0:
            self._unit_s = seconds / sum(c.cost for c in batch)

    def _alone(self, call: _Call) -> None:
        try:
            if len(call.cache.ids) != call.start:
                raise RuntimeError("a batch failed after this call's rows were written")
            run = self.runner.verify if call.every else self.runner.forward
            call.result = run(call.ids, call.cache)
        except Exception as exc:  # noqa: BLE001 - raised in the call's own thread
            call.error = exc
