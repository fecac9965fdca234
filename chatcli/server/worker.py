"""The generation thread: the sync engine serves one request at a time, off the event loop.

Requests are `Job`s in a FIFO queue. The one worker thread takes a job, templates
its messages once (`engine.fit_prompt`; a raw completion's prompt ids as they are), leases the
session with the longest cached prefix from the pool, drives `Engine.complete` over those ids,
and hands every event to the job's
`emit` callback (the app passes one that does `loop.call_soon_threadsafe` into an
asyncio queue, so the event loop never blocks on the engine). A job's `cancel` event
— set when its client disconnects — stops it before it starts or at the next step.

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
from dataclasses import dataclass, field

from chatcli.engine import (
    ContextOverflow,
    Engine,
    Finished,
    FinishReason,
    GrammarError,
    LeaseKind,
    SamplingParams,
    SessionPool,
)
from chatcli.errors import one_line
from chatcli.server.schema import APIError

log = logging.getLogger("chatcli.server")


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

    def target(self, engine: Engine) -> tuple[list[int], int]:
        """The ids the turn continues and the exchanges dropped to fit them (raises ContextOverflow,
        or the chat template's error); templated once, here: the turn runs on these ids."""
        if self.prompt is not None:
            return engine.fit_raw(self.prompt), 0
        target, dropped = engine.fit_prompt(self.messages, self.params)
        if dropped and not self.truncate:
            raise ContextOverflow(
                f"the conversation does not fit the model's context of {engine.context_limit} tokens with room "
                f"for a reply; {dropped} earlier exchange(s) would be dropped, and truncation is disabled"
            )
        return target, dropped


class GenerationWorker:
    def __init__(self, engine: Engine, pool: SessionPool, max_pending: int = 64) -> None:
        self.engine = engine
        self.pool = pool
        self.max_pending = max_pending  # running + queued; more are refused with a 503
        self._closing = False
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._state = threading.Condition()
        self._pending = 0  # submitted, not yet done
        self.history: deque[dict] = deque(maxlen=64)  # the latest turns: finish reason and stats
        self.served = self.cancelled = self.failed = 0
        self.running = 0  # jobs generating now (one slot: 0 or 1)
        self.tokens = {"prompt": 0, "cached": 0, "prefilled": 0, "generated": 0}  # since start, for /metrics

    def start(self) -> None:
        with self._state:  # the app's load thread and a first request may both start it: one thread
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="chatcli-generate", daemon=True)
                self._thread.start()

    def submit(self, job: Job) -> bool:
        """Queue `job`; False (and nothing queued) when the queue is full or the worker is closing."""
        with self._state:
            if self._closing or self._pending >= self.max_pending:
                return False
            self._pending += 1
        self.start()
        self._jobs.put(job)
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the current job; jobs still queued are answered with a 503, not run."""
        self._closing = True
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout)
            self._thread = None

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
                self.running = 1
                self._run(job)
            except Exception:  # noqa: BLE001 - never let one request end the thread
                log.exception("generation failed")
                self._emit(job, Failed(APIError(500, "internal error in the generation thread", type="server_error")))
            finally:
                self.running = 0
                with self._state:
                    self._pending -= 1
                    self._state.notify_all()

    def _emit(self, job: Job, item: object) -> None:
        try:
            job.emit(item)
        except Exception:  # noqa: BLE001 - the client's loop is gone: nobody to tell
            job.cancel.set()

    def _run(self, job: Job) -> None:
        if job.cancel.is_set():  # the client left while queued
            self.cancelled += 1
            self._emit(job, Failed(APIError(499, "the client disconnected", code="cancelled")))
            return
        if self._closing:
            self._emit(
                job, Failed(APIError(503, "the server is shutting down", code="shutting_down", type="server_error"))
            )
            return
        t_submit = time.perf_counter()
        try:
            target, dropped = job.target(self.engine)
        except ContextOverflow as exc:
            self.failed += 1
            param = "messages" if job.prompt is None else "prompt"
            self._emit(job, Failed(APIError(400, str(exc), param, "context_length_exceeded")))
            return
        except Exception as exc:  # noqa: BLE001 - e.g. a chat template that rejects the roles
            self.failed += 1
            self._emit(
                job, Failed(APIError(400, f"the chat template rejected the messages: {one_line(exc)}", "messages"))
            )
            return
        templated = time.perf_counter() - t_submit
        lease = self.pool.acquire(target)
        ok, failure = False, None
        try:
            # TTFT counts the templating, not the lease (as when the engine templated the turn itself)
            turn = self.engine.complete(
                target, lease.session, job.params, job.cancel, dropped, time.perf_counter() - templated
            )
            for event in turn:
                self._emit(job, event)
                if isinstance(event, Finished):
                    self._record(event, lease.how)
            ok = True
        except GrammarError as exc:  # the schema failed the grammar engine past its first steps: the request's fault
            log.warning("response_format refused: %s", exc)
            self.failed += 1
            failure = Failed(APIError(400, str(exc), "response_format", "invalid_value"))
        except Exception as exc:  # noqa: BLE001 - reported to the client as one line
            log.exception("generation failed")
            self.failed += 1
            failure = Failed(APIError(500, f"generation failed: {one_line(exc)}", type="server_error"))
        finally:
            self.pool.release(lease, ok)  # before the client hears of a failure: the pool is settled
        if failure is not None:
            self._emit(job, failure)

    def _record(self, done: Finished, how: LeaseKind) -> None:
        if done.finish_reason == FinishReason.CANCELLED:
            self.cancelled += 1
        else:
            self.served += 1
        self.history.append({"finish_reason": done.finish_reason, "pool": how, **done.stats.to_dict()})
        s, counted = done.stats, self.tokens
        counted["prompt"] += s.prompt_tokens or 0
        counted["cached"] += s.cached_tokens or 0
        counted["prefilled"] += s.prefill_tokens or 0
        counted["generated"] += s.completion_tokens
