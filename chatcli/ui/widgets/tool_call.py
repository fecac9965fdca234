"""A tool call in the chat: the tool and its arguments, where it stands (waiting for the user, running,
done), and its result folded under it (click to unfold); the model's and the tool's words as a terminal
may show them (`errors.shown`)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Collapsible, Static

from chatcli.chat.toolturn import call_line, told
from chatcli.errors import shown


class ToolCallBox(Vertical):
    DEFAULT_CSS = """
    ToolCallBox { height: auto; margin: 0 1 0 2; padding: 0 1; border-left: outer $warning 60%; }
    ToolCallBox .tool-head { height: auto; }
    ToolCallBox .tool-state { height: auto; color: $text-muted; }
    ToolCallBox .tool-state.-error { color: $error; }
    ToolCallBox Collapsible { display: none; border-top: none; padding: 0; margin: 0; background: transparent; }
    ToolCallBox Collapsible.-shown { display: block; }
    """

    def __init__(self, call: dict) -> None:
        super().__init__()
        self.call = call
        self.message = None  # the conversation's tool result, once there is one
        self.head = Static(Text.assemble(("⚙ tool ", "bold"), call_line(call, 400)), classes="tool-head")
        self.state = Static("", classes="tool-state", markup=False)
        self.output = Static("", markup=False)
        self.fold = Collapsible(self.output, title="Result", collapsed=True)

    def compose(self) -> ComposeResult:
        yield self.head
        yield self.state
        yield self.fold

    def waiting(self, text: str) -> None:
        self.state.update(text)

    def show(self, message, result=None) -> None:
        """The call's result: `message` (the conversation's tool message), and the `Result` where it
        was just run (its status line says more: a cut)."""
        self.message = message
        status = (message.tool_call or {}).get("status", "ok")
        if result is not None:
            line = told(result)
        else:
            line = (
                "not run"
                if status == "denied"
                else (f"{status}: " if status != "ok" else "") + shown(" ".join(message.content.split())[:120])
            )
        self.state.update(line)
        self.state.set_class(status not in ("ok", "denied"), "-error")
        self.output.update(shown(message.content))
        self.fold.title = f"Result ({len(message.content):,} characters: click to show)"
        # folded under a line that already shows all of it, it would only say "click to show" for nothing
        self.fold.set_class(message.content.strip() not in line, "-shown")
