"""Messages the worker threads post to the chat screen (thread-safe `post_message`).

The threads never touch widgets: they post these, and the screen's handlers, on the
event loop, update the widgets.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message


@dataclass
class LoadStatus(Message):
    text: str
    done: int | None = None  # steps of a long one (a first conversion), where it says
    total: int | None = None

    def line(self) -> str:
        return f"{self.text} ({self.done}/{self.total})" if self.total else self.text


@dataclass
class EngineReady(Message):
    engine: object


@dataclass
class LoadFailed(Message):
    error: str


@dataclass
class TurnEvent(Message):
    """One engine event (`Prefilled`, `Token` or `Finished`) of turn `turn`, with the cache's state after it."""

    turn: int
    event: object
    context_tokens: int | None  # None: the engine's cache is a server's (known when the turn ends)
    kv_cache_bytes: int | None


class EventsWaiting(Message):
    """The chat screen's `Inbox` holds turn events (`TurnEvent`s): take them all."""


@dataclass
class TurnFailed(Message):
    turn: int
    error: str


@dataclass
class CacheNotSaved(Message):
    """A turn's KV cache could not be written beside its conversation (a full disk, say)."""

    reason: str


@dataclass
class ToolsReady(Message):
    """The --mcp servers started (`hub`, chat.mcp.Hub), but those in `failed` (one line each)."""

    hub: object
    failed: list[str]


@dataclass
class ModelLoaded(Message):
    """`/model NAME` loaded another engine (or failed to: `error`); the old one answers until then."""

    name: str
    engine: object | None
    error: str | None = None
