"""The screen's keys along its bottom line, as Textual's Footer shows them, in one widget.

Textual's Footer is a container of a widget per key: on the chat screen, a third of the widgets every frame lays out
and composes while a reply streams (issue 50). `KeyBar` draws the same cells (the key, then its description, in the
footer's colours; a disabled key dimmed) as one line of text, and keeps
what the Footer does with the mouse: a key under the pointer takes the hover colour, and a click presses it (a
disabled key rings the bell). It draws again when the screen's bindings change (`bindings_updated_signal`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.style import Style
from rich.text import Text
from textual import events
from textual.widget import Widget


@dataclass(frozen=True)
class Key:
    key: str  # what a click presses
    enabled: bool
    start: int  # its cells [start, end) on the line
    end: int


class KeyBar(Widget, can_focus=False):
    ALLOW_SELECT = False
    COMPONENT_CLASSES = {"keybar--item", "keybar--key", "keybar--description", "keybar--hover"}
    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        color: $footer-foreground;
        background: $footer-background;
        text-wrap: nowrap;
        .keybar--item {
            background: $footer-item-background;
        }
        .keybar--key {
            color: $footer-key-foreground;
            background: $footer-key-background;
            text-style: bold;
        }
        .keybar--description {
            color: $footer-description-foreground;
            background: $footer-description-background;
        }
        .keybar--hover {
            color: $footer-key-foreground;
            background: $block-hover-background;
        }
    }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.keys: list[Key] = []
        self.hover: int | None = None  # the index of the key under the pointer

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, _screen) -> None:
        self.refresh()

    def _listed(self) -> list[tuple]:
        """The bindings the Footer would show, in its order, one an action (the app has no command palette)."""
        shown, actions = [], set()
        for _node, binding, enabled, _tooltip in self.screen.active_bindings.values():
            if binding.show and binding.action not in actions:
                actions.add(binding.action)
                shown.append((binding, enabled))
        return shown

    def render(self) -> Text:
        key_style = self.get_component_rich_style("keybar--key")
        description_style = self.get_component_rich_style("keybar--description")
        hover_style = self.get_component_rich_style("keybar--hover")
        item_style = self.rich_style + self.get_component_rich_style("keybar--item")
        line, keys = Text(no_wrap=True, overflow="crop"), []
        for index, (binding, enabled) in enumerate(self._listed()):
            start, display = line.cell_len, self.app.get_key_display(binding)
            hovered, dim = self.hover == index, Style() if enabled else Style(dim=True)
            line.append(f" {display} ", (hover_style if hovered else key_style) + dim)
            if binding.description:
                line.append(f"{binding.description} ", (hover_style if hovered else description_style) + dim)
            line.stylize_before(item_style, start, line.cell_len)  # as a FooterKey's own style, under its parts'
            keys.append(Key(binding.key, enabled, start, line.cell_len))
        self.keys = keys
        line.stylize_before(self.rich_style)
        return line

    def _key_at(self, x: int) -> int | None:
        return next((i for i, k in enumerate(self.keys) if k.start <= x < k.end), None)

    def on_mouse_move(self, event: events.MouseMove) -> None:
        at = self._key_at(event.x)
        if at != self.hover:
            self.hover = at
            self.refresh()

    def on_leave(self, _event: events.Leave) -> None:
        if self.hover is not None:
            self.hover = None
            self.refresh()

    def on_mouse_down(self, event: events.MouseDown) -> None:
        at = self._key_at(event.x)
        if at is None:
            return
        if self.keys[at].enabled:
            self.app.simulate_key(self.keys[at].key)
        else:
            self.app.bell()
