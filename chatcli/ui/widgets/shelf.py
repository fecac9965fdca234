"""Shelving: a container's first children hidden (`display: none`) and one `Shelf` of the height they stood
at in their place, so that what follows them keeps its place and the scroll range its size.

Textual lays out and composes every widget of the screen at each frame, shown on screen or scrolled far
away; a hidden one costs nothing. The chat pane shelves the messages far above the view, and the Markdown
blocks of the first reply it shows that lie there too (`ChatPane.reshelve`)."""

from __future__ import annotations

from textual.geometry import Region
from textual.widget import Widget


class Shelf(Widget):
    """Stands for the hidden children before it: their height, none of their widgets."""

    DEFAULT_CSS = "Shelf { height: 0; margin: 0; }"


class Shelves:
    """The shelving of one container's children (`cut`)."""

    def __init__(self, container: Widget) -> None:
        self.container = container
        self.shelf: Shelf | None = None
        self.hidden: list[Widget] = []  # the container's first children after the shelf, in order
        self._stood: dict[Widget, tuple[int, int]] = {}  # each hidden one's top and bottom when it was hidden

    def items(self) -> list[Widget]:
        """The container's children but the shelf (the shelf forgotten where the container was emptied)."""
        if self.shelf is not None and self.shelf.parent is not self.container:
            self.shelf, self.hidden, self._stood = None, [], {}
        return [w for w in self.container.children if w is not self.shelf]

    def region(self, widget: Widget) -> Region:
        """Where `widget` stands in the container's virtual space (a hidden one: where it stood); empty for
        one not laid out yet."""
        if widget in self._stood:
            top, bottom = self._stood[widget]
            return Region(0, top, 1, bottom - top)
        return widget.virtual_region

    def above(self, items, top: int) -> int:
        """How many of `items` (the container's children from its first on) end above `top`, in the
        container's virtual space (a hidden one: where it stood); one not laid out yet ends the count."""
        count = 0
        for widget in items:
            region = self.region(widget)
            if not region or region.bottom >= top:
                break
            count += 1
        return count

    def cut(self, count: int) -> None:
        """The first `count` children hidden, the rest shown; the shelf as high as the hidden ones stood."""
        items = self.items()
        count = min(count, max(0, len(items) - 1))  # one stays shown: the shelf's height is its top
        if len(self.hidden) == count and items[:count] == self.hidden:
            return
        stood = dict(self._stood)  # a hidden widget has no region: where it stood when hidden
        for widget in items[count:]:
            if self._stood.pop(widget, None) is not None:
                widget.display = True
        for widget in items[:count]:
            if widget not in self._stood:
                region = widget.virtual_region
                self._stood[widget] = stood[widget] = (region.y, region.bottom)
                widget.display = False
        self.hidden = items[:count]
        if count and self.shelf is None:
            self.shelf = Shelf()
            self.container.mount(self.shelf, before=0)
        if self.shelf is not None:
            height = 0
            if count:  # the shelf ends where the first shown child's top margin begins
                first = items[count]
                top = stood[first][0] if first in stood else first.virtual_region.y
                height = max(0, top - first.styles.margin.top)
            self.shelf.styles.height = height
