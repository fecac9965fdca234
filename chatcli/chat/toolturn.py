"""A turn with MCP tools, apart from any front end: the tools offered to the model (tool_choice auto),
the calls read from its reply, what each call's result becomes, and the text streamed with the calls
held back. The TUI (`ui/screens/tool_turns.py`) and the one-shot (`oneshot.py`) run the rounds: a reply
with calls, a result for each (run where the user allows it), then the model again, until it answers
with text (at most MAX_ROUNDS replies with calls a turn).
"""

from __future__ import annotations

import json

from chatcli.chat.mcp import DENIED, ERROR, MAX_RESULT_CHARS, STOPPED, Hub, Result
from chatcli.engine import HERMES, Call, CallScanner, ToolCalls, call_syntax, new_call_id, parse_calls
from chatcli.errors import clip

MAX_ROUNDS = 8  # replies with calls in one turn: a small model that calls on and on is stopped there

DENIED_TEXT = "The user did not allow this call, so it was not run."
STOPPED_TEXT = "The user stopped the turn before this call ran."
NOT_ALLOWED_TEXT = "This call was not run: tools run only when the user allows them."


def syntax_of(engine) -> str:
    """How the engine's replies write a tool call (`call_syntax`: the in-process model's own, the remote
    engine's Hermes blocks; else, a test's fake, the Hermes blocks)."""
    return call_syntax(engine) or HERMES


class Toolbox:
    """The tools of one run: the MCP hub and the tools the user allowed for the rest of it ("always")."""

    def __init__(self, hub: Hub, allow_all: bool = False) -> None:
        self.hub = hub
        self.always: set[str] = set()
        self.allow_all = allow_all  # --allow-tools: every call runs without asking

    def allowed(self, name: str) -> bool:
        return self.allow_all or name in self.always

    def params(self, params):
        """`params` offering the tools (tool_choice auto), where there are any."""
        tools = self.hub.openai_tools()
        return params.with_(tools=ToolCalls.of(tools)) if tools else params

    def listing(self) -> list[str]:
        """/tools: each tool, its server, whether it runs without asking; then the servers that failed."""
        lines = []
        for tool in self.hub.tools:
            allowed = "runs without asking" if self.allowed(tool.name) else "asks first"
            about = tool.description.strip().splitlines()[0] if tool.description.strip() else ""
            lines.append(f"{tool.name} ({tool.server}, {allowed})" + (f": {about[:80]}" if about else ""))
        lines += [f"not started: {why}" for why in self.hub.failed.values()]
        return lines


def new_call(call: Call, syntax: str | None = None) -> dict:
    """A call as a message keeps it: an id (OpenAI's shape, or what the call syntax takes back: Mistral's 9
    letters and digits), the name, the arguments as JSON text."""
    return {"id": new_call_id(syntax), "name": call.name, "arguments": call.arguments}


def split_reply(text: str, syntax: str) -> tuple[str, list[dict]]:
    """A reply's text outside its calls, and its calls (`new_call`)."""
    rest, calls = parse_calls(text, syntax)
    return rest, [new_call(c, syntax) for c in calls]


def call_line(call: dict, width: int = 200) -> str:
    """`name {"arg": value}`, on one line."""
    return clip(f"{call['name']} {call.get('arguments', '{}')}", width)


def run_call(hub: Hub, call: dict) -> Result:
    """Run `call` (blocking); arguments that are not a JSON object are an error result, not a run."""
    arguments = arguments_of(call)
    return bad_arguments(call) if arguments is None else hub.call(call["name"], arguments)


def bad_arguments(call: dict) -> Result:
    return Result(f"Error: the arguments of {call['name']} are not a JSON object.", ERROR)


def arguments_of(call: dict) -> dict | None:
    try:
        found = json.loads(call.get("arguments") or "{}")
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def denied() -> Result:
    return Result(DENIED_TEXT, DENIED)


def stopped() -> Result:
    return Result(STOPPED_TEXT, STOPPED)


def told(result: Result) -> str:
    """What the user is told of a result: its status, the first of it, and a cut if there was one."""
    if result.status == DENIED:
        return "not run"
    head = "" if result.status == "ok" else f"{result.status}: "
    tail = f" (cut: {result.cut:,} characters, the model saw the first {MAX_RESULT_CHARS:,})" if result.cut else ""
    return head + result.short(120) + tail


class HeldCalls:
    """A writer for a streamed reply that passes its text on (`out.write`) and holds its calls back
    (`CallScanner`): the one-shot prints the text, never a `<tool_call>` block."""

    def __init__(self, out, syntax: str) -> None:
        self.out = out
        self.scanner = CallScanner(syntax)
        self.wrote = ""  # the last piece written (the one-shot ends a reply's line after it)

    def write(self, text: str) -> None:
        self._pass(self.scanner.push(text))

    def flush(self) -> None:
        self.out.flush()

    def finish(self) -> None:
        self._pass(self.scanner.finish())
        self.scanner = CallScanner(self.scanner.syntax)

    def _pass(self, pieces: list) -> None:
        for piece in pieces:
            if isinstance(piece, str) and piece:
                self.out.write(piece)
                self.wrote = piece
        self.out.flush()
