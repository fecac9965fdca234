"""The grammar of tool calls: a reply held to the model's call syntax around JSON that matches one of
the tools' parameter schemas, so that every call parses and validates.

Under `tool_choice` required or a named function (`ToolCalls.forced`) the reply is calls only: for
the Hermes syntax one `<tool_call>` block, or up to MAX_CALLS of them a line apart where parallel
calls are allowed; for Llama 3.1's JSON calls one object; for Mistral's a JSON list of calls (one, or up
to MAX_CALLS where parallel calls are allowed). Each function's call is its own `%json`
schema in a Lark grammar (llguidance's): `{"name": <its name>, "arguments": <its parameters>}`, the
parameters' `$defs` moved up to the call's root so that their references still resolve, and each object
with `properties` that does not say `additionalProperties` closed (as OpenAI's strict mode and llama.cpp's
grammars do: else a small model goes on writing properties of its own until max_tokens). With a
`response_format` beside `auto` tools, the reply is that JSON or calls. `auto` alone leaves it free.
"""

from __future__ import annotations

import json

from chatcli.engine.params import ResponseFormat, SamplingParams, ToolCalls
from chatcli.engine.text.toolcalls import CLOSE, LLAMA3, MISTRAL, OPEN

MAX_CALLS = 16  # calls in one reply, where parallel calls are allowed: a small model's loop ends
# Compact JSON, the way `json.dumps` writes it (with free whitespace a small model can pad a reply
# with newlines until max_tokens). A schema's own "x-guidance" options still win.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def held(params: SamplingParams) -> bool:
    """The reply is held by a grammar: a response format, or calls that must be made."""
    return params.response_format is not None or (params.tools is not None and params.tools.forced)


def with_options(schema: dict) -> dict:
    """`schema` with the compact-JSON options under its own."""
    return {**schema, "x-guidance": {**JSON_OPTIONS, **(schema.get("x-guidance") or {})}}


MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")  # name -> schema
DATA = ("const", "enum", "default", "examples", "required")  # values, not schemas


def closed(schema, close: bool = True):
    """`schema` with every object that lists `properties` and says nothing of others closed to others
    (not the parts of an allOf: each would refuse the others' properties)."""
    if isinstance(schema, list):
        return [closed(s, close) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in MAPS and isinstance(value, dict):
            out[key] = {name: closed(sub) for name, sub in value.items()}
        else:
            out[key] = value if key in DATA else closed(value, key != "allOf")
    if (
        close
        and isinstance(schema.get("properties"), dict)
        and not {"additionalProperties", "patternProperties"} & schema.keys()
    ):
        out["additionalProperties"] = False
    return out


def parameters_of(function: dict) -> dict:
    """The schema a call's arguments are held to: the function's parameters, closed (none: `{}` only)."""
    parameters = function.get("parameters")
    return closed(parameters) if isinstance(parameters, dict) and parameters else dict(NO_PARAMETERS)


def call_schema(function: dict, syntax: str) -> dict:
    """The JSON schema of one call of `function` in `syntax`."""
    parameters = parameters_of(function)
    moved = {key: parameters.pop(key) for key in ("$defs", "definitions") if key in parameters}
    options = parameters.pop("x-guidance", None) or {}
    key = "parameters" if syntax == LLAMA3 else "arguments"
    schema = {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, key: parameters},
        "required": ["name", key],
        "additionalProperties": False,
        **moved,
    }
    return with_options({**schema, "x-guidance": options})


def calls_lark(tools: ToolCalls, syntax: str, fmt: ResponseFormat | None = None) -> str:
    """The Lark grammar of a reply that is calls of `tools.callable()` (or, with `fmt`, that JSON)."""
    functions = tools.callable()
    rules = [f"fn{i}: %json {json.dumps(call_schema(f, syntax))}" for i, f in enumerate(functions)]
    rules.append("fn: " + " | ".join(f"fn{i}" for i in range(len(functions))))
    if syntax == LLAMA3:  # Llama 3.1 makes one call a reply
        rules.append("calls: fn")
    elif syntax == MISTRAL:  # a JSON list of calls (its `[TOOL_CALLS]` token is not text)
        more = f'(", " fn){{0,{MAX_CALLS - 1}}}' if tools.parallel else ""
        rules.append(f'calls: "[" fn {more} "]"')
    else:
        rules.append(f"call: {json.dumps(OPEN + chr(10))} fn {json.dumps(chr(10) + CLOSE)}")
        rules.append(f'calls: call ("\\n" call){{0,{MAX_CALLS - 1}}}' if tools.parallel else "calls: call")
    if fmt is None:
        return "\n".join(["start: calls", *rules])
    return "\n".join(["start: calls | reply", f"reply: %json {json.dumps(with_options(fmt.schema_object()))}", *rules])
