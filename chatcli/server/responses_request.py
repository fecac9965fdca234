"""The Responses API's request (`POST /v1/responses`, see `responses`): `input` and `instructions` as the chat
template's messages, function tools and `tool_choice` through chat completions' parser, `text.format` as its
`response_format`, the sampling fields, and the fields refused: `store: true` and `previous_response_id` (nothing
is kept between requests), other tools, non-text parts, `background`, `conversation`, `prompt`,
`reasoning.effort`, `top_logprobs`."""

from __future__ import annotations

import json

from chatcli.server import schema
from chatcli.server.schema import ChatRequest, bad
from chatcli.server.tools import ToolError, named_results, parse_tools

REFUSED = ("background", "conversation", "prompt", "top_logprobs")
SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "stop",
)
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def _text(content, where: str) -> str:
    """A message's content: a string, or text parts (`input_text`, `output_text`)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{where} must be a string or an array of content parts", where, "invalid_type")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise bad(f"{where}[{j}]: {kind!r} parts are not supported by this server (text only)", f"{where}[{j}]")
        texts.append(part["text"])
    return "".join(texts)


def parse_input(body: dict) -> list[dict]:
    """`instructions` and `input` as the chat template's messages: a `function_call` joins the assistant turn
    before it (or opens one), its output is a `tool` message."""
    value = body.get("input")
    out = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("instructions must be a string", "instructions", "invalid_type")
        out.append({"role": "system", "content": instructions})
    if isinstance(value, str):
        return [*out, {"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad("input must be a string or a non-empty array of items", "input", "invalid_type")
    for i, item in enumerate(value):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in ROLES:
            out.append({"role": ROLES[item["role"]], "content": _text(item.get("content", ""), f"{where}.content")})
        elif kind == "function_call":
            name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments", "{}")
            if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, str):
                raise bad(f"{where}: a function_call needs a name, a call_id and arguments as a string", where)
            try:
                parsed = json.loads(arguments or "{}")
            except ValueError:
                raise bad(f"{where}.arguments is not JSON", f"{where}.arguments") from None
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad(f"{where}.call_id must be a string: the call answered", f"{where}.call_id")
            output = item.get("output", "")
            content = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "content": content, "tool_call_id": item["call_id"]})
        elif kind == "reasoning":
            continue  # an earlier turn's reasoning: not shown to the model again
        elif kind == "message":
            raise bad(f"{where}.role must be user, system, developer or assistant", f"{where}.role")
        else:
            raise bad(f"{where}: {kind!r} items are not supported by this server", where)
    return named_results(out)


def _tools(body: dict):
    """Function tools (flat, as the Responses API lists them) and `tool_choice`, through chat's parser."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise bad("tools must be an array", "tools", "invalid_type")
    listed = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise bad(f"tools[{i}]: {kind!r} tools are not supported by this server (function tools only)", "tools")
        function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        listed.append({"type": "function", "function": function})
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    try:
        return parse_tools(
            {"tools": listed, "tool_choice": choice, "parallel_tool_calls": body.get("parallel_tool_calls")}
        )
    except ToolError as exc:
        raise bad(str(exc), exc.param, exc.code) from None


def _format(text) -> dict | None:
    """`text.format` as chat completions' `response_format`."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        raise bad("text must be an object with a format object", "text", "invalid_type")
    if fmt.get("type") != "json_schema":
        return fmt
    spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}


def parse_request(body: dict, defaults) -> ChatRequest:
    """A decoded /v1/responses body → a validated `ChatRequest`; raises `APIError` (400)."""
    if body.get("store") is True:
        raise bad(
            "store is not supported: nothing is kept between requests (send store: false)",
            "store",
            "unsupported_parameter",
        )
    if body.get("previous_response_id") is not None:
        raise bad(
            "previous_response_id is not supported: nothing is kept between requests (send the whole "
            "conversation as input)",
            "previous_response_id",
            "unsupported_parameter",
        )
    for name in REFUSED:
        if body.get(name) not in (None, False):
            raise bad(f"{name} is not supported by this server", name, "unsupported_parameter")
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        raise bad("reasoning.effort is not supported by this server", "reasoning.effort", "unsupported_parameter")
    messages = parse_input(body)
    extra = {}
    tools = _tools(body)
    if tools is not None:
        extra["tools"] = tools
    fields = {k: body[k] for k in SAMPLING if k in body}
    if body.get("max_output_tokens") is not None:
        fields["max_tokens"] = schema.number(body, "max_output_tokens", integer=True)
    fmt = schema._response_format(_format(body.get("text")))
    if fmt is not None:
        extra["response_format"] = fmt
    try:
        params = schema.sampling_params(fields, defaults, extra)
    except schema.APIError as exc:
        if exc.param == "max_tokens":
            exc.param, exc.message = "max_output_tokens", exc.message.replace("max_tokens", "max_output_tokens")
        raise
    stream, _ = schema.streaming({"stream": body.get("stream")})
    return ChatRequest(messages, params, stream, truncate=schema._truncation(body.get("truncation")))
