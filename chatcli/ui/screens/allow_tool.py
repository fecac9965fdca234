"""The question before a tool runs: once, always (for this tool, the rest of the run), no, or stop the turn."""

from __future__ import annotations

import json

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from chatcli.errors import shown

ONCE, ALWAYS, NO, STOP = "once", "always", "no", "stop"


class AllowTool(ModalScreen[str]):
    """Dismissed with ONCE (Y), ALWAYS (A), NO (N) or STOP (Esc: the turn ends here)."""

    DEFAULT_CSS = """
    AllowTool { align: center middle; background: $background 60%; }
    AllowTool > Vertical { width: 76; height: auto; max-height: 80%; padding: 1 2; border: thick $warning;
                           background: $surface; }
    AllowTool #question { width: 1fr; margin-bottom: 1; }
    AllowTool #arguments { width: 1fr; max-height: 12; overflow-y: auto; margin-bottom: 1; color: $text-muted; }
    AllowTool Horizontal { height: auto; align-horizontal: right; }
    AllowTool Button { margin-left: 1; }
    """
    BINDINGS = [
        Binding("y", f"answer('{ONCE}')", "Run once"),
        Binding("a", f"answer('{ALWAYS}')", "Always"),
        Binding("n", f"answer('{NO}')", "No"),
        Binding("escape", f"answer('{STOP}')", "Stop the turn"),
    ]

    def __init__(self, tool: str, server: str, arguments: str) -> None:
        super().__init__()
        self.tool, self.server, self.arguments = tool, server, arguments

    def compose(self) -> ComposeResult:
        try:
            arguments = json.dumps(json.loads(self.arguments), ensure_ascii=False, indent=2)
        except ValueError:
            arguments = self.arguments
        question = f"The model calls the tool {self.tool} (MCP server {self.server}). Run it?"
        with Vertical():
            yield Static(shown(question), id="question", markup=False)
            yield Static(shown(arguments), id="arguments", markup=False)
            yield Static("Esc stops the turn: the model is not asked again.", markup=False)
            with Horizontal():
                yield Button("No (N)", id=NO)
                yield Button(f"Always for {self.tool} (A)", id=ALWAYS)
                yield Button("Run once (Y)", id=ONCE, variant="warning")

    def on_mount(self) -> None:
        self.query_one(f"#{NO}", Button).focus()  # Enter alone runs nothing

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id)

    def action_answer(self, answer: str) -> None:
        self.dismiss(answer)
