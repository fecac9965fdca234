"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, on the same engine,
slots, prefix cache, grammar and tools as chat completions (a `Job` of the generation worker).

The request: `model`, `max_tokens` (required, as Anthropic's), `messages` (user and assistant turns; content
a string or blocks: `text`, an assistant's `tool_use`, a user's `tool_result`; an earlier turn's `thinking`
blocks are dropped, as Anthropic drops them), `system` (a string or text blocks), `stop_sequences`,
`temperature`, `top_p`, `top_k` (which the SDK sends in `extra_body` since 2.x), `stream`, `tools` (`name`,
`description`, `input_schema`) and `tool_choice` (`auto`, `any`, `tool` with its `name`, `none`;
`disable_parallel_tool_use`), `output_config.format` (a JSON schema the reply is held to, by the same grammar
as `response_format`). `metadata`, `thinking`, `cache_control` (the prefix cache is automatic),
`service_tier` and `speed` are accepted: a reasoning model reasons as its template says. Blocks this server cannot read
(images, documents), Anthropic's server tools (`web_search_…`, `bash_…`), `mcp_servers`, `container`, and
an assistant turn last (a prefill to continue) are 400s naming them.

The reply is a `message`: a reasoning model's `<think>` block as a `thinking` block, the text as a `text`
block, each call as a `tool_use` block (`input` an object); `stop_reason` `end_turn`, `max_tokens`,
`stop_sequence` (with the `stop_sequence` that ended it) or `tool_use`; `usage` with `input_tokens` (those
prefilled), `cache_read_input_tokens` (read from the KV cache) and `output_tokens`. Streamed, Anthropic's
event sequence: `message_start`, `ping`, per block `content_block_start`, its deltas (`text_delta`,
`thinking_delta` then `signature_delta`, `input_json_delta`) and `content_block_stop`, then `message_delta`
(the stop reason and output tokens) and `message_stop`; an error mid-stream is an `error` event.
Errors are Anthropic's shape (`peers`).
"""

from __future__ import annotations

import json
import uuid

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chatcli.chat.reasoning import THINKING
from chatcli.engine import ChatTemplateError, Finished, Prefilled, ResponseFormat, new_call_id
from chatcli.server import schema
from chatcli.server.guard import cache_space
from chatcli.server.peers import anthropic_error
from chatcli.server.replies import CALL, END, FAILED, TEXT, PeerResponse, Whole
from chatcli.server.schema import APIError, ChatRequest, bad
from chatcli.server.serving import Service
from chatcli.server.tools import ToolError, named_results, parse_tools

PATH = "/v1/messages"
REFUSED = ("mcp_servers", "container")  # fields that would change the reply, which this server does not do
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def _text(value, where: str) -> str:
    """A string, or text blocks (a `tool_result`'s content, `system`), as one string."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad(f"{where} must be a string or an array of text blocks", where, "invalid_type")
    texts = []
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else None
            raise bad(f"{where}[{j}]: only text blocks are supported here, not {kind!r}", f"{where}[{j}]")
        texts.append(block["text"])
    return "".join(texts)


def _blocks(value, where: str) -> list[dict]:
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise bad(f"{where} must be a string or an array of content blocks", where, "invalid_type")
    if not all(isinstance(b, dict) for b in value):
        raise bad(f"{where}: each content block must be an object", where, "invalid_type")
    return value


def _turn(msg, i: int) -> list[dict]:
    """One Anthropic message → the chat template's messages: a user turn's tool results as `tool`
    messages, then its text; an assistant turn's text and its `tool_use` blocks as `tool_calls`."""
    where = f"messages[{i}]"
    if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
        raise bad(f"{where}.role must be user or assistant", f"{where}.role")
    role, texts, calls, results = msg["role"], [], [], []
    for j, block in enumerate(_blocks(msg.get("content"), f"{where}.content")):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # an earlier turn's reasoning: not shown to the model again, as Anthropic's API does
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise bad(f"{at}: a tool_use block needs a name and an input object", at, "invalid_type")
            call = {"type": "function", "function": {"name": block["name"], "arguments": block.get("input", {})}}
            calls.append({"id": block["id"], **call} if isinstance(block.get("id"), str) else call)
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise bad(f"{at}.tool_use_id must be a string: the id of the tool_use answered", at)
            content = _text(block.get("content", ""), f"{at}.content")
            content = f"Error: {content}" if block.get("is_error") is True else content
            results.append({"role": "tool", "content": content, "tool_call_id": block["tool_use_id"]})
        else:
            raise bad(f"{at}: {kind!r} blocks are not supported in a {role} message by this server", at)
    text = "".join(texts)
    if role == "assistant":
        return [{"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}]
    return results + ([{"role": "user", "content": text}] if texts or not results else [])


def parse_messages(body: dict) -> list[dict]:
    """`system` and `messages` as the chat template's messages."""
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise bad("messages must be a non-empty array", "messages", "invalid_type")
    system = body.get("system")
    out = [] if system in (None, "", []) else [{"role": "system", "content": _text(system, "system")}]
    for i, msg in enumerate(turns):
        out += _turn(msg, i)
    if out[-1]["role"] == "assistant":
        raise bad("the last message is the assistant's: continuing a prefilled reply is not supported", "messages")
    return named_results(out)


def _tools(body: dict):
    """Anthropic's `tools` and `tool_choice` as the engine's `ToolCalls` (through OpenAI's parser)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise bad("tools must be an array", "tools", "invalid_type")
    listed = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise bad(f"tools[{i}]: {kind!r} tools are not supported by this server (custom tools only)", "tools")
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        listed.append({"type": "function", "function": function})
    openai = {"tools": listed}
    if choice is not None:
        if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
            raise bad('tool_choice must be {"type": "auto" | "any" | "tool" | "none"}', "tool_choice")
        kind = choice["type"]
        named = {"type": "function", "function": {"name": choice.get("name")}}
        openai["tool_choice"] = {"any": "required", "tool": named}.get(kind, kind)
        if choice.get("disable_parallel_tool_use") is True:
            openai["parallel_tool_calls"] = False
    try:
        return parse_tools(openai)
    except ToolError as exc:
        raise bad(str(exc), exc.param, exc.code) from None


def _output_format(config) -> ResponseFormat | None:
    """`output_config.format` (`{"type": "json_schema", "schema"}`: structured outputs) as a response format
    the reply is held to; `effort` is refused, as chat completions' `reasoning_effort` is."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise bad("output_config must be an object", "output_config", "invalid_type")
    if config.get("effort") is not None:
        raise bad(
            "output_config.effort is not supported by this server", "output_config.effort", "unsupported_parameter"
        )
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise bad('output_config.format must be {"type": "json_schema", "schema": {...}}', "output_config.format")
    return ResponseFormat.json_schema(fmt["schema"], "", True)


def parse_request(body: dict, defaults) -> ChatRequest:
    """A decoded /v1/messages body → a validated `ChatRequest`; raises `APIError` (400)."""
    max_tokens = schema.number(body, "max_tokens", integer=True)
    if max_tokens is None:
        raise bad("max_tokens: field required", "max_tokens", "missing_required_parameter")
    for name in REFUSED:
        if body.get(name) not in (None, [], {}):
            raise bad(f"{name} is not supported by this server", name, "unsupported_parameter")
    messages = parse_messages(body)
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
        raise bad("stop_sequences must be an array of strings", "stop_sequences", "invalid_type")
    extra = {"stop": tuple(s for s in stops or () if s)}
    tools = _tools(body)
    if tools is not None:
        extra["tools"] = tools
    fmt = _output_format(body.get("output_config"))
    if fmt is not None:
        extra["response_format"] = fmt
    sampling = {k: body.get(k) for k in ("temperature", "top_p", "top_k")}
    params = schema.sampling_params({**sampling, "max_tokens": max_tokens}, defaults, extra)
    stream, _ = schema.streaming({"stream": body.get("stream")})
    return ChatRequest(messages, params, stream)


def usage(first: Prefilled, done: Finished | None) -> dict:
    """Anthropic's usage: the prompt's tokens prefilled, those read from the cache, the reply's."""
    return {
        "input_tokens": first.prompt_tokens - first.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": first.cached_tokens,
        "output_tokens": done.stats.completion_tokens if done is not None else 0,
    }


def _sse(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n".encode()


class MessageResponse(PeerResponse):
    path = PATH

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cid = "msg_" + uuid.uuid4().hex[:24]

    def _stop(self, done: Finished, calls: bool) -> tuple[str, str | None]:
        reason = schema.finish_reason(done.finish_reason, calls)
        if reason == "stop" and done.stop is not None:
            return "stop_sequence", done.stop
        return STOP_REASONS.get(reason, "end_turn"), None

    def _tool_use(self, call) -> dict:
        return {"type": "tool_use", "id": new_call_id(self.syntax), "name": call.name, "input": {}}

    def _message(self, content: list, first: Prefilled, done: Finished | None, calls: bool = False) -> dict:
        reason, stop = self._stop(done, calls) if done is not None else (None, None)
        return {"id": self.cid, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": stop, "usage": usage(first, done)}  # fmt: skip

    def _body(self, first: Prefilled, done: Finished, whole: Whole) -> dict:
        content = [] if whole.thinking is None else [{"type": "thinking", "thinking": whole.thinking, "signature": ""}]
        if whole.text or not (whole.calls or content):
            content.append({"type": "text", "text": whole.text})
        for call in whole.calls:
            content.append({**self._tool_use(call), "input": json.loads(call.arguments)})
        return self._message(content, first, done, bool(whole.calls))

    async def _stream(self, first: Prefilled, events, send) -> None:
        await self._open(send, b"text/event-stream; charset=utf-8")
        await self._write(send, _sse("message_start", {"message": self._message([], first, None)}))
        await self._write(send, _sse("ping", {}))
        index, open_kind, calls = -1, None, 0

        async def close() -> None:
            if open_kind == THINKING:
                await self._write(send, _sse("content_block_delta", {"index": index, "delta": {
                    "type": "signature_delta", "signature": ""}}))  # fmt: skip
            if open_kind is not None:
                await self._write(send, _sse("content_block_stop", {"index": index}))

        async for kind, value in self._items(first, events):
            if kind == FAILED:
                await close()
                await self._write(send, f"event: error\ndata: {json.dumps(anthropic_error(value))}\n\n".encode())
                break
            if kind == END:
                await close()
                reason, stop = self._stop(value, calls > 0)
                delta = {"stop_reason": reason, "stop_sequence": stop}
                await self._write(send, _sse("message_delta", {"delta": delta, "usage": usage(first, value)}))
                await self._write(send, _sse("message_stop", {}))
                break
            if kind != open_kind or kind == CALL:
                await close()
                index, open_kind = index + 1, kind
                block = {THINKING: {"type": "thinking", "thinking": "", "signature": ""},
                         TEXT: {"type": "text", "text": ""}}.get(kind) or self._tool_use(value)  # fmt: skip
                await self._write(send, _sse("content_block_start", {"index": index, "content_block": block}))
            if kind == CALL:
                calls += 1
                delta = {"type": "input_json_delta", "partial_json": value.arguments}
            else:
                delta = {"type": "thinking_delta", "thinking": value} if kind == THINKING else {
                    "type": "text_delta", "text": value}  # fmt: skip
            await self._write(send, _sse("content_block_delta", {"index": index, "delta": delta}))
        await self._close(send)


def routes(service: Service) -> list[Route]:
    async def messages(request: Request) -> Response:
        b = service.backend()
        body = await service.read_object(request)
        service.check_model(body.get("model"))
        request_ = parse_request(body, service.defaults)
        await service.check_params(b.engine, request_.params)
        space = cache_space(request.scope["headers"], None)
        return MessageResponse(request_, b.worker, b.engine.name, b.tokenizer, space=space)

    async def count_tokens(request: Request) -> Response:
        b = service.backend()
        body = await service.read_object(request)
        service.check_model(body.get("model"))
        messages, tools = parse_messages(body), _tools(body)
        if b.tokenizer is None:
            raise APIError(400, "count_tokens needs the in-process engine", "messages", "unsupported_parameter")
        offered = None if tools is None else tools.offered()
        try:
            ids = await anyio.to_thread.run_sync(b.tokenizer.encode_chat, messages, offered)
        except ChatTemplateError as exc:
            raise APIError(400, str(exc), "messages") from None
        return JSONResponse({"input_tokens": len(ids)})

    return [
        Route(PATH, messages, methods=["POST"]),
        Route(PATH + "/count_tokens", count_tokens, methods=["POST"]),
    ]
