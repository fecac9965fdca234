"""Ollama's generation API: `POST /api/chat` and `POST /api/generate`, on the same engine, slots, prefix
cache, grammar and tools as chat completions (a `Job` of the generation worker); the model's listing is
`ollama_models`, `/api/embed` is `embeddings`.

The request: `model` (required, as Ollama's; `NAME:latest` is NAME), `messages` (roles system, user,
assistant, tool; an assistant's `tool_calls`, a tool result's `tool_name`; an earlier turn's `thinking` is
dropped) or `prompt` with `system` (`raw: true`: the prompt as it is, no template), `stream` (true unless
false, as Ollama's: NDJSON, a line a piece, the last `done: true` with the stats), `options` (`num_predict`,
-1 or -2: to the context's end; `temperature`, `top_k`, `top_p`, `min_p`, `seed`, `stop`, `repeat_penalty`,
`repeat_last_n`, `presence_penalty`, `frequency_penalty`; `num_ctx` and the load-time options are accepted:
the context is the one the model was loaded with), `format` (`"json"` or a JSON schema, held by the grammar),
`tools` (OpenAI's shape), `keep_alive` and `think` (accepted: the model stays loaded, and a reasoning model's
`<think>` block comes back as `thinking`). Options that would change the reply and are not done here
(`mirostat`, `typical_p`, `tfs_z` other than their no-op values), `images`, `suffix`, `template` and a
`context` are 400s naming them. Errors are Ollama's `{"error": "..."}` (`peers`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chatcli.chat.reasoning import THINKING
from chatcli.engine import Finished, Prefilled, ResponseFormat
from chatcli.server import schema
from chatcli.server.guard import cache_space
from chatcli.server.legacy import TextRequest
from chatcli.server.replies import CALL, END, FAILED, PeerResponse, Whole
from chatcli.server.schema import APIError, ChatRequest, bad
from chatcli.server.serving import Service
from chatcli.server.tools import ToolError, named_results, parse_tools
from chatcli.server.worker import Job

PATH = "/api/chat"
OPTIONS = {  # Ollama's option → the request field the sampling parameters are read from
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "seed": "seed",
    "repeat_penalty": "repeat_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
NO_OPS = {"mirostat": 0, "typical_p": 1, "tfs_z": 1}  # options whose other values change the reply: not done here


def model_name(service: Service, body: dict) -> str:
    """The model a request names (required, as Ollama's); `NAME:latest` is NAME, as Ollama reads it."""
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise bad("model is required", "model", "missing_required_parameter")
    if name not in service.names() and name.endswith(":latest"):
        service.check_model(name.removesuffix(":latest"))
        return name
    return service.check_model(name)


def created_at() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _options(body: dict, context: int) -> tuple[dict, dict]:
    """`options` as the request fields of chat completions' sampling, and the changes set directly."""
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise bad("options must be an object", "options", "invalid_type")
    for name, value in NO_OPS.items():
        if options.get(name) not in (None, value):
            raise bad(f"options.{name} is not supported by this server", f"options.{name}", "unsupported_parameter")
    fields = {OPTIONS[k]: v for k, v in options.items() if k in OPTIONS}
    extra = {}
    predict = schema.number(options, "num_predict", integer=True)
    if predict is not None:
        fields["max_tokens"] = context if predict < 0 else predict  # -1, -2: to the context's end
    stops = options.get("stop")
    if stops is not None:
        if isinstance(stops, str):
            stops = [stops]
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise bad("options.stop must be an array of strings", "options.stop", "invalid_type")
        extra["stop"] = tuple(s for s in stops if s)
    last_n = schema.number(options, "repeat_last_n", integer=True)
    if last_n is not None:
        extra["repeat_last_n"] = context if last_n < 0 else last_n
    return fields, extra


def _format(value) -> ResponseFormat | None:
    if value in (None, ""):
        return None
    if value == "json":
        return ResponseFormat("json_object")
    if isinstance(value, dict):
        return ResponseFormat.json_schema(value, "", True)
    raise bad('format must be "json" or a JSON schema object', "format")


def _refuse(body: dict, *names: str) -> None:
    for name in names:
        if body.get(name) not in (None, "", [], False):
            raise bad(f"{name} is not supported by this server", name, "unsupported_parameter")


def sampling(body: dict, defaults, context: int, tools=None):
    """The request's options, `format` and tools as SamplingParams over the server's defaults."""
    fields, extra = _options(body, context)
    fmt = _format(body.get("format"))
    if fmt is not None:
        extra["response_format"] = fmt
    if tools is not None:
        extra["tools"] = tools
    return schema.sampling_params(fields, defaults, extra)


def stream_flag(body: dict) -> bool:
    """Ollama streams unless told not to."""
    stream, _ = schema.streaming({"stream": True if body.get("stream") is None else body.get("stream")})
    return stream


def parse_messages(value) -> list[dict]:
    """Ollama's messages as the chat template's: an assistant's calls given ids (by position: the same ids
    each time the conversation is sent, so its prefix stays cached), each tool result the id of its call."""
    if not isinstance(value, list) or not value:
        raise bad("messages must be a non-empty array", "messages", "invalid_type")
    out, pending, n = [], [], 0
    for i, msg in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "user", "assistant", "tool"):
            raise bad(f"{where}.role must be system, user, assistant or tool", f"{where}.role")
        _refuse(msg, "images")
        content = msg.get("content") or ""
        if not isinstance(content, str):
            raise bad(f"{where}.content must be a string", f"{where}.content", "invalid_type")
        item = {"role": msg["role"], "content": content}
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            calls = msg["tool_calls"]
            if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
                raise bad(f"{where}.tool_calls must be an array of calls", f"{where}.tool_calls", "invalid_type")
            item["tool_calls"], pending = [], []
            for j, call in enumerate(calls):
                function = call.get("function")
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise bad(f"{where}.tool_calls[{j}] must be a function call with a name", f"{where}.tool_calls")
                arguments = function.get("arguments") or {}
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments)
                    except ValueError:
                        raise bad(f"{where}.tool_calls[{j}].function.arguments is not JSON", where) from None
                n += 1
                call_id = f"{n:09d}"  # 9 digits: the ids Mistral's templates take, as any other's
                fn = {"name": function["name"], "arguments": arguments}
                item["tool_calls"].append({"id": call_id, "type": "function", "function": fn})
                pending.append(call_id)
        elif msg["role"] == "tool":
            item["tool_call_id"] = pending.pop(0) if pending else f"{n:09d}"
            if isinstance(msg.get("tool_name"), str):
                item["name"] = msg["tool_name"]
        out.append(item)
    return named_results(out)


