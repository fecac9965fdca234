"""What a chat engine is to a front end: the events of one turn and the protocol it answers to.

Torch-free and UI-free. A turn is `generate(messages, session, params, cancel)`, a generator
that yields `Prefilled` once, a `Token` per sampled token, and `Finished` last (with the reply,
why it ended and its `TurnStats`). The TUI, the one-shot, the server and the tests' fake engine
all speak only this; `chatcli.engine.engine.Engine` is the in-process implementation.
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


@dataclass
class Prefilled:
    prompt_tokens: int
    cached_tokens: int  # of the prompt's tokens, the ones reused from the KV cache
    prefill_tokens: int  # the rest, computed in this turn's prefill
    prefill_s: float  # submit to the end of prefill
    truncated_turns: int  # earlier exchanges dropped to fit the context


@dataclass
class Token:
    token_id: int  # -1 for the held-back text released at the end of a reply
    text: str  # newly completed text, possibly '' (half a character, or a possible stop string)
    completion_tokens: int
    decode_tok_s: float  # running rate over this reply, tokens after the first
    elapsed_s: float  # submit to this token: the first token's is the turn's TTFT (`TurnStats.ttft_s`)


@dataclass
class Finished:
    reply: str
    finish_reason: FinishReason
    stats: TurnStats


Event = Prefilled | Token | Finished


@runtime_checkable
class ChatEngine(Protocol):
    """What the front ends need from an engine (the in-process `Engine`, the tests' fake)."""

    name: str

    @property
    def context_limit(self) -> int: ...

    def new_session(self): ...

    def lookup_for(self, params: SamplingParams) -> int: ...

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
