"""The screen a conversation is shown on, and switched from: its layout, the sidebar, and
opening, switching, deleting conversations through `Chats`.

`ChatScreen` (`chat.py`) builds on it with what a turn needs (sending, streaming, stopping) and
the engine's arrival (`loading.py`); this class calls nothing of them: `busy` and `queue` are the
only turn state it reads, to refuse a switch while a reply streams or prompts wait. Most of
`SlashTarget` (what a slash command may do) is here: notes, the app's clipboard, screens, theme
and config.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.screen import Screen

from chatcli.chat.conversation import Conversation
from chatcli.chat.manager import Chats, ChatsError
from chatcli.chat.saved import NoSuchConversation
from chatcli.engine import TurnStats
from chatcli.errors import one_line
from chatcli.ui.format import (
    Listing,
    human_bytes,
    listing_lines,
    reply_note,
    sampling_parts,
)
from chatcli.ui.persist import PromptHistory
from chatcli.ui.screens.sidebar_keys import SidebarKeys
from chatcli.ui.widgets.chat_pane import ChatPane, LoadingLine, UserMessage
from chatcli.ui.widgets.info_bar import InfoBar, engine_parts
from chatcli.ui.widgets.keybar import KeyBar
from chatcli.ui.widgets.panels import StatsPanel
from chatcli.ui.widgets.prompt import PromptInput
from chatcli.ui.widgets.sidebar import Sidebar
from chatcli.ui.widgets.tokens import TokenInspector

if TYPE_CHECKING:
    from chatcli.config import Config

NARROW_BELOW = 100  # columns: below, the panels fold to a one-line status bar (F2 unfolds them)
SHORT_BELOW = 20  # rows: below, the prompt has no border and the footer goes (the chat keeps its lines)
START_HINT = (
    "Type a message and press Enter. /help lists the commands · F3 your saved conversations · "
    "/file PATH attaches a file · Ctrl+Q quits"
)
BUSY_SWITCH = "a reply is streaming: press Esc to stop it before leaving this conversation"
QUEUED_SWITCH = "prompts are waiting to be sent: press Esc to drop them before leaving this conversation"


def file_stamp(path: Path | None) -> tuple[int, int] | None:
    """(mtime in ns, size) of the file at `path`; None where there is none."""
    try:
        st = path.stat()
    except (OSError, AttributeError):
        return None
    return st.st_mtime_ns, st.st_size


def saved_stats(stats: dict | None) -> TurnStats | None:
    return TurnStats.from_dict(stats) if stats else None


class ConversationScreen(SidebarKeys, Screen):
    """Its actions (panels, sidebar, new, scrolling) are bound to keys by `ChatScreen`."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]  # narrow: panels start hidden
    VERTICAL_BREAKPOINTS = [(0, "-short"), (SHORT_BELOW, "-tall")]
    DEFAULT_CSS = """
    ConversationScreen.-short KeyBar { display: none; }
    ConversationScreen.-short ChatPane { padding-bottom: 0; }
    ConversationScreen.-short PromptInput, ConversationScreen.-short PromptInput:focus {  /* themes/: theirs too */
        border: none; min-height: 1; padding: 0 1; background: $boost;
    }
    """
    # Focus goes to the prompt as soon as the screen is composed (Textual's default, the first
    # focusable widget, was the hidden sidebar's list: its styles were not applied yet).
    AUTO_FOCUS = "#prompt"

    def __init__(
        self,
        params,
        system: str | None = None,
        history: PromptHistory | None = None,
        store=None,
        resume: tuple[bool, str | None] = (False, None),
        budget: int | None = None,
        system_given: bool = False,
    ) -> None:
        super().__init__()
        self.params = params
        self.engine = None
        self.session = None
        self.default_system = system or None
        self.conversation = Conversation(system=self.default_system)
        self.chats = Chats(store, budget, on_store_failed=self._store_failed, on_store_damaged=self._store_damaged)
        self.chats.opening(None, self.conversation)
        self.resume = resume  # (-c, --conversation ID)
        self.system_given = system_given  # --system overrides a reopened conversation's
        self.history = history if history is not None else PromptHistory()
        self.load_error: str | None = None
        self.busy = False  # a reply is streaming
        self.queue: list[UserMessage] = []  # prompts sent while the model loads or a reply streams
        self.last_stats: TurnStats | None = None
        self.loading_line: LoadingLine | None = None
        self.switching: str | None = None  # the model /model is loading
        self.load_status = "Loading the model…"  # the latest LoadStatus (one may come before on_mount)
        self.pane = ChatPane()
        self.panels = StatsPanel()
        self.tokens = TokenInspector(id="tokens")
        self.tokens.display = False
        self.prompt = PromptInput(self.history, choices=self.argument_choices, id="prompt")
        self.attachments: list = []  # chat.attach.Attachment: the files /file attached to the next message
        self.info = InfoBar()
        self.sidebar = Sidebar()
        self._config_stamp: tuple[int, int] | None = None  # the config file's when read (file_stamp)

    def compose(self) -> ComposeResult:
        yield self.info
        with Horizontal(id="main"):
            yield self.sidebar
            yield self.pane
            yield self.panels
        yield self.tokens
        yield self.panels.status
        yield self.prompt
        yield KeyBar()

    async def on_mount(self) -> None:
        self._config_stamp = file_stamp(self._config_file())  # as read at start: a change reads it again
        await self.open_at_start()
        if not self.conversation.messages:  # an empty first screen says how to start
            self.note(START_HINT)
        if self.engine is None and self.load_error is None:
            self.loading_line = LoadingLine(self.load_status)
            self.pane.mount(self.loading_line)
        self.refresh_info()
        self.prompt.focus()

    def note(self, text: str, error: bool = False) -> None:
        self.pane.add_note(text, error=error)

    def listing(self, rows: list[tuple[str, str]], tail: str = "", min_text: int = 24) -> None:
        text = "\n".join(listing_lines(rows) + (["", tail] if tail else []))
        self.pane.add_note(text, drawn=Listing(rows, tail, min_text))

    def notice(self, text: str, title: str) -> None:
        self.app.notify(text, title=title, timeout=6)

    def copy_text(self, text: str, what: str) -> None:
        self.app.copy_to_clipboard(text)  # through the terminal (OSC 52: works over ssh too)
        self.app.notify(f"Copied {what}: {len(text)} characters.", title="Copied", timeout=3)

    def open_screen(self, screen: Screen, answered) -> None:
        self.app.push_screen(screen, answered)

    def quit_app(self) -> None:
        self.app.action_quit_clean()

    # -- settings ------------------------------------------------------------------

    @property
    def config(self) -> Config:
        """The config file's values (its presets): read again where the file changed since they were
        read (a [presets.NAME] added while chatcli runs); a changed file that does not read keeps the
        values before, and says why once."""
        from chatcli.config import ConfigError, load_config

        config = self.app.start.config
        path = self._config_file()
        stamp = file_stamp(path)
        if stamp == self._config_stamp:
            return config
        self._config_stamp = stamp
        try:
            config = self.app.start.config = load_config(path)
        except ConfigError as exc:
            self.note(f"The config file changed but does not read, so its values before stay: {exc}", error=True)
        return config

    def _config_file(self) -> Path:
        from chatcli.config import config_path

        return self.app.start.config.path or config_path()

    @property
    def chat_theme(self) -> str:
        return self.app.chat_theme

    def theme_names(self) -> list[str]:
        return self.app.theme_names()

    def argument_choices(self, command: str) -> list[str]:
        """What Tab offers after /theme, /preset and /model (the models on disk and the catalogue's; paths,
        after /file, /load, /save and /model: commands.py)."""
        from chatcli.engine import model_names

        models = list if self.remote else model_names  # a server's models are its own
        return {"theme": self.theme_names, "preset": lambda: sorted(self.config.presets), "model": models}.get(
            command, list
        )()

    def set_theme(self, name: str) -> str | None:
        return self.app.set_chat_theme(name, remember=True)

    def set_params(self, params) -> None:
        self.params = params
        self.refresh_info()  # the header shows them

    def _store_failed(self, exc: BaseException) -> None:
        self.app.notify(
            f"{one_line(exc)}. Conversations are not saved from now on.",
            title="Not saved",
            severity="error",
            timeout=10,
        )

    def _store_damaged(self, line: str) -> None:
        self.app.notify(line, title="Damaged database", severity="warning", timeout=20)

    @property
    def remote(self) -> bool:
        """The engine is (to be) a server's: `--api` or the config's `api`."""
        return bool(getattr(self.app.start, "api", None))

    def refresh_info(self) -> None:
        if self.engine is not None:
            head = engine_parts(self.engine)
        else:
            failed = "no server" if self.remote else "model failed to load"
            head = [(failed if self.load_error else ("connecting…" if self.remote else "loading…"), 0)]
        self.info.show([head, sampling_parts(self.params)])

    # -- the conversation on screen ---------------------------------------------

    def crop_cache(self) -> int:
        """Crop the session's cache to what the (shorter) conversation still shares with it."""
        if self.session is None or self.engine is None:
            return 0
        kept = self.engine.crop_session(self.session, self.conversation.for_template())
        self.show_cache()
        self.show_pool()
        return kept

    def show_cache(self) -> None:
        """The context gauge and the KV cache row as the session's cache stands now (a switch, a
        crop, a new model)."""
        if self.session is None or self.engine is None:
            return
        cache = self.session.cache
        self.panels.set_context(len(cache), self.engine.context_limit)
        if self.engine.keeps_cache:
            self.panels.show(kv=human_bytes(cache.nbytes) if len(cache) else "–")

    async def forget(self, messages: list) -> None:
        """The conversation's last `messages` (already dropped from it) leave the screen and the store."""
        doomed = [w for w in self.pane.children if any(getattr(w, "message", None) is m for m in messages)]
        if any(w in self.pane.shelved for w in doomed):  # what stays below them moves up: measured again
            self.pane.unshelve()
        for widget in doomed:
            await widget.remove()
        self.chats.forget_last(self.conversation, len(messages))

    async def show_conversation(self, conv: Conversation) -> None:
        """Make `conv` the current conversation: its messages on screen, its session ready."""
        self.chats.opening(self.conversation, conv)
        self.conversation = conv
        self.session = self.chats.session_for(conv) if self.chats.pool is not None else None
        await self.pane.remove_children()
        if self.loading_line is not None:  # still loading: keep showing it
            self.loading_line = LoadingLine(self.load_status)
            self.pane.mount(self.loading_line)
        for n, m in enumerate(conv.messages, 1):  # numbered as /copy N and /edit N take them
            if m.role == "user":
                self.pane.add_user(m.content).number(n).message = m
            elif m.role == "tool":  # under the call it answers
                call = conv.call_of(m) or {"name": (m.tool_call or {}).get("name", "?"), "arguments": "{}"}
                self.pane.add_tool_call(call).show(m)
            else:
                note = reply_note(m.finish_reason, saved_stats(m.stats))
                self.pane.add_saved_reply(m.content, note, n).message = m
        self.panels.reset()
        self.show_turns()
        self.tokens.show_turn([], False)  # the inspector showed another conversation's turn
        self.last_stats = next((saved_stats(m.stats) for m in reversed(conv.messages) if m.stats), None)
        self.show_cache()
        self.refresh_pool()
        self.refresh_sidebar()
        was = self.chats.saved_model(conv)
        if self.engine is not None and was and was != getattr(self.engine, "name", was):
            self.note(f"This conversation was with {was}; {self.engine.name} answers now (/model {was} to switch).")
        self.pane.follow()
        self.pane.settle()
        self.prompt.focus()  # the next thing typed is the prompt, wherever the focus was

    def refuse_switch(self) -> bool:
        """True (and an inline note saying why) while leaving this conversation would lose a
        streaming reply or the prompts waiting for it."""
        reason = BUSY_SWITCH if self.busy else QUEUED_SWITCH if self.queue else None
        if reason:
            self.note(reason, error=True)
        return reason is not None

    async def switch_to(self, number: int) -> None:
        if self.refuse_switch():
            return
        try:
            conv = self.chats.numbered(number)
        except ChatsError as exc:
            self.note(str(exc), error=True)
            return
        if conv.id == self.conversation.id:
            self.note(f"already in conversation {number}: {conv.title}")
            return
        await self.show_conversation(conv)
        self.note(f"conversation {number}: {conv.title}")

    async def open_hit(self, conversation_id: str, index: int) -> None:
        """A search hit: its conversation on screen, scrolled to message `index` (highlighted)."""
        if conversation_id != self.conversation.id:
            if self.refuse_switch():
                return
            try:
                conv = self.chats.by_id(conversation_id)
            except ChatsError as exc:
                self.note(str(exc), error=True)
                return
            await self.show_conversation(conv)
        messages = self.conversation.messages
        if not 0 <= index < len(messages):
            return
        target = messages[index]
        for widget in self.pane.children:
            widget.remove_class("-hit")
            if getattr(widget, "message", None) is target:
                widget.add_class("-hit")
                self.pane.anchor(False)  # stay at the hit, not the bottom
                if widget in self.pane.shelved:  # hidden: shown again, then scrolled to once laid out
                    self.pane.unshelve()
                    self.pane.call_after_refresh(self.pane.scroll_to_widget, widget, animate=False, top=True)
                else:
                    self.pane.scroll_to_widget(widget, animate=False, top=True)

    async def new_conversation(self, system: str | None) -> bool:
        if self.refuse_switch():
            return False
        await self.show_conversation(Conversation(system=system))
        return True

    async def action_new_conversation(self) -> None:
        if await self.new_conversation(self.default_system):
            self.note("new conversation")

    async def open_at_start(self) -> None:
        """`-c` / `--conversation ID`: reopen a saved conversation instead of a new one."""
        continue_last, wanted = self.resume
        if not (continue_last or wanted):
            self.refresh_sidebar()
            return
        try:
            conv = self.chats.reopen(continue_last, wanted, self.default_system if self.system_given else None)
        except (ChatsError, NoSuchConversation) as exc:
            self.note(str(exc), error=True)
            self.refresh_sidebar()
            return
        if conv is not None:
            await self.show_conversation(conv)
            self.note(f"continuing: {conv.title} ({len(conv.messages)} messages)")

    async def delete_current(self) -> None:
        title = self.conversation.title
        self.chats.delete(self.conversation)
        await self.show_conversation(Conversation(system=self.default_system))
        self.note(f"deleted: {title}")