def _tools(body: dict):
    try:
        return parse_tools({"tools": body.get("tools")})
    except ToolError as exc:
        raise bad(str(exc), exc.param, exc.code) from None


def stats(first: Prefilled, done: Finished) -> dict:
    """Ollama's closing numbers: durations in nanoseconds, the prompt's tokens and the reply's."""
    total = done.stats.total_s or 0.0
    return {
        "total_duration": int(total * 1e9),
        "load_duration": 0,
        "prompt_eval_count": first.prompt_tokens,
        "prompt_eval_duration": int(first.prefill_s * 1e9),
        "eval_count": done.stats.completion_tokens,
        "eval_duration": int(max(0.0, total - first.prefill_s) * 1e9),
    }


class ChatResponse(PeerResponse):
    """`/api/chat`'s answer: one object, or NDJSON lines as the reply streams."""

    path = PATH
    field = "message"  # where a line's text goes: the message (chat) or `response` (generate)

    def _line(self, text: str = "", thinking: str | None = None, calls: list | None = None, done=None) -> dict:
        out = {"model": self.model, "created_at": created_at()}
        message = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = [{"function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                     for c in calls]  # fmt: skip
        out[self.field] = message
        out["done"] = done is not None
        if done is not None:
            out["done_reason"] = "length" if schema.finish_reason(done[1].finish_reason) == "length" else "stop"
            out.update(stats(*done))
        return out

    def _body(self, first: Prefilled, done: Finished, whole: Whole) -> dict:
        return self._line(whole.text, whole.thinking, whole.calls, (first, done))

    async def _stream(self, first: Prefilled, events, send) -> None:
        await self._open(send, b"application/x-ndjson")

        async def line(obj: dict) -> None:
            await self._write(send, json.dumps(obj, ensure_ascii=False).encode() + b"\n")

        async for kind, value in self._items(first, events):
            if kind == FAILED:
                await line({"error": value.message})
            elif kind == END:
                await line(self._line(done=(first, value)))
            elif kind == CALL:
                await line(self._line(calls=[value]))
            elif kind == THINKING:
                await line(self._line(thinking=value))
            else:
                await line(self._line(value))
        await self._close(send)


class GenerateResponse(ChatResponse):
    """`/api/generate`'s answer: the text as `response`, the reasoning as `thinking`."""

    path = "/api/generate"

    def __init__(self, request, *args, ids: list[int] | None = None, **kwargs) -> None:
        super().__init__(request, *args, **kwargs)
        self.ids = ids  # raw: the prompt's ids, continued without a chat template

    def _job(self, emit) -> Job:
        if self.ids is None:
            return super()._job(emit)
        return Job([], self.request.params, emit, prompt=self.ids, space=self.space)

    def _line(self, text: str = "", thinking: str | None = None, calls: list | None = None, done=None) -> dict:
        out = super()._line(text, thinking, calls, done)
        message = out.pop(self.field)
        out = {"model": out.pop("model"), "created_at": out.pop("created_at"), "response": message["content"], **out}
        if message.get("thinking"):
            out["thinking"] = message["thinking"]
        return out


def routes(service: Service) -> list[Route]:
    async def chat(request: Request) -> Response:
        b = service.backend()
        body = await service.read_object(request)
        name = model_name(service, body)
        _refuse(body, "images")
        messages, tools = parse_messages(body.get("messages")), _tools(body)
        params = sampling(body, service.defaults, b.engine.context_limit, tools)
        await service.check_params(b.engine, params)
        chat_request = ChatRequest(messages, params, stream_flag(body))
        space = cache_space(request.scope["headers"], None)
        return ChatResponse(chat_request, b.worker, name, b.tokenizer, space=space)

    async def generate(request: Request) -> Response:
        b = service.backend()
        body = await service.read_object(request)
        name = model_name(service, body)
        _refuse(body, "images", "suffix", "template", "context")
        prompt, system = body.get("prompt") or "", body.get("system") or ""
        if not isinstance(prompt, str) or not isinstance(system, str):
            raise bad("prompt and system must be strings", "prompt", "invalid_type")
        if not prompt:  # Ollama's way to load a model: nothing to generate
            return JSONResponse({"model": name, "created_at": created_at(), "response": "", "done": True,
                                 "done_reason": "load"})  # fmt: skip
        params = sampling(body, service.defaults, b.engine.context_limit)
        await service.check_params(b.engine, params)
        space = cache_space(request.scope["headers"], None)
        if body.get("raw") is True:
            if b.tokenizer is None:
                raise APIError(400, "raw needs the in-process engine", "raw", "unsupported_parameter")
            ids = b.tokenizer.encode_prompt(prompt)
            text = TextRequest(prompt, params, stream_flag(body))
            return GenerateResponse(text, b.worker, name, b.tokenizer, ids=ids, space=space)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return GenerateResponse(ChatRequest(messages, params, stream_flag(body)), b.worker, name, b.tokenizer,
                                space=space)  # fmt: skip

    return [Route(PATH, chat, methods=["POST"]), Route("/api/generate", generate, methods=["POST"])]
