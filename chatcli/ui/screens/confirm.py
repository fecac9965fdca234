"""A yes/no modal: `/delete` asks here before anything is removed."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class Confirm(ModalScreen[bool]):
    """Dismissed with True (Y / the danger button) or False (N / Esc / Cancel)."""

    DEFAULT_CSS = """
    Confirm { align: center middle; background: $background 60%; }
    Confirm > Vertical { width: 64; height: auto; padding: 1 2; border: thick $error; background: $surface; }
    Confirm #question { width: 1fr; margin-bottom: 1; }
    Confirm Horizontal { height: auto; align-horizontal: right; }
    Confirm Button { margin-left: 2; }
    """
    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str, yes: str = "Delete") -> None:
        super().__init__()
        self.question = question
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, id="question", markup=False)
            with Horizontal():
                yield Button("Cancel (N)", id="no")
                yield Button(f"{self.yes} (Y)", id="yes", variant="error")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()  # Enter alone does not delete

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
