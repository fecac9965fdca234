"""One streamed reply of an OpenAI-compatible server as its chunks arrive (`RemoteEngine`'s turn): the
events it makes — `Prefilled` before the first text, a `Token` per token — the text so far, the usage,
how it ended.

A chunk's text comes as one Token, or, where the chunk carries logprobs (`SamplingParams.logprobs`:
OpenAI's `logprobs.content[]`), as one Token per entry with its logprob and alternatives, the texts
of a server's tokens standing for their ids (`Token.top_texts`): each Token's text is its entry's
where the entries spell the chunk's text, else (a character cut between tokens) the chunk's text
comes with its last. Tool-call parts are put together (`CallParts`) and come out as one Token of
their text. Past what `max_tokens` allows (`remote_wire.reply_cap`: events and tokens, characters)
the turn is `over`: the engine stops reading, `length`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from chatcli.engine import remote_wire as wire
from chatcli.engine.events import Event, FinishReason, Prefilled, Token
from chatcli.engine.remote_tools import CallParts


class StreamedTurn:
    """One streamed reply as its chunks arrive: the text, the usage, how it ended; `over` once the
    server has sent more than `max_tokens` allows (`reply_cap`): the engine stops reading, `length`."""

    def __init__(self, t_submit: float, max_tokens: int) -> None:
        self.t_submit = t_submit
        self.t_first: float | None = None
        self.reply: list[str] = []
        self.calls = CallParts()
        self.chunks = 0
        self.usage = wire.Usage()
        self.reason = FinishReason.LENGTH  # a stream that ends without saying why ran out
        self.error: str | None = None
        self.events, self.size = 0, 0
        self.cap = wire.reply_cap(max_tokens)

    @property
    def started(self) -> bool:
        return self.t_first is not None

    @property
    def over(self) -> bool:
        return self.events > self.cap[0] or self.size > self.cap[1]

    def fail(self, error: str) -> None:
        self.reason, self.error = FinishReason.ERROR, error

    def take(self, data: str) -> Iterator[Event]:
        """The events of one `data:` line: Prefilled before the first text, its Tokens (`_tokens`)."""
        try:
            chunk = wire.parse_chunk(data)
        except wire.WireError as exc:
            self.fail(f"a malformed event from the server: {exc}")
            return
        if chunk.error is not None:
            self.fail(f"the server stopped: {chunk.error}")
            return
        tokens = max(1, sum(len(c.scored) for c in chunk.choices))  # an event a token, or its entries
        self.events, self.size = self.events + tokens, self.size + chunk.size
        if self.over:  # the reply ran past max_tokens: what came before is kept
            self.reason = FinishReason.LENGTH
            return
        self.usage = chunk.usage or self.usage
        for choice in chunk.choices:
            text, parts = choice.text, choice.tool_calls
            if text or parts or choice.scored:
                if self.t_first is None:
                    self.t_first = time.perf_counter()
                    yield Prefilled(None, None, None, self.t_first - self.t_submit, 0)
                self.calls.take(parts)
            if text or choice.scored:
                yield from self._tokens(text, choice.scored)
            elif parts:
                self.chunks += 1
            if choice.finish_reason:  # "tool_calls" too: STOP, as the in-process engine's reply of calls
                self.reason = FinishReason.LENGTH if choice.finish_reason == "length" else FinishReason.STOP
                yield from self.calls_out()

    def calls_out(self) -> Iterator[Token]:
        """The calls put together so far, as one Token of their text (Hermes blocks)."""
        text = self.calls.render(after_text=bool(self.reply))
        if text:
            yield self._token(text)

    def _tokens(self, text: str, scored: list[wire.Scored]) -> Iterator[Token]:
        """A chunk's text as one Token, or one per logprobs entry (each its own text where they spell
        the chunk's, else the chunk's text with the last)."""
        if not scored:
            self.chunks += 1
            yield self._token(text)
            return
        texts = [entry.token for entry in scored]
        if "".join(texts) != text:  # a character cut between tokens (the entries' texts say U+FFFD)
            texts = [""] * (len(scored) - 1) + [text]
        for entry, piece in zip(scored, texts, strict=True):
            self.chunks += 1
            yield self._token(piece, entry)

    def _token(self, text: str, scored: wire.Scored | None = None) -> Token:
        now = time.perf_counter()
        self.reply.append(text)
        rate = (self.chunks - 1) / (now - self.t_first) if now > self.t_first else 0.0
        token = Token(-1, text, self.chunks, rate, now - self.t_submit)
        if scored is not None:
            token.logprob = scored.logprob
            token.top_logprobs = [(-1, logprob) for _text, logprob in scored.top]
            token.top_texts = [text for text, _logprob in scored.top]
        return token
