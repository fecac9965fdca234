"""OpenAI's function calling on the wire: `tools`, `tool_choice` and `parallel_tool_calls` in a request,
the tool parts of its messages (an assistant's `tool_calls`, `tool` results), and the calls of a reply
as `message.tool_calls` or streamed `delta.tool_calls`.

The model sees the tools through its own chat template (or the fallback of one without tools:
`chatcli.engine.text.toolcalls`); its reply's calls are read back in the syntax it writes them in
(`ReplyCalls`, over `CallScanner`). The reply is held by the grammar (text or calls under auto, calls
under `required` or a named function), so each call parses and matches its function's parameters; the
reader drops a call identical to one already given, a call past the one a named function (or
`parallel_tool_calls: false`) allows, and a call the reply was cut in (never content).

Errors are `ToolError(message, param)`, which `schema` turns into its 400.
"""

from __future__ import annotations

import json
import re

from chatcli.engine import Call, CallScanner, ToolCalls, new_call_id

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's function names


class ToolError(ValueError):
    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def _function(tool, i: int) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ToolError(f"{where} must be an object of type function (the only kind of tool served)", "tools")
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ToolError(f"{where}.function must be an object with a name", "tools", "invalid_type")
    if not NAME.match(function["name"]):
        raise ToolError(f"{where}.function.name must be 1 to 64 letters, digits, _ or -", "tools")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ToolError(f"{where}.function.description must be a string", "tools", "invalid_type")
    kept = {"name": function["name"]}
    if description:
        kept["description"] = description
    kept["parameters"] = _parameters(function.get("parameters"), f"{where}.function.parameters", function["name"])
    return {"type": "function", "function": kept}


def _parameters(schema, param: str, name: str) -> dict:
    """A function's parameters: a JSON schema of an object (a call's arguments are one), as OpenAI requires;
    a schema that does not say its type is taken as an object's; none is an object without properties."""
    if schema is None or schema == {}:
        return {"type": "object", "properties": {}}
    if not isinstance(schema, dict):
        raise ToolError(f"{param} must be a JSON schema object", param, "invalid_type")
    kind = schema.get("type", "object")
    if kind != "object":
        raise ToolError(
            f"invalid schema for function {name!r}: {param} must be a JSON schema of type object "
            f"(a call's arguments are an object), got type {json.dumps(kind)}",
            param,
            "invalid_function_parameters",
        )
    return {"type": "object", **schema}


def _choice(value, names: list[str]) -> str:
    if value in (None, "auto", "none", "required"):
        return value or "auto"
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        if name in names:
            return name
        raise ToolError(f"tool_choice names the function {name!r}, which is not one of the tools", "tool_choice")
    raise ToolError(
        'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
        "tool_choice",
    )


def parse_tools(body: dict) -> ToolCalls | None:
    """The request's tools and how they may be called; None without tools (`tool_choice` none or auto)."""
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise ToolError(
            "functions and function_call are not supported: send tools", "functions", "unsupported_parameter"
        )
    tools = body.get("tools")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolError("parallel_tool_calls must be a boolean", "parallel_tool_calls", "invalid_type")
    if tools is None or tools == []:
        if body.get("tool_choice") not in (None, "none", "auto"):
            raise ToolError("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ToolError("tools must be an array of function tools", "tools", "invalid_type")
    listed = [_function(tool, i) for i, tool in enumerate(tools)]
    names = [tool["function"]["name"] for tool in listed]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ToolError(f"tools name the function {twice[0]!r} twice", "tools")
    return ToolCalls.of(listed, _choice(body.get("tool_choice"), names), parallel is not False)


def tool_message(msg: dict, role: str, content: str, where: str) -> dict:
    """A message for the chat template, with its tool parts: an assistant's `tool_calls` (arguments as
    objects, as templates write them) or a tool result's `tool_call_id`."""
    out = {"role": role, "content": content}
    if role == "tool":
        call_id = msg.get("tool_call_id")
        if not isinstance(call_id, str):
            raise ToolError(
                f"{where}.tool_call_id must be a string: the id of the call answered", f"{where}.tool_call_id"
            )
        out["tool_call_id"] = call_id
        if isinstance(msg.get("name"), str):
            out["name"] = msg["name"]
        return out
    calls = msg.get("tool_calls")
    if role != "assistant" or not calls:
        return out
    if not isinstance(calls, list):
        raise ToolError(f"{where}.tool_calls must be an array", f"{where}.tool_calls", "invalid_type")
    out["tool_calls"] = [_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]
    return out


def _call(call, where: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ToolError(f"{where} must be a function call with a name", where, "invalid_type")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            raise ToolError(f"{where}.function.arguments is not JSON", f"{where}.function.arguments") from None
    call_id = call.get("id")
    out = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    return {"id": call_id, **out} if isinstance(call_id, str) else out


def named_results(messages: list[dict]) -> list[dict]:
    """Tool results given the name of the function they answer, where the call before says it (some
    templates write it)."""
    names = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            if "id" in call:
                names[call["id"]] = call["function"]["name"]
        if message["role"] == "tool" and "name" not in message and message["tool_call_id"] in names:
            message["name"] = names[message["tool_call_id"]]
    return messages


# -- the reply ---------------------------------------------------------------------------------


def tool_calls(calls: list[Call], syntax: str | None) -> list[dict]:
    """A reply's calls as `message.tool_calls` (ids as the model's call syntax takes them back)."""
    return [
        {"id": new_call_id(syntax), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


def call_deltas(call: Call, index: int, syntax: str | None) -> list[dict]:
    """A streamed call as OpenAI streams one: its id, type and name with empty arguments, then the arguments."""
    opening = {
        "index": index,
        "id": new_call_id(syntax),
        "type": "function",
        "function": {"name": call.name, "arguments": ""},
    }
    return [{"tool_calls": [opening]}, {"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]}]


class ReplyCalls:
    """A reply's pieces as the client gets them, whole (`push` then `finish`) or as it streams: text
    (str, never call markup) and `Call`s, a call equal to one already given dropped (the same name and
    arguments as JSON values: the grammar refuses the same text, this the same value written otherwise).
    `whole`: the reply gives calls, each of them whole (one cut by max_tokens is dropped, never given), so
    its finish_reason is "tool_calls" and the openai client's `.parse()` / `.stream()` take it."""

    def __init__(self, tools: ToolCalls, syntax: str) -> None:
        self.scanner = CallScanner(syntax)
        self.one = not tools.parallel or tools.choice not in ("auto", "required")  # a named function: one call
        self.given: list[tuple[str, object]] = []

    def push(self, text: str) -> list:
        return self._kept(self.scanner.push(text))

    def finish(self) -> list:
        return self._kept(self.scanner.finish())

    @property
    def whole(self) -> bool:
        return bool(self.given)

    def _kept(self, pieces: list) -> list:
        out = []
        for piece in pieces:
            if isinstance(piece, Call):
                key = (piece.name, json.loads(piece.arguments))
                if key in self.given or (self.one and self.given):
                    continue
                self.given.append(key)
            out.append(piece)
        return out
