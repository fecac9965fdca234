"""`/search TEXT`: the saved messages that hold those words, best first (SQLite FTS5, `Store.search`);
Enter opens the conversation at the message, Esc closes. A message is shown once: where a branch or
an import holds it too, they are named under it (`also in: ⑂ branch 'title' #3, import 'title' #3`)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from chatcli.chat.store import Hit
from chatcli.errors import shown


def _row(hit: Hit) -> Text:
    head = Text(f"{shown(hit.title)}  ", style="bold")
    head.append(f"#{hit.index + 1} {hit.role}", style="dim")
    body = Text("\n  ")
    for i, part in enumerate(shown(hit.snippet).replace("]", "[").split("[")):
        body.append(part, style="reverse" if i % 2 else "")
    if hit.copies:
        body.append(f"\n  {hit.also_in()}", style="dim italic")
    return head + body


class SearchResults(ModalScreen[Hit | None]):
    DEFAULT_CSS = """
    SearchResults { align: center middle; background: $background 60%; }
    SearchResults > Vertical { width: 90%; height: 80%; padding: 1 2; border: thick $primary; background: $surface; }
    SearchResults #query { margin-bottom: 1; }
    SearchResults OptionList { height: 1fr; }
    """
    BINDINGS = [Binding("escape", "dismiss(None)", "Close")]

    def __init__(self, query: str, hits: list[Hit]) -> None:
        super().__init__()
        self.query_text, self.hits = query, hits

    def compose(self) -> ComposeResult:
        with Vertical():
            count = f"{len(self.hits)} message{'s' * (len(self.hits) != 1)}"
            copies = sum(len(h.copies) for h in self.hits)
            count += f" ({copies} cop{'ies' if copies != 1 else 'y'} folded under them)" if copies else ""
            yield Static(f"{count} with {self.query_text!r}, best first · Enter opens · Esc closes", id="query")
            yield OptionList(*[Option(_row(h)) for h in self.hits])

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self.hits[event.option_index])
