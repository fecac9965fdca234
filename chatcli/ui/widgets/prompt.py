"""The prompt: a multi-line TextArea. Enter sends, Shift+Enter / Ctrl+J insert a newline,
Up/Down at the first/last line walk the prompt history, Tab completes a command name and its
argument (a path for /file, /load, /save and /model, a theme, a preset); where several fit, each
Tab shows the next."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

from chatcli.chat.commands import common_completion, complete
from chatcli.ui.persist import PromptHistory

NEWLINE_KEYS = ("shift+enter", "ctrl+j")


class PromptInput(TextArea):
    DEFAULT_CSS = "PromptInput { height: auto; min-height: 3; max-height: 12; margin: 0 1; }"

    BINDINGS = [
        Binding("enter", "submit", "Send", show=True),
        Binding("ctrl+j", "newline", "Newline", key_display="⇧⏎/^J", show=True),
    ]

    @dataclass
    class Submitted(Message):
        text: str

    def __init__(self, history: PromptHistory, choices: Callable[[str], list[str]] | None = None, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.prompts = history
        self.choices = choices  # a command's argument values Tab offers (themes, presets); paths: commands.py
        self._cycle: tuple[list[str], int] | None = None  # several matches: Tab shows each in turn

    async def _on_key(self, event: events.Key) -> None:
        key = event.key
        handled = True
        if key == "enter":
            self.action_submit()
        elif key in NEWLINE_KEYS:
            self.action_newline()
        elif key == "up" and self.cursor_location[0] == 0 and not self.selected_text:
            handled = self._recall(self.prompts.older(self.text))
        elif key == "down" and self.cursor_location[0] == self.document.line_count - 1 and not self.selected_text:
            handled = self._recall(self.prompts.newer())
        elif key == "tab" and (self._cycling() or complete(self.text, self.choices)):
            self._complete()
        else:
            handled = False
        if handled:
            event.stop()
            event.prevent_default()
            return
        await super()._on_key(event)

    def action_submit(self) -> None:
        text = self.text
        if not text.strip():
            return
        self.prompts.add(text)
        self.clear()
        self.post_message(self.Submitted(text))

    def action_newline(self) -> None:
        start, end = self.selection
        self.replace("\n", start, end, maintain_selection_offset=False)

    def restore(self, text: str) -> None:
        """Put `text` back in the prompt (an edit, a prompt not sent), the cursor after it: typing adds to it."""
        self.load_text(text)
        self.move_cursor(self.document.end)

    def _recall(self, entry: str | None) -> bool:
        if entry is None:
            return False  # at the edge of the history: let the cursor move as usual
        self.restore(entry)
        return True

    def _cycling(self) -> bool:
        return self._cycle is not None and self.text == self._cycle[0][self._cycle[1]]

    def _complete(self) -> None:
        """Tab: the one match, or what all matches share; where they share no more, each in turn."""
        if self._cycling():
            matches, shown = self._cycle
            self._cycle = (matches, (shown + 1) % len(matches))
            self.restore(matches[self._cycle[1]])
            return
        done = common_completion(self.text, self.choices)
        if done is not None:
            self._cycle = None
            self.restore(done)
            return
        matches = complete(self.text, self.choices)
        self._cycle = (matches, 0)
        self.restore(matches[0])
        shown = "  ".join(m.rpartition(" ")[2] or m for m in matches)
        self.app.notify(shown, title="Tab: the next one", timeout=4)
