"""The chat pane: user messages, streamed Markdown replies, inline notes; follows the stream.

What a model, a tool, a server or a saved message wrote is shown with its control characters
written out (`errors.shown`: `\\x1b`): Textual passes ESC and the C1 controls through to the
terminal (it drops only BEL, BS, VT, FF and CR), where an escape sequence would act. The
conversation keeps the text exact."""

from __future__ import annotations

from functools import cache
from itertools import takewhile

from markdown_it import MarkdownIt
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Collapsible, LoadingIndicator, Markdown, Static
from textual.widgets._markdown import MarkdownFence

from chatcli.chat.reasoning import THINKING, ReasoningStream
from chatcli.chat.reasoning import split as split_reasoning
from chatcli.errors import shown
from chatcli.ui.widgets.shelf import Shelves
from chatcli.ui.widgets.tool_call import ToolCallBox


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage { margin: 1 1 0 0; padding: 0 1; background: $primary 10%; border-left: outer $primary; }
    UserMessage.-queued { text-style: dim; }
    UserMessage.-hit { border-left: outer $accent; background: $accent 20%; }
    """

    def __init__(self, text: str, queued: bool = False) -> None:
        super().__init__(shown(text), markup=False, classes="-queued" if queued else "")
        self.text = text
        self.message = None  # the conversation's Message, once its turn has started

    def number(self, n: int) -> UserMessage:
        """Show its place in the conversation (what /copy N and /edit N take), once it has one."""
        self.update(Text.assemble((f"#{n} ", "dim"), shown(self.text)))
        return self


class ReplyFence(MarkdownFence):
    """A code block; one that names no language is plain text. Textual would guess it with pygments'
    `guess_lexer` (every lexer's analysis, its modules imported on first use): 0.4 s of the UI thread
    for each draw of such a block while it streams, 1.1 s the first time."""

    @classmethod
    def highlight(cls, code: str, language: str, ansi: bool = False, dark: bool = False):
        return super().highlight(code, language or "text", ansi=ansi, dark=dark)


@cache
def reply_parser() -> MarkdownIt:
    """The one Markdown parser of every reply (the UI thread's): Textual's Markdown makes a new one at each
    append of a stream unless given a factory, 0.4 ms of its rules set up again each time."""
    return MarkdownIt("gfm-like")


class ReplyMarkdown(Markdown):
    """The reply's Markdown; counts its appends (each one is a re-parse of the tail and a re-render)."""

    # A code block's long lines scroll sideways, never wrapped mid-token (`print(reverse_string("Hell` /
    # `o World"))`): Textual's fence scrolls without a scrollbar, so one shows where a line is cut at
    # the pane's edge (Shift+wheel or a drag scrolls it; /copy code copies the whole block).
    DEFAULT_CSS = """
    ReplyMarkdown { margin: 0; padding: 0 1; background: transparent; }
    ReplyMarkdown MarkdownFence { overflow-x: auto; scrollbar-size-horizontal: 1; }
    """

    BLOCKS = {**Markdown.BLOCKS, "fence": ReplyFence, "code_block": ReplyFence}

    def __init__(self, markdown: str = "") -> None:
        super().__init__(markdown, parser_factory=reply_parser)
        self.appends = 0

    def append(self, markdown: str):
        self.appends += 1
        return super().append(markdown)


class ReplyBox(Vertical):
    """One assistant reply: its reasoning (`<think>…</think>`, folded, shown where there is some),
    its Markdown, then a one-line note (stopped, length, stats)."""

    DEFAULT_CSS = """
    ReplyBox { height: auto; margin: 1 1 0 0; border-left: outer $secondary 50%; }
    ReplyBox.-hit { border-left: outer $accent; background: $accent 10%; }
    ReplyBox .reply-note { padding: 0 1; height: auto; color: $text-muted; }
    ReplyBox Collapsible { border-top: none; padding: 0; margin: 0 1; background: transparent; }
    ReplyBox Collapsible ReplyMarkdown { color: $text-muted; }
    """

    def __init__(self, text: str = "") -> None:
        super().__init__()
        self.message = None  # the conversation's Message, once finished
        thinking, answer = split_reasoning(text)
        self.thinking = ReplyMarkdown(shown(thinking or ""))
        # The fold only where there is reasoning: made for every reply, its four widgets were composed and laid
        # out during each turn's prefill, on the cores the kernel wanted.
        self.fold: Collapsible | None = self._fold(_thought_title(thinking)) if thinking else None
        self.markdown = ReplyMarkdown(shown(answer))
        self.note = Static("", classes="reply-note", markup=False)
        self.stream = None
        self.mounting = None  # the pane's AwaitMount of this box: the first write waits for it
        self.blocks = Shelves(self.markdown)  # its Markdown's blocks far above the view (`ChatPane.reshelve`)
        self._thinking_stream = None
        self._reasoning = ReasoningStream()
        self._thought = ""

    def _fold(self, title: str) -> Collapsible:
        return Collapsible(self.thinking, title=title, collapsed=True)

    def compose(self) -> ComposeResult:
        if self.fold is not None:
            yield self.fold
        yield self.markdown
        yield self.note

    def start_stream(self, thinking: bool = False):
        """`thinking`: the prompt opened a `<think>` block, so the reply starts in its reasoning."""
        self._reasoning = ReasoningStream(thinking)
        self.stream = Markdown.get_stream(self.markdown)
        return self.stream

    async def write(self, text: str) -> None:
        if self.stream is not None and text:
            await self.mounted()
            await self._route(self._reasoning.push(text))

    async def mounted(self) -> None:
        """Once the box is mounted: a stream into a Markdown not yet mounted (a busy machine: the first tick came
        first) lost its text, and a turn's generation starts after the box is in place (`ChatScreen.begin_turn`)."""
        if self.mounting is not None:
            await self.mounting
            self.mounting = None

    async def _route(self, pieces) -> None:
        for kind, piece in pieces:
            if kind == THINKING:
                if self._thinking_stream is None:
                    if self.fold is None:
                        self.fold = self._fold("Thinking…")
                        await self.mount(self.fold, before=self.markdown)
                    else:
                        self.fold.title = "Thinking…"
                    self._thinking_stream = Markdown.get_stream(self.thinking)
                self._thought += piece
                await self._thinking_stream.write(shown(piece))
            else:
                await self.stream.write(shown(piece))

    async def end_stream(self) -> None:
        if self.stream is not None:
            await self.mounted()
            await self._route(self._reasoning.finish())
            if self._thinking_stream is not None:  # (its fold made with it)
                await self._thinking_stream.stop()
                self._thinking_stream = None
                self.fold.title = _thought_title(self._thought)
            await self.stream.stop()
            self.stream = None

    @property
    def has_reasoning(self) -> bool:
        return self.fold is not None

    def set_note(self, text: str, number: int | None = None) -> None:
        """The line under the reply, after its place in the conversation (`number`, once it has one)."""
        self.note.update(shown(" · ".join(part for part in (f"#{number}" if number else "", text) if part)))


def _settled(widget) -> bool:
    """Nothing more will change its height: not a reply still streaming or mounting."""
    return getattr(widget, "stream", None) is None and getattr(widget, "mounting", None) is None


def _thought_title(text: str) -> str:
    return f"Thought for {len(text.split())} words (click or F8 to show)"


class Note(Static):
    """An inline line from the app: a confirmation, a listing, or an error (class -error)."""

    DEFAULT_CSS = """
    Note { margin: 1 1 0 0; padding: 0 1; }
    Note.-error { color: $error; }
    """

    def __init__(self, text: str, error: bool = False, drawn=None) -> None:
        """`drawn`: a rich renderable that draws `text` (a listing's columns, its texts escaped as `shown`
        does), instead of the text."""
        super().__init__(shown(text) if drawn is None else drawn, markup=False, classes="-error" if error else "")
        self.text = text


class LoadingLine(Horizontal):
    DEFAULT_CSS = """
    LoadingLine { height: auto; margin: 1 1 0 0; }
    LoadingLine LoadingIndicator { width: 8; height: 1; }
    LoadingLine Static { width: 1fr; height: auto; }
    """

    def __init__(self, text: str) -> None:
        super().__init__()
        self.status = Static(shown(text), markup=False)

    def compose(self) -> ComposeResult:
        yield LoadingIndicator()
        yield self.status


class ChatPane(VerticalScroll):
    """The conversation, scrolled. What lies further above the view than SHELF_SCREENS screens is shelved
    (`widgets/shelf.py`): the messages there, and the Markdown blocks there of the first reply shown. Each
    frame lays out and composes every widget on the screen, and a finished reply keeps a widget a block, so
    without it a long chat's frames cost more each turn; with it they cost what lies near the view. What is
    shelved comes back before it scrolls near the view, and all of it when the width changes (the heights
    with it) or a message is jumped to (`unshelve`)."""

    DEFAULT_CSS = "ChatPane { width: 1fr; height: 1fr; padding: 0 1 1 1; }"
    can_focus = False
    SHELF_SCREENS = 2
    KEEP_LAST = 2  # the newest messages are never shelved (the turn's question and its reply)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.messages = Shelves(self)
        self._checked_at: float | None = None  # scroll_y at the last `reshelve`
        self._width = 0

    @property
    def shelved(self) -> list:
        """The messages hidden, in order."""
        return self.messages.hidden

    def on_mount(self) -> None:
        self.anchor()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        """The user's scrolling (the anchor's, which follows the stream, does not come here: `settle`)."""
        super().watch_scroll_y(old_value, new_value)
        if self._checked_at is None or abs(new_value - self._checked_at) >= max(1, self.size.height // 2):
            self._checked_at = new_value  # (and at the reshelve)
            self.call_later(self.reshelve)  # not inside the watcher: it changes the layout

    def on_resize(self) -> None:
        if self.size.width != self._width:
            self._width = self.size.width
            self.unshelve()
            self.call_after_refresh(self.reshelve)

    def settle(self) -> None:
        """`reshelve` once the layout is done (a turn's start and end, a conversation opened)."""
        self.call_after_refresh(self.reshelve)

    def unshelve(self) -> None:
        """Every message and block back in the layout (before a jump to one, a removal, a new width)."""
        for box in self.query_children(ReplyBox):
            box.blocks.cut(0)
        self.messages.cut(0)

    def reshelve(self) -> None:
        """Shelve what lies far above the view, from the first message on; bring back what is near it."""
        if not self.is_attached:  # a call after a refresh that came once the pane was gone (the app closing)
            return
        messages = self.messages.items()
        self._checked_at = self.scroll_y
        top = self.scroll_y - self.SHELF_SCREENS * self.size.height
        older = messages[: max(0, len(messages) - self.KEEP_LAST)]
        cut = self.messages.above(takewhile(_settled, older), top)
        self.messages.cut(cut)
        for n, box in enumerate(older[cut:]):  # the first reply shown may reach far above the view
            if isinstance(box, ReplyBox):
                box.blocks.cut(self._blocks_above(box, top) if n == 0 and _settled(box) else 0)

    def _blocks_above(self, box: ReplyBox, top: int) -> int:
        """How many of the box's first Markdown blocks end above `top` (in the pane's virtual space)."""
        region, markdown = box.virtual_region, box.markdown
        if not region or not markdown.region:
            return 0
        at = region.y + markdown.region.y - box.region.y  # the Markdown's top in the pane's virtual space
        return box.blocks.above(box.blocks.items(), top - at)

    def follow(self) -> None:
        """Stick to the bottom again (a new turn, End): the anchor lets go when the user scrolls up."""
        self.anchor()

    def page(self, direction: int) -> None:
        """PgUp (-1) lets go of the stream; a PgDn (1) that reaches the bottom follows it again, as
        oterm and elia do. (Textual's own page down lets go first and takes the anchor back only
        where the position changes: a PgDn at the bottom, or one landing where the reply had
        grown past, left the view frozen while the reply streamed on.)"""
        if direction < 0:
            self.scroll_page_up(animate=False)
        elif self.scroll_y + self.scrollable_content_region.height >= self.max_scroll_y:
            self.follow()
        else:
            self.scroll_page_down(animate=False)

    def add_user(self, text: str, queued: bool = False) -> UserMessage:
        widget = UserMessage(text, queued)
        self.mount(widget)
        return widget

    def add_reply(self, after=None) -> ReplyBox:
        """A reply's box, under `after` (the message it answers) where that is on screen, else last: a
        /retry's note (a setting changed before it) does not land between a question and its reply."""
        box = ReplyBox()
        box.mounting = self.mount(box, after=after if after is not None and after.parent is self else None)
        return box

    def widget_of(self, message):
        """The widget that shows the conversation's `message` (None: not on screen)."""
        return next((w for w in self.children if message is not None and getattr(w, "message", None) is message), None)

    def add_saved_reply(self, text: str, note: str, number: int) -> ReplyBox:
        """A finished reply of a reopened conversation (rendered once, no stream), message `number`."""
        box = ReplyBox(text)
        box.set_note(note, number)
        self.mount(box)
        return box

    def add_tool_call(self, call: dict) -> ToolCallBox:
        box = ToolCallBox(call)
        self.mount(box)
        return box

    def add_note(self, text: str, error: bool = False, drawn=None) -> Note:
        note = Note(text, error, drawn)
        self.mount(note)
        return note

    def notes(self) -> list[Note]:
        return list(self.query(Note))
