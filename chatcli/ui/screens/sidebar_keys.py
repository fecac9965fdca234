"""What a conversation's screen does beside the conversation itself: the sidebar (its rows, opening it,
a pick), the "Recent turns" and cache pool panels, and the keys that scroll the chat or fold the panels.
`ConversationScreen` builds on it; its attributes (`chats`, `conversation`, `panels`, `pane`, `prompt`,
`sidebar`, `engine`) are the screen's."""

from __future__ import annotations

from textual.actions import SkipAction

from chatcli.engine import TurnStats
from chatcli.ui.format import human_bytes, turn_line
from chatcli.ui.widgets.sidebar import Sidebar


class SidebarKeys:
    # -- the sidebar and the pool panel -------------------------------------------

    def show_turns(self) -> None:
        """ "Recent turns": this conversation's replies, numbered in it, from their saved stats (another
        conversation's turns are its own)."""
        stats = [TurnStats.from_dict(m.stats) for m in self.conversation.messages if m.role == "assistant" and m.stats]
        self.panels.set_turns([turn_line(n, s) for n, s in enumerate(stats, 1)])

    def refresh_pool(self) -> None:
        if self.chats.pool is None:
            return
        self.show_pool()
        self.refresh_sidebar()

    def show_pool(self) -> None:
        """The pool panel's figures (cheap: the screen calls it each tick of a turn, as the cache grows)."""
        pool = self.chats.pool
        if pool is None:
            return
        if self.engine is not None and not self.engine.keeps_cache:  # a server's: its caches are its own
            self.panels.set_pool("on the server", "n/a")
            return
        stats = pool.stats()
        n = stats["sessions"]
        self.panels.set_pool(
            f"{n} conversation{'s' if n != 1 else ''}",
            f"{human_bytes(stats['bytes'])} / {human_bytes(stats['budget_bytes'])}",
        )

    def refresh_sidebar(self) -> None:
        self.sidebar.show_rows(self.chats.rows(), self.conversation.id, self.chats.resident())

    def action_toggle_sidebar(self) -> None:
        self.sidebar.toggle_class("-open")
        if self.sidebar.is_open:
            self.refresh_sidebar()
            self.sidebar.list.focus()
        else:
            self.prompt.focus()

    async def on_sidebar_picked(self, message: Sidebar.Picked) -> None:
        await self.switch_to(message.index + 1)
        self.prompt.focus()

    def on_sidebar_typed(self, message: Sidebar.Typed) -> None:
        self.prompt.focus()
        if message.character == "\n":
            self.prompt.action_submit()
        else:
            self.prompt.insert(message.character)

    # -- keys ------------------------------------------------------------------

    def action_scroll_chat(self, direction: int) -> None:
        """Page through the chat; scrolling up lets go of the stream, back at the bottom it follows again."""
        self.pane.page(direction)

    def action_chat_end(self, always: bool = False) -> None:
        """End (Ctrl+End always): the bottom of the chat, following the stream again; in a prompt
        holding text, or with another widget focused (the token inspector, the sidebar), End is theirs."""
        if not always and self.focused is not None and (self.focused is not self.prompt or self.prompt.text):
            raise SkipAction()
        self.pane.follow()

    def action_toggle_panels(self) -> None:
        """The panels, or the one-line status bar that stands for them: hides them on a wide terminal,
        shows them on a narrow one."""
        self.panels.toggle_class("-toggled")
        self.panels.status.toggle_class("-toggled")
