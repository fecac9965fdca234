"""The generation threads: the sync engine serves `parallel` requests at once (its slots), off the event loop.

Requests are `Job`s in a FIFO queue, taken in order by the slots' threads. With more than one slot the
engine's runner is shared through a `BatchedRunner`: the slots' steps run as one batch, every weight
read once for all of them, each reply the bits it gets alone. A slot's thread takes a job, templates
its messages once (`engine.fit_prompt`; a raw completion's prompt ids as they are), leases the
session with the longest cached prefix from the pool, drives `Engine.complete` over those ids,
and hands every event to the job's
`emit` callback (the app passes one that does `loop.call_soon_threadsafe` into an
asyncio queue, so the event loop never blocks on the engine). A job's `cancel` event
— set when its client disconnects — stops it before it starts, before its conversation's next
templating (`fit_prompt` templates a huge one a bounded number of times), at the next prefill chunk
or at the next step: a client that is gone never holds a slot.

`stop()` (the server's shutdown: the first Ctrl+C) cancels every job, running or queued, and
answers each with a 503 `shutting_down`: a stream ends with that error event at its next step, so
the server exits at once instead of waiting on the replies in flight. `close()` then ends the threads.

Whatever happens in a turn, the session goes back to the pool consistent: a turn
that raised drops its session, because its cache may no longer match its ids.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

from chatcli.engine import (
    ChatTemplateError,
    ContextOverflow,
    Engine,
    Finished,
    FinishReason,
    GrammarError,
    LeaseKind,
    PromptCancelled,
    SamplingParams,
    SessionPool,
)
from chatcli.errors import one_line
from chatcli.server.schema import APIError

log = logging.getLogger("chatcli.server")


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", code="shutting_down", type="server_error")


@dataclass
class Failed:
    """The job ended with an error instead of (or, mid-stream, after) its events."""

    error: APIError


@dataclass
class Job:
    messages: list[dict]  # a chat turn's messages; unused where `prompt` is set
    params: SamplingParams
    emit: Callable[[object], None]  # receives Prefilled, Token, Finished or Failed; last is Finished or Failed
    cancel: threading.Event = field(default_factory=threading.Event)
    prompt: list[int] | None = None  # a raw completion's prompt ids (/v1/completions): no chat template
    truncate: bool = True  # False: a conversation that fits only without its oldest exchanges is refused
    space: str = ""  # the prefix pool's space: only its sessions are reused (the client's key and cache_salt)

    def target(self, engine: Engine) -> tuple[list[int], int]:
        """The ids the turn continues and the exchanges dropped to fit them (raises ContextOverflow,
        PromptCancelled once `cancel` is set, or the chat template's error); templated once, here: the
        turn runs on these ids."""
        if self.prompt is not None:
            return engine.fit_raw(self.prompt), 0
        target, dropped = engine.fit_prompt(self.messages, self.params, self.cancel)
        if dropped and not self.truncate:
            raise ContextOverflow(
                f"the conversation does not fit the model's context of {engine.context_limit} tokens with room "
                f"for a reply; {dropped} earlier exchange(s) would be dropped, and truncation is disabled"
            )
        return target, dropped


DEFAULT_PARALLEL = 4  # slots where the runner batches (the kernel's); one elsewhere


def slots_for(engine: Engine, asked: int | None) -> int:
    """`--parallel`, or by default 4 where the runner runs several sequences in one call, else 1 (the
    torch runners would take the slots' steps one by one: interleaved, no faster)."""
    if asked is not None:
        return max(1, asked)
    return DEFAULT_PARALLEL if hasattr(engine.runner, "forward_batch") else 1


class GenerationWorker:
    def __init__(self, engine: Engine, pool: SessionPool, max_pending: int = 64, parallel: int = 1) -> None:
        self.parallel = max(1, parallel)  # slots: requests generated at once
        if self.parallel > 1:  # the slots' steps in one batch (the app's engine keeps its plain runner)
            engine = engine.batched()
        self.engine = engine
        self.pool = pool
        self.max_pending = max_pending  # running + queued; more are refused with a 503
        self._closing = False
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._state = threading.Condition()
        self._pending = 0  # submitted, not yet done
        self._live: dict[int, Job] = {}  # those jobs by id(): what `stop` cancels
        self.history: deque[dict] = deque(maxlen=64)  # the latest turns: finish reason and stats
        self.served = self.cancelled = self.failed = 0
        self.running = 0  # jobs generating now (at most `parallel`)
        self.tokens = {"prompt": 0, "cached": 0, "prefilled": 0, "generated": 0}  # since start, for /metrics

    def start(self) -> None:
        with self._state:  # the app's load thread and a first request may both start them: once
            while len(self._threads) < self.parallel:
                name = f"chatcli-generate-{len(self._threads)}"
                self._threads.append(threading.Thread(target=self._loop, name=name, daemon=True))
                self._threads[-1].start()

    def submit(self, job: Job) -> bool:
        """Queue `job`; False (and nothing queued) when the queue is full or the worker is closing."""
        with self._state:
            if self._closing or self._pending >= self.max_pending:
                return False
            self._pending += 1
            self._live[id(job)] = job
        self.start()
        self._jobs.put(job)
        return True

    def stop(self) -> None:
        """End every job now, running or queued, each answered with a 503 `shutting_down` (a stream: its
        error event, at the turn's next step); no job is taken after. Safe from any thread."""
        with self._state:
            self._closing = True
            jobs = list(self._live.values())
        for job in jobs:
            job.cancel.set()

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the current jobs; jobs still queued are answered with a 503, not run."""
        self._closing = True
        with self._state:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self.parallel > 1:  # the slots' BatchedRunner (engine.batched()): its step thread ends
            self.engine.runner.close(max(0.0, deadline - time.monotonic()))

    @property
    def pending(self) -> int:
        return self._pending

    def wait_idle(self, timeout: float) -> bool:
        """Block until no job is queued or running; False on timeout."""
        with self._state:
            return self._state.wait_for(lambda: self._pending == 0, timeout)

    # -- the thread -----------------------------------------------------------

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                with self._state:
                    self.running += 1
                self._run(job)
            except Exception:  # noqa: BLE001 - never let one request end the thread
                log.exception("generation failed")
                self._emit(job, Failed(APIError(500, "internal error in the generation thread", type="server_error")))
            finally:
                with self._state:
                    self.running -= 1
                    self._pending -= 1
                    self._live.pop(id(job), None)
                    self._state.notify_all()

    def _emit(self, job: Job, item: object) -> None:
        try:
            job.emit(item)
        except Exception:  # noqa: BLE001 - the client's loop is gone: nobody to tell
            job.cancel.set()

    def _left(self, job: Job) -> None:
        """The end of a job whose client left before its turn began (queued, or while templated)."""
        self._count("cancelled")
        self._emit(job, Failed(APIError(499, "the client disconnected", code="cancelled")))

    def _run(self, job: Job) -> None:
        if self._closing:  # queued when the server began to shut down
            self._emit(job, Failed(shutting_down()))
            return
        if job.cancel.is_set():  # the client left while queued
            self._left(job)
            return
        t_submit = time.perf_counter()
        try:
            target, dropped = job.target(self.engine)
        except PromptCancelled:  # the client left while its conversation was templated: the slot is free
            if self._closing:
                self._emit(job, Failed(shutting_down()))
            else:
                self._left(job)
            return
        except ContextOverflow as exc:
            self._count("failed")
            param = "messages" if job.prompt is None else "prompt"
            self._emit(job, Failed(APIError(400, str(exc), param, "context_length_exceeded")))
            return
        except Exception as exc:  # noqa: BLE001 - e.g. a chat template that rejects the roles
            self._count("failed")
            said = (
                str(exc)
                if isinstance(exc, ChatTemplateError)
                else f"the chat template rejected the messages: {one_line(exc)}"
            )
            self._emit(job, Failed(APIError(400, said, "messages")))
            return
        templated = time.perf_counter() - t_submit
        lease = self.pool.acquire(target, space=job.space)
        ok, failure, released = False, None, False
        slot = getattr(self.engine.runner, "slot", None)  # a BatchedRunner's: the others' steps wait for ours
        try:
            with slot() if slot is not None else nullcontext():
                # TTFT counts the templating, not the lease (as when the engine templated the turn itself)
                turn = self.engine.complete(
                    target, lease.session, job.params, job.cancel, dropped, time.perf_counter() - templated
                )
                for event in turn:
                    if isinstance(event, Finished):  # the turn's last event: nothing touches the session after it
                        self._record(event, lease.how)
                        # back in the pool before the client hears the end: a follow-up it sends at once,
                        # taken by another slot, finds this conversation's cache
                        self.pool.release(lease, True)
                        released = True
                        if event.finish_reason == FinishReason.CANCELLED and self._closing:
                            event = Failed(shutting_down())  # `stop`: the client is there, and told why
                    self._emit(job, event)
            ok = True
        except GrammarError as exc:  # the schema failed the grammar engine past its first steps: the request's fault
            log.warning("%s refused: %s", exc.param, exc)
            self._count("failed")
            failure = Failed(APIError(400, str(exc), exc.param, "invalid_value"))
        except Exception as exc:  # noqa: BLE001 - reported to the client as one line
            log.exception("generation failed")
            self._count("failed")
            failure = Failed(APIError(500, f"generation failed: {one_line(exc)}", type="server_error"))
        finally:
            if not released:
                self.pool.release(lease, ok)  # before the client hears of a failure: the pool is settled
        if failure is not None:
            self._emit(job, failure)

    def _count(self, outcome: str) -> None:
        with self._state:  # the slots' threads count into the same totals
            setattr(self, outcome, getattr(self, outcome) + 1)

    def _record(self, done: Finished, how: LeaseKind) -> None:
        self._count("cancelled" if done.finish_reason == FinishReason.CANCELLED else "served")
        with self._state:
            self.history.append({"finish_reason": done.finish_reason, "pool": how, **done.stats.to_dict()})
            s, counted = done.stats, self.tokens
            counted["prompt"] += s.prompt_tokens or 0
            counted["cached"] += s.cached_tokens or 0
            counted["prefilled"] += s.prefill_tokens or 0
            counted["generated"] += s.completion_tokens
