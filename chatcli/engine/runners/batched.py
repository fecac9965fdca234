"""Several turns at once on one runner: their forward and verify calls, each made from the turn's own
thread, run together as one `forward_batch` (serve's slots, `chatcli serve --parallel N`).

Contract. A turn runs in its own thread exactly as it runs alone: `Engine.complete` calls `forward`
or `verify` and blocks until its logits come back. Inside `slot()` a turn counts as running, and the
calls wait for those of the other running turns — until each of them has one pending, or `wait_s`
after the oldest pending call or the last batch's end, whichever is later — then one thread of the
runner's own (the step thread) runs all that are pending in one call: every weight is read once for
all their rows, and each call gets the bits it would get alone (`NativeRunner.forward_batch`), so a
greedy reply is the same beside other requests. A prompt chunk rides in the same batch as the
others' single decode rows: a long prompt delays them by at most a chunk, `SHARED_CHUNK` tokens
while others run. A batch that fails runs its calls one by one, so that one bad call fails only
itself. Only the step thread calls the runner: one OpenMP team, however many turns, and let go
while no turn runs (`runners/threads.py` says what a second team costs).

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
SHARED_CHUNK = 128  # prompt tokens a prefill call takes while other turns are running (their steps wait on it)


@dataclass
class _Call:
    ids: list[int]
    cache: object
    every: bool
    since: float
    start: int  # the cache's length when the call came: a batch that failed left it so, or not
    result: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False


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

    @property
    def prefill_chunk(self) -> int | None:
        """Prompt tokens per prefill call (`Engine.prefill`): `SHARED_CHUNK` beside other turns, whose decode
        steps ride in the same calls and so wait for each chunk; None (the engine's own) alone."""
        return SHARED_CHUNK if self._running > 1 else None

    def forward(self, ids: list[int], cache) -> np.ndarray:
        return self._submit(ids, cache, every=False)

    def verify(self, ids: list[int], cache) -> np.ndarray:
        return self._submit(ids, cache, every=True)

    def close(self, timeout: float = 10.0) -> None:
        """End the step thread once the calls pending are answered (a server that stops leaves no thread
        behind); a call after this raises RuntimeError."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _submit(self, ids: list[int], cache, every: bool) -> np.ndarray:
        call = _Call(list(ids), cache, every, self._clock(), len(cache.ids))
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

    def _run(self, batch: list[_Call]) -> None:
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

    def _alone(self, call: _Call) -> None:
        try:
            if len(call.cache.ids) != call.start:
                raise RuntimeError("a batch failed after this call's rows were written")
            run = self.runner.verify if call.every else self.runner.forward
            call.result = run(call.ids, call.cache)
        except Exception as exc:  # noqa: BLE001 - raised in the call's own thread
            call.error = exc
