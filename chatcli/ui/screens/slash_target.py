"""`SlashTarget`: everything a slash command (`slash.py`) may read or do on the chat screen.

`ChatScreen` implements it; the handlers see nothing else of the screen: no widget, no app.
What a command shows, the screen mounts (`note`, the loading line of `load_model`); what it
changes goes through a method, so the screen keeps its header, sidebar and panels right.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from textual.screen import Screen

    from chatcli.chat.conversation import Conversation, Message
    from chatcli.chat.manager import Chats
    from chatcli.chat.toolturn import Toolbox
    from chatcli.config import Config
    from chatcli.engine import ChatEngine, SamplingParams, TurnStats


@runtime_checkable
class SlashTarget(Protocol):
    # -- what a command reads ------------------------------------------------------

    conversation: Conversation  # the open one (a command may set its `system`, then `chats.save_system` it)
    chats: Chats  # the conversations, their store and sessions
    params: SamplingParams  # the sampling values of the next turn (changed through `set_params`)
    engine: ChatEngine | None  # None while the first model loads (or after it failed to)
    load_error: str | None  # why the first model (the --api server) could not be used
    busy: bool  # a reply is streaming
    switching: str | None  # the model /model is loading
    last_stats: TurnStats | None  # the conversation's latest turn
    top_logprobs: int  # alternatives the token inspector records (a command may set it)
    attachments: list  # chat.attach.Attachment: /file's files, sent before the next message (a command adds to it)
    toolbox: Toolbox | None  # the --mcp servers' tools (None: none, or still starting)
    tools_starting: bool

    @property
    def config(self) -> Config: ...  # the config file's values (its presets)

    @property
    def remote(self) -> bool: ...  # the engine is (to be) an --api server's

    @property
    def chat_theme(self) -> str: ...

    def theme_names(self) -> list[str]: ...

    # -- what a command shows ------------------------------------------------------

    def note(self, text: str, error: bool = False) -> None:
        """An inline line in the chat: a confirmation, a listing, or an error."""

    def listing(self, rows: list[tuple[str, str]], tail: str = "", min_text: int = 24) -> None:
        """An inline listing of (label, text) rows, each text beside its label and wrapped under itself
        (under its label where that leaves the texts under `min_text` columns); `tail`: a paragraph after them."""

    def notice(self, text: str, title: str) -> None:
        """A short notice beside the chat that passes (it takes no place in the conversation)."""

    def copy_text(self, text: str, what: str) -> None:
        """`text` to the clipboard, and a short notice saying what was copied."""

    def open_screen(self, screen: Screen, answered: Callable[[Any], Awaitable[None]]) -> None:
        """A modal screen (a search's results, a question); `answered` gets what it returns."""

    # -- what a command changes ----------------------------------------------------

    def set_params(self, params: SamplingParams) -> None: ...

    def set_theme(self, name: str) -> str | None:
        """Switch (and remember) the theme; an error line where there is none of that name."""

    def load_model(self, name: str) -> None:
        """Load another model in the background (a loading line shows meanwhile)."""

    def begin_turn(self) -> None:
        """A reply to the conversation as it stands (its last message is the user's)."""

    async def forget(self, messages: list[Message]) -> None:
        """Take the conversation's last `messages`, already dropped from it, off the screen and the store."""

    def crop_cache(self) -> int: ...

    def drop_queue(self) -> None: ...

    def start_edit(self, number: int | None) -> None: ...

    def refuse_switch(self) -> bool:
        """True (and a note why) where leaving the conversation now would lose a reply or queued prompts."""

    async def new_conversation(self, system: str | None) -> bool: ...

    async def action_new_conversation(self) -> None: ...

    async def switch_to(self, number: int) -> None: ...

    async def show_conversation(self, conv: Conversation) -> None: ...

    async def open_hit(self, conversation_id: str, index: int) -> None: ...

    async def delete_current(self) -> None: ...

    def refresh_sidebar(self) -> None: ...

    def action_toggle_tokens(self) -> None: ...

    def quit_app(self) -> None: ...
