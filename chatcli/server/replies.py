"""A reply in parts, for the APIs that answer in blocks rather than in chat.completion's text and calls
(Anthropic's Messages, Ollama's chat, OpenAI's Responses): its reasoning (what a reasoning model writes
in `<think>…</think>`, told apart as `chatcli.chat.reasoning` does), its text, and its tool calls (read
in the model's own call syntax, `CallScanner`), as they stream (`ReplyParts`) or whole (`Whole`).

`PeerResponse` is the base of those APIs' responses: the same job, worker, slots, prefix cache, grammar
and tools as chat completions (`respond.CompletionResponse`, whose `__call__` it keeps), its errors in the
API's shape (`peers.error_body` of its `path`), its whole reply built by the subclass from a `Whole`
(`_body`) and its stream written by the subclass from the parts as they come (`_items`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from chatcli.chat.reasoning import OPEN, THINKING, ReasoningStream
from chatcli.engine import Call, CallScanner, Finished, Prefilled, Token
from chatcli.server.peers import error_body
from chatcli.server.respond import CompletionResponse
from chatcli.server.schema import APIError
from chatcli.server.worker import Failed

TEXT, CALL = "text", "call"  # beside THINKING: the kinds of a reply's parts
END, FAILED = "end", "failed"  # the last item of `PeerResponse._items`: the Finished, or the Failed


class ReplyParts:
    """A reply's text, as it streams, → its parts: (THINKING, text), (TEXT, text), (CALL, Call). Calls are
    read only where the request has tools to call (`tools`) and the engine says its syntax; one only where
    parallel calls are not allowed. `opened`: the prompt itself opened the reasoning (`<think>` at its end)."""

    def __init__(self, syntax: str | None, tools=None, opened: bool = False) -> None:
        self.reasoning = ReasoningStream(thinking=opened)
        self.scanner = CallScanner(syntax) if tools is not None and syntax else None
        self.parallel = tools.parallel if tools is not None else True
        self.calls = 0

    def push(self, text: str) -> list[tuple]:
        return self._split(self.reasoning.push(text))

    def finish(self) -> list[tuple]:
        out = self._split(self.reasoning.finish())
        return out + (self._scanned(self.scanner.finish()) if self.scanner is not None else [])

    def _split(self, pieces: list[tuple[str, str]]) -> list[tuple]:
        out: list[tuple] = []
        for kind, text in pieces:
            if kind == THINKING:
                out.append((THINKING, text))
            elif self.scanner is None:
                out.append((TEXT, text))
            else:
                out += self._scanned(self.scanner.push(text))
        return out

    def _scanned(self, pieces: list) -> list[tuple]:
        out: list[tuple] = []
        for piece in pieces:
            if isinstance(piece, str):
                if piece:
                    out.append((TEXT, piece))
            elif self.calls == 0 or self.parallel:
                out.append((CALL, piece))
                self.calls += 1
        return out


@dataclass
class Whole:
    """A whole reply's parts: its reasoning (None where it wrote none), its text, its calls."""

    thinking: str | None = None
    text: str = ""
    calls: list[Call] = field(default_factory=list)

    @classmethod
    def of(cls, parts: list[tuple], reasoned: bool) -> Whole:
        out = cls("" if reasoned else None)
        for kind, value in parts:
            if kind == THINKING:
                out.thinking = (out.thinking or "") + value
            elif kind == TEXT:
                out.text += value
            else:
                out.calls.append(value)
        return out


def prompt_opens_reasoning(tokenizer, first: Prefilled) -> bool:
    """Whether the templated prompt ends inside a reasoning block (`<think>` opened by the template, as
    DeepSeek-R1's and some Qwen3 templates do), so the reply begins as reasoning."""
    if tokenizer is None or not first.ids:
        return False
    return tokenizer.decode(first.ids[-4:], skip_special_tokens=False).rstrip().endswith(OPEN)


class PeerResponse(CompletionResponse):
    """A job answered in another API's shapes; subclasses give `path`, `_body` and `_stream`."""

    path = ""  # a path of the API: its errors' shape (`peers`)

    def _error_body(self, err: APIError) -> dict:
        return error_body(err, self.path)

    def _parts(self, first: Prefilled) -> ReplyParts:
        return ReplyParts(self.syntax, self.tools, prompt_opens_reasoning(self.tokenizer, first))

    def _whole(self, first: Prefilled, done: Finished, scored: list | None) -> dict:
        parts = self._parts(first)
        found = parts.push(done.reply) + parts.finish()
        return self._body(first, done, Whole.of(found, parts.reasoning.saw_reasoning))

    def _body(self, first: Prefilled, done: Finished, whole: Whole) -> dict:
        raise NotImplementedError

    async def _items(self, first: Prefilled, events: asyncio.Queue) -> AsyncIterator[tuple]:
        """The reply's parts as its tokens arrive, then (END, Finished) or (FAILED, APIError)."""
        parts = self._parts(first)
        while True:
            event = await events.get()
            if isinstance(event, Failed):
                yield FAILED, event.error
                return
            if isinstance(event, Token):
                for part in parts.push(event.text):
                    yield part
            elif isinstance(event, Finished):
                for part in parts.finish():
                    yield part
                yield END, event
                return

    @staticmethod
    async def _open(send, media_type: bytes) -> None:
        headers = [(b"content-type", media_type), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

    @staticmethod
    async def _write(send, data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    @staticmethod
    async def _close(send) -> None:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
