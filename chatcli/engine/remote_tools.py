"""Tools through the remote engine: `SamplingParams.tools` and a conversation's tool parts as OpenAI
takes them, and a reply's structured `delta.tool_calls` back into the text the engine's consumers
read calls from.

Out: `tools` (the list as given), `tool_choice` (`auto`, `none`, `required`, or
`{"type": "function", "function": {"name": ...}}` for a named function) and `parallel_tool_calls`;
an assistant's `tool_calls` with `arguments` as JSON text (the engine's messages hold them as
objects, as chat templates write them), `tool` messages as they are (`tool_call_id`, `name`).

Back: the server streams a call in parts by `index` (its id, name, argument fragments); they are put
together and, when the choice finishes (or the stream ends), written into the reply as Hermes blocks
(`call_text`), so `parse_calls(reply, HERMES)` / `CallScanner(HERMES)` read them back as from the
in-process engine's text. The server's call ids are not kept: a consumer gives its calls ids of its
own, as for the in-process engine's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from chatcli.engine.params import AUTO, NONE, REQUIRED, ToolCalls
from chatcli.engine.text.toolcalls import HERMES, call_text

SYNTAX = HERMES  # the syntax a remote reply's calls are written in
HINT = (
    " (the request had tools: does the server take them? llama-server needs --jinja, "
    "vLLM --enable-auto-tool-choice and --tool-call-parser)"
)


def tool_fields(tools: ToolCalls) -> dict:
    """The request's `tools`, `tool_choice` and `parallel_tool_calls`."""
    choice = tools.choice
    if choice not in (AUTO, NONE, REQUIRED):
        choice = {"type": "function", "function": {"name": choice}}
    return {"tools": json.loads(tools.tools), "tool_choice": choice, "parallel_tool_calls": tools.parallel}


def wire_messages(messages: Sequence[dict]) -> list[dict]:
    """The messages as OpenAI takes them: an assistant's calls with their arguments as JSON text."""
    return [_wire(message) if message.get("tool_calls") else message for message in messages]


def _wire(message: dict) -> dict:
    calls = []
    for call in message["tool_calls"]:
        function = dict(call.get("function") or {})
        if not isinstance(function.get("arguments", ""), str):
            function["arguments"] = json.dumps(function["arguments"], ensure_ascii=False)
        calls.append({**call, "type": call.get("type", "function"), "function": function})
    return {**message, "tool_calls": calls}


class CallParts:
    """A reply's streamed `delta.tool_calls`, put together by `index`: the id, the name, the arguments'
    fragments (or a whole arguments object, as some servers send it). A part without an index (older
    ollama streams whole calls so) goes on the call of its id, else the last call, else a new one."""

    def __init__(self) -> None:
        self.calls: dict[int, dict] = {}

    def take(self, parts: list[dict]) -> None:
        """A chunk's parts, as `remote_wire.parse_chunk` checked them (each field of its type or None)."""
        for part in parts:
            self._take(part)

    def _take(self, part: dict) -> None:
        index, call_id = part.get("index"), part.get("id")
        if index is None:
            same = [i for i, call in self.calls.items() if call_id and call["id"] == call_id]
            last = max(self.calls, default=-1)
            index = same[0] if same else last if last >= 0 and not call_id else last + 1
        call = self.calls.setdefault(index, {"id": None, "name": "", "arguments": ""})
        function = part.get("function") or {}
        call["id"] = call_id or call["id"]
        call["name"] = function.get("name") or call["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # a whole object (ollama), else text fragments
            call["arguments"] = json.dumps(arguments, ensure_ascii=False)
        elif arguments is not None:
            call["arguments"] += arguments

    def render(self, after_text: bool) -> str:
        """The calls so far as Hermes blocks (on a line of their own after text), and forget them. A call
        whose arguments are not a JSON object stays text when read back, as the in-process engine's would."""
        blocks = [
            call_text(call["name"], call["arguments"].strip() or "{}")
            for _, call in sorted(self.calls.items())
            if call["name"] or call["arguments"]
        ]
        self.calls.clear()
        text = "\n".join(blocks)
        return "\n" + text if text and after_text else text
