"""The responses of the completion routes: a job submitted to the generation worker, answered with
JSON or Server-Sent Events as its events arrive.

`CompletionResponse` writes chat.completion and its chunks; its shape hooks (`_whole`, `_opening`,
`_piece`, `_closing`, `_usage_chunk`, `_entry`) are what `chatcli.server.legacy` overrides for
text_completion. Each response waits on its own asyncio queue, fed from the worker thread with
`loop.call_soon_threadsafe`, while a watcher task listens for the client's disconnect and sets the
job's cancel event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import anyio
from starlette.responses import Response

from chatcli.engine import (
    CallScanner,
    Finished,
    GrammarError,
    Prefilled,
    Token,
    call_syntax,
    parse_calls,
    token_entry,
)
from chatcli.server import schema
from chatcli.server.schema import APIError, ChatRequest
from chatcli.server.tools import call_deltas, tool_calls
from chatcli.server.worker import Failed, GenerationWorker, Job


def _json(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


class CompletionResponse(Response):
    """Submits the job when sent, then answers with JSON or SSE as its events arrive. The shapes
    are chat.completion's; `chatcli.server.legacy.TextCompletionResponse` overrides the hooks
    (`_whole`, `_opening`, `_piece`, `_closing`, `_usage_chunk`, `_entry`) for text_completion."""

    def __init__(
        self, request: ChatRequest, worker: GenerationWorker, model: str, tokenizer=None, space: str = ""
    ) -> None:
        self.request = request
        self.space = space  # the prefix pool's space this request's cache is shared in (`guard.cache_space`)
        self.worker = worker
        self.model = model
        self.tokenizer = tokenizer  # names the tokens of a reply's logprobs
        self.background = None
        self.cid, self.created = schema.new_id(), int(time.time())
        tools = getattr(request.params, "tools", None)
        self.tools = tools if tools is not None and tools.callable() else None  # calls to read from the reply
        self.syntax = call_syntax(worker.engine)
        self.scanner = CallScanner(self.syntax) if self.tools is not None and self.syntax else None
        self.calls = 0  # calls streamed

    def _job(self, emit) -> Job:
        return Job(self.request.messages, self.request.params, emit, truncate=self.request.truncate, space=self.space)

    def _scored(self, event, pending: list | None) -> None:
        """A Token's logprobs entry appended to `pending` (None: the request asked for none)."""
        if pending is not None:
            found = self._entry(event)
            if found is not None:
                pending.append(found)

    # -- the shapes (chat.completion and its chunks) --------------------------------------------

    def _entry(self, event) -> dict | None:
        return token_entry(self.tokenizer, event)

    def _error_body(self, err: APIError) -> dict:
        """An error as this API's clients read it (OpenAI's shape; `peers` for the others')."""
        return err.body()

    def _whole(self, first: Prefilled, done: Finished, scored: list | None) -> dict:
        use = schema.usage(first, done.stats)
        text, calls = done.reply, []
        if self.scanner is not None:
            content, calls = parse_calls(done.reply, self.syntax)
            calls = calls if self.tools.parallel else calls[:1]
            text = content if calls else text
        listed = tool_calls(calls, self.syntax)
        return schema.completion(self.cid, self.model, text, done.finish_reason, use, scored, listed)

    def _deltas(self, text: str | None) -> list:
        """What the reply's next text (None: its end) lets out: the text (a str, for `_piece`), or with
        tools the scanner's pieces as deltas, text and calls (one only where parallel calls are not allowed)."""
        if self.scanner is None:
            return [text] if text else []
        out = []
        for piece in self.scanner.finish() if text is None else self.scanner.push(text):
            if isinstance(piece, str):
                out.append({"content": piece})
            elif self.calls == 0 or self.tools.parallel:
                out += call_deltas(piece, self.calls, self.syntax)
                self.calls += 1
        return out

    def _chunk(self, delta, reason=None, use=None, scored=None, with_usage=None) -> dict:
        with_usage = self.request.include_usage if with_usage is None else with_usage
        return schema.chunk(self.cid, self.model, self.created, delta, reason, use, with_usage, scored)

    def _opening(self) -> dict | None:
        return self._chunk({"role": "assistant", "content": ""})

    def _piece(self, text: str, scored: list | None) -> dict:
        return self._chunk({"content": text}, scored=scored)

    def _closing(self, reason: str) -> dict:
        return self._chunk({}, reason)

    def _usage_chunk(self, use: dict) -> dict:
        return self._chunk(None, use=use, with_usage=True)

    async def __call__(self, scope, receive, send) -> None:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(item) -> None:  # called in the worker thread
            loop.call_soon_threadsafe(events.put_nowait, item)

        refused = await self._check_tools()
        if refused is not None:
            await self._send_json(send, refused.status, self._error_body(refused))
            return
        job = self._job(emit)
        if not self.worker.submit(job):
            busy = APIError(
                503,
                f"the server is busy: {self.worker.max_pending} requests are already queued",
                code="server_busy",
                type="server_error",
            )
            await self._send_json(send, busy.status, self._error_body(busy))
            return
        async with anyio.create_task_group() as tg:

            async def watch_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                job.cancel.set()
                tg.cancel_scope.cancel()

            tg.start_soon(watch_disconnect)
            try:
                with contextlib.suppress(OSError):  # the client went away while we were sending
                    await self._respond(events, send)
            finally:
                job.cancel.set()  # no-op after Finished; stops a turn whose client left
                tg.cancel_scope.cancel()

    async def _check_tools(self) -> APIError | None:
        """A 400 for tools this engine cannot offer: a parameters schema the grammar engine refuses
        (checked off the event loop: the first check builds the tokenizer's grammar side), no tokenizer."""
        params = self.request.params
        if getattr(params, "tools", None) is None:
            return None
        if self.syntax is None:
            return APIError(400, "tools need the in-process engine", "tools", "unsupported_parameter")
        try:
            await anyio.to_thread.run_sync(self.worker.engine.check_params, params)
        except GrammarError as exc:
            return APIError(400, str(exc), "tools", "invalid_value")
        return None

    async def _respond(self, events: asyncio.Queue, send) -> None:
        first = await events.get()
        if isinstance(first, Failed):
            await self._send_json(send, first.error.status, self._error_body(first.error))
            return
        assert isinstance(first, Prefilled)
        if self.request.stream:
            await self._stream(first, events, send)
            return
        scored = [] if self.request.params.logprobs is not None else None
        while True:
            event = await events.get()
            if isinstance(event, Token):
                self._scored(event, scored)
            elif isinstance(event, Failed):
                await self._send_json(send, event.error.status, self._error_body(event.error))
                return
            elif isinstance(event, Finished):
                await self._send_json(send, 200, self._whole(first, event, scored), _truncated(first))
                return

    async def _stream(self, first: Prefilled, events: asyncio.Queue, send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            *_truncated(first),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def data(obj) -> None:
            payload = b"data: " + (obj if isinstance(obj, bytes) else _json(obj)) + b"\n\n"
            await send({"type": "http.response.body", "body": payload, "more_body": True})

        opening = self._opening()
        if opening is not None:
            await data(opening)
        pending = [] if self.request.params.logprobs is not None else None  # tokens whose text is not out yet
        while True:
            event = await events.get()
            if isinstance(event, Failed):
                await data(event.error.body())
                break
            if isinstance(event, Token):
                self._scored(event, pending)
            elif not isinstance(event, Finished):
                continue
            for delta in self._deltas(event.text if isinstance(event, Token) else None):
                scored = pending
                pending = [] if pending is not None else None
                await data(self._piece(delta, scored) if isinstance(delta, str) else self._chunk(delta, scored=scored))
            if isinstance(event, Finished):
                await data(self._closing(schema.finish_reason(event.finish_reason, self.calls > 0)))
                if self.request.include_usage:
                    await data(self._usage_chunk(schema.usage(first, event.stats)))
                break
        await data(b"[DONE]")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _send_json(send, status: int, body: dict, extra: list | None = None) -> None:
        payload = _json(body)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        if status == 503:  # busy: as guard.error_response, a hint when to try again
            headers.append((b"retry-after", schema.RETRY_AFTER.encode()))
        headers += extra or []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload, "more_body": False})


TRUNCATED_HEADER = b"x-chatcli-truncated-turns"


def _truncated(first: Prefilled) -> list:
    """The header that says how many earlier exchanges were dropped to fit the context (always sent)."""
    return [(TRUNCATED_HEADER, str(first.truncated_turns).encode())]
