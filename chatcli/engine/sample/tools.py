"""The grammar of tool calls: a reply held to the model's call syntax around JSON that matches one of
the tools' parameter schemas, so that every call parses and validates.

Under `tool_choice` required or a named function (`ToolCalls.forced`) the reply is calls only; under
`auto` it is text (that holds no call markup of any syntax: `MARKUP`) or, once the model opens a call,
calls: for the Hermes syntax text then `<tool_call>` blocks a line apart; for Llama 3.1's JSON calls one
object; for Mistral's a JSON list of calls; for Harmony's (gpt-oss) one `commentary` message to a function, its
Harmony control tokens written as the tokens they are (`<|channel|>`, `<|constrain|>`, `<|message|>`, `<|call|>`:
Lark's `<|…|>`), after an optional analysis message (gpt-oss reasons before it calls; under a forced call
steering closes the analysis while the call has room left) a call, or under auto a call or the final answer (free text,
or the response format's JSON). A named function is called once; `required` and `auto`
make up to MAX_CALLS calls where parallel calls are allowed (one where they are not), the list ending
when the model ends it (a call that repeats one already made is refused by the mask, `steer`).
Each function's call is its own `%json` schema in a Lark grammar (llguidance's): `{"name": <its name>,
"arguments": <its parameters>}`, the parameters' `$defs` moved up to the call's root so that their
references still resolve, and each object with `properties` that does not say `additionalProperties`
closed (`closed`: as OpenAI's strict mode and llama.cpp's grammars do, else a small model goes on
writing properties of its own until max_tokens). With a `response_format` beside `auto` tools, the
reply is that JSON or calls.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from chatcli.engine.params import AUTO, REQUIRED, ResponseFormat, SamplingParams, ToolCalls
from chatcli.engine.text.toolcalls import CLOSE, HARMONY, HARMONY_OPEN, LLAMA3, MARKUP, MISTRAL, OPEN

MAX_CALLS = 16  # calls in one reply, where parallel calls are allowed: a small model's loop ends
# Compact JSON, the way `json.dumps` writes it (with free whitespace a small model can pad a reply
# with newlines until max_tokens). A schema's own "x-guidance" options still win.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class CallText:
    """The literal text around a syntax's calls, as its grammar writes it: `start` before the first
    call's JSON, `between` from one call's JSON to the next's, `end` after the last; `depth`: how deep
    in JSON a call's object opens (1 inside Mistral's list); `anywhere`: the first call may follow text."""

    start: bytes
    between: bytes
    end: bytes
    depth: int = 0
    anywhere: bool = False


def call_text_of(syntax: str) -> CallText:
    if syntax == HARMONY:  # as steering spells it: control tokens as no bytes, the name then ` json` before `{`
        return CallText(HARMONY_OPEN.removeprefix("<|channel|>").encode(), b"", b"", anywhere=True)
    if syntax == LLAMA3:  # one call, the whole reply
        return CallText(b"", b"", b"")
    if syntax == MISTRAL:
        return CallText(b"[", b", ", b"]", depth=1)
    return CallText(f"{OPEN}\n".encode(), f"\n{CLOSE}\n{OPEN}\n".encode(), f"\n{CLOSE}".encode(), anywhere=True)


def held(params: SamplingParams) -> bool:
    """The reply is held by a grammar: a response format, or tools that may be called."""
    return params.response_format is not None or (params.tools is not None and bool(params.tools.callable()))


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


def format_schema(fmt: ResponseFormat) -> dict:
    """The schema a reply in `fmt` is held to: its objects closed (`strict` or not), compact."""
    return with_options(closed(fmt.schema_object()))


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


def several(tools: ToolCalls) -> bool:
    """Several calls in one reply: parallel calls allowed, and not a named function (called once)."""
    return tools.parallel and tools.choice in (AUTO, REQUIRED)


def _seq(*parts: bytes | str) -> str:
    """Lark's sequence of `parts`: literal text (bytes, quoted; none where empty) and rule names (str)."""
    return " ".join(json.dumps(p.decode()) if isinstance(p, bytes) else p for p in parts if p)


def _free_text(syntax: str) -> str:
    """The Lark terminal of an auto reply's text: no call markup of any syntax in it, and for the JSON
    syntaxes not beginning as a call does (`{`, `[{`), so that a call is always read as one."""
    markup = "|".join(re.sub(r"([\\/.+*?()|\[\]{}^$])", r"\\\1", m) for m in MARKUP)
    text = f"/(?s:.*)/ & ~/(?s:.*)({markup})(?s:.*)/"
    if syntax == LLAMA3:
        text += " & ~/[ \\t\\r\\n]*\\{(?s:.*)/"
    elif syntax == MISTRAL:
        text += " & ~/[ \\t\\r\\n]*\\[[ \\t\\r\\n]*\\{(?s:.*)/"
    return f"TEXT: {text}"


def calls_lark(tools: ToolCalls, syntax: str, fmt: ResponseFormat | None = None) -> str:
    """The Lark grammar of a reply that is calls of `tools.callable()` (under auto: text, or calls; with
    `fmt`: that JSON, or calls)."""
    functions = tools.callable()
    if syntax == HARMONY:
        return harmony_lark(tools, fmt)
    rules = [f"fn{i}: %json {json.dumps(call_schema(f, syntax))}" for i, f in enumerate(functions)]
    rules.append("fn: " + " | ".join(f"fn{i}" for i in range(len(functions))))
    text = call_text_of(syntax)
    more = f"({_seq(text.between, 'fn')}){{0,{MAX_CALLS - 1}}}" if several(tools) and syntax != LLAMA3 else ""
    rules.append("calls: " + _seq(text.start, "fn", more, text.end))
    if fmt is not None:
        start = ["start: calls | reply", f"reply: %json {json.dumps(format_schema(fmt))}"]
    elif tools.forced:
        start = ["start: calls"]
    elif text.anywhere:  # text, then calls once the model opens one (`head` ends at the first opening)
        opening, rest = text.start[: len(OPEN)], text.start[len(OPEN) :]
        start = ["start: TEXT | head after", f"head[lazy]: TEXT {_seq(opening)}", _free_text(syntax)]
        rules.append("after: " + _seq(rest, "fn", more, text.end))
    else:
        start = ["start: TEXT | calls", _free_text(syntax)]
    return "\n".join([*start, *rules])


def harmony_lark(tools: ToolCalls, fmt: ResponseFormat | None = None) -> str:
    """The Lark grammar of a Harmony reply: an optional analysis message, then a call of one of
    `tools.callable()` (its arguments held to the function's parameters), or under auto a call or the final
    answer."""
    functions = tools.callable()
    rules = [
        f'fn{i}: {json.dumps(f["name"] + " ")} <|constrain|> "json" <|message|> %json '
        + json.dumps(with_options(parameters_of(f)))
        for i, f in enumerate(functions)
    ]
    rules.append("fn: " + " | ".join(f"fn{i}" for i in range(len(functions))))
    rules.append(f"calls: <|channel|> {json.dumps(HARMONY_OPEN.removeprefix('<|channel|>'))} fn <|call|>")
    rules += ['analysis: <|channel|> "analysis" <|message|> TEXT <|end|> <|start|> "assistant"', "TEXT: /(?s:.*)/"]
    if tools.forced:  # the model's analysis first, as gpt-oss writes it (steering closes it in time: `Steer`)
        return "\n".join(["start: analysis? calls", *rules])
    answer = f"%json {json.dumps(format_schema(fmt))}" if fmt is not None else "TEXT"
    return "\n".join(["start: analysis? (calls | final)", f'final: <|channel|> "final" <|message|> {answer}', *rules])
