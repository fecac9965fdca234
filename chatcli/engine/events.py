"""What a chat engine is to a front end: the events of one turn and the protocol it answers to.

Torch-free and UI-free. A turn is `generate(messages, session, params, cancel)`, a generator
that yields `Prefilled` once, a `Token` per sampled token, and `Finished` last (with the reply,
why it ended and its `TurnStats`). The TUI, the one-shot, the server and the tests' fake engine
all speak only this; `chatcli.engine.engine.Engine` is the in-process implementation and
`chatcli.engine.remote.RemoteEngine` the one over HTTP.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

from chatcli.engine.params import SamplingParams
from chatcli.engine.stats import TurnStats


class FinishReason(StrEnum):
    STOP = "stop"  # an end-of-turn id or a stop string
    LENGTH = "length"  # max_tokens or the context limit
    CANCELLED = "cancelled"  # the caller's cancel event (or Ctrl+C / Esc)
    ERROR = "error"  # a remote stream cut mid-reply (`Finished.error` says how); the text so far is kept


@dataclass
class Prefilled:
    """None where the engine cannot know (a remote server reports its counts at the end, if at all)."""

    prompt_tokens: int | None
    cached_tokens: int | None  # of the prompt's tokens, the ones reused from the KV cache
    prefill_tokens: int | None  # the rest, computed in this turn's prefill
    prefill_s: float  # submit to the end of prefill
    truncated_turns: int  # earlier exchanges dropped to fit the context
    ids: list[int] | None = None  # the prompt's token ids (in-process engines), for the token inspector


@dataclass
class Token:
    token_id: int  # -1 for the held-back text released at the end of a reply, and from a remote engine
    text: str  # newly completed text, possibly '' (half a character, or a possible stop string)
    completion_tokens: int
    decode_tok_s: float  # running rate over this reply, tokens after the first
    elapsed_s: float  # submit to this token: the first token's is the turn's TTFT (`TurnStats.ttft_s`)
    # with `SamplingParams.logprobs`: this id's log p under the distribution it was drawn from, and
    # the most likely alternatives as (id, log p) (see `sampling.token_logprobs`); else None
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    # a server's logprobs (`RemoteEngine`): its tokens have no ids here (-1, in `top_logprobs` too), so
    # a token is named by its `text` (see `remote_turn`) and the alternatives by these texts, in order
    top_texts: list[str] | None = None


@dataclass
class Finished:
    reply: str
    finish_reason: FinishReason
    stats: TurnStats
    error: str | None = None  # with FinishReason.ERROR: what cut the reply, in one line
    stop: str | None = None  # with FinishReason.STOP: the stop string that ended it (None: an end-of-turn id)


Event = Prefilled | Token | Finished


def call_syntax(engine) -> str | None:
    """The syntax `engine`'s replies write tool calls in: the one way to read a reply's calls from either
    engine is `parse_calls(done.reply, call_syntax(engine))` (text outside the calls, and the `Call`s), or
    `CallScanner(call_syntax(engine))` over the Tokens' text as they stream. The in-process engine's is its
    model's (`tokenizer.tool_syntax`); `RemoteEngine.tool_syntax` is HERMES, the blocks it writes the
    server's structured calls as; None: an engine that says neither (the tests' fakes)."""
    own = getattr(engine, "tool_syntax", None)
    return own if own is not None else getattr(getattr(engine, "tokenizer", None), "tool_syntax", None)


@runtime_checkable
class ChatEngine(Protocol):
    """What the front ends need from an engine (the in-process `Engine`, `RemoteEngine`, the tests' fake)."""

    name: str
    keeps_cache: bool  # True: sessions hold the KV cache here (its bytes are shown, and saved)
    backend: str  # what answers, for /backend: "in-process (NativeRunner)", or a server's URL

    @property
    def context_limit(self) -> int: ...  # 0: unknown

    def new_session(self): ...

    def models(self) -> list[str]: ...

    def lookup_for(self, params: SamplingParams) -> int: ...

    def check_params(self, params: SamplingParams) -> None:
        """`InvalidParameter` for a logit bias past the vocabulary; `GrammarError` (one line) where
        replies cannot be held to `params.response_format`."""

    def generate(
        self,
        messages: Sequence[dict],
        session,
        params: SamplingParams | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]: ...

    def crop_session(self, session, messages: Sequence[dict]) -> int: ...

    def save_session(self, session, path: Path) -> bool: ...

    def restore_session(self, session, path: Path) -> bool: ...
