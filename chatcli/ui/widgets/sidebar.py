"""The conversations sidebar (F3): one numbered row per conversation, newest first.

A row shows the title (the rename, else the first user message), when it was last
updated and the model that answered it; `●` marks the conversation on screen and `◆`
those whose KV cache is resident in the pool. Enter or a click posts `Sidebar.Picked`.
The numbers are the ones `/switch N` takes. Each row is two lines, clipped to the list's width
(with or without a scrollbar). A key that types a character, with the list focused, posts
`Sidebar.Typed`: the screen gives it to the prompt (nothing typed is dropped).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from chatcli.chat.manager import Row
from chatcli.errors import clip

TITLE_WIDTH = 26


def when(ts: float | None, now: float | None = None) -> str:
    """A short time: 14:05 today, Dec 02 this year, 2025-12-02 before; 'unsaved' for None."""
    if ts is None:
        return "unsaved"
    now = time.time() if now is None else now
    t, n = time.localtime(ts), time.localtime(now)
    if (t.tm_year, t.tm_yday) == (n.tm_year, n.tm_yday):
        return time.strftime("%H:%M", t)
    return time.strftime("%b %d" if t.tm_year == n.tm_year else "%Y-%m-%d", t)


class Sidebar(Vertical):
    DEFAULT_CSS = """
    Sidebar { dock: left; width: 34; height: 1fr; display: none; background: $panel; border-right: vkey $primary 40%; }
    Sidebar.-open { display: block; }
    Sidebar #sidebar-title { padding: 0 1; text-style: bold; }
    Sidebar OptionList { height: 1fr; background: transparent; }
    """

    @dataclass
    class Picked(Message):
        index: int  # 0-based position in `rows`

    @dataclass
    class Typed(Message):
        character: str  # typed while the list had focus: it belongs in the prompt ("\n": the Enter that sends it)

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[Row] = []
        self.list = OptionList(id="conversations")
        self.current: str | None = None
        self.resident: set[str] = set()
        self._typing = False  # a character went to the prompt since the list was focused

    def compose(self) -> ComposeResult:
        yield Static("Conversations · Ctrl+N new", id="sidebar-title")
        yield self.list

    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    def show_rows(self, rows: list[Row], current: str | None, resident: set[str]) -> None:
        self.rows, self.current, self.resident = rows, current, resident
        # the list's own width where it is laid out (a scrollbar takes some): a row never wraps
        width = self.list.scrollable_content_region.width - 1 if self.list.size.width else TITLE_WIDTH + 3
        width -= 2 if len(rows) > self.list.size.height // 2 else 0  # a scrollbar is about to appear
        options = []
        for i, row in enumerate(rows, 1):
            mark = "●" if row.id == current else ("◆" if row.id in resident else " ")
            # a branch shares its root's first message, so its title: where it parts, #N, tells them apart
            title = f"⑂#{row.fork_at + 1} " if row.branch and row.fork_at is not None else "⑂ " if row.branch else ""
            title += row.title
            line = Text(f"{i:>2}{mark}{clip(title, max(8, width - 3))}\n", style="bold" if row.id == current else "")
            detail = f"╰ {when(row.updated)} · {row.messages} msg"
            if row.model:
                detail += f" · {row.model}"
            line.append(clip(detail, max(8, width)), style="dim")
            options.append(Option(line, id=f"c{i}"))
        self.list.clear_options()
        self.list.add_options(options)
        at = next((i for i, r in enumerate(rows) if r.id == current), None)
        if at is not None:
            self.list.highlighted = at

    def on_resize(self) -> None:
        if self.rows:
            self.show_rows(self.rows, self.current, self.resident)

    def on_key(self, event: events.Key) -> None:
        """A character (a space too) goes to the prompt; so does the Enter after it, which sends what
        was typed rather than opening the highlighted conversation (keys typed fast reach the list
        before the prompt has the focus)."""
        if event.key == "enter" and self._typing:
            event.stop()
            self.post_message(self.Typed("\n"))
        elif event.character and event.character.isprintable():
            event.stop()
            self._typing = True
            self.post_message(self.Typed(event.character))

    def on_descendant_focus(self) -> None:
        self._typing = False  # the list is in use again: Enter picks

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.post_message(self.Picked(event.option_index))
