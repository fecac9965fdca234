"""A one-line bar of ranked parts that fits its width at every size (`format.fit_line`): the
header's model and settings, the status bar that stands for the panels on a narrow terminal."""

from __future__ import annotations

from textual.widgets import Static

from chatcli.ui.format import fit_line


class FittedLine(Static):
    DEFAULT_CSS = "FittedLine { height: 1; padding: 0 1; }"

    def __init__(self, name_first: bool = False, **kwargs) -> None:
        """`name_first`: the first part is a name, shortened before the middle-ranked parts go."""
        super().__init__("", markup=False, **kwargs)
        self.groups: list[list[tuple[str, int]]] = []
        self.name_first = name_first

    def show(self, groups: list[list[tuple[str, int]]]) -> None:
        if groups != self.groups:
            self.groups = groups
            self._fit()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        width = self.size.width or max(1, self.app.size.width - 2)  # not laid out yet: the terminal's
        # One line whose size is its container's, whatever it says: no layout of the screen (the status
        # bar changes with the panels, 3 times a second while a reply streams, even where it is hidden).
        self.update(fit_line(self.groups, width, self.name_first), layout=False)
