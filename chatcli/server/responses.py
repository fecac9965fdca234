"""OpenAI's Responses API: `POST /v1/responses` (and `/responses`), on the same engine, slots, prefix cache,
grammar and tools as chat completions (a `Job` of the generation worker).

The request: `input` (a string, or items: messages of roles user, system, developer and assistant with text
parts, `function_call` items and their `function_call_output`; earlier `reasoning` items are dropped),
`instructions` (the system prompt), `tools` (function tools: `name`, `description`, `parameters`),
`tool_choice`, `parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p` (and chat completions'
extensions: `top_k`, `min_p`, `seed`, …), `text.format` (`json_object`, `json_schema`: held by the grammar,
so `responses.parse` works), `truncation`, `stream`. Nothing is kept between requests: `store: true` and
`previous_response_id` are 400s naming them (send the whole conversation as `input`, with `store: false`);
so are other tools (web search, file search, …), non-text parts, `background`, `conversation`, `prompt`,
`reasoning.effort` and `top_logprobs`.

The reply is a `response`: a reasoning model's `<think>` block as a `reasoning` item (its text as
`reasoning_text` content), the text as a `message` item of `output_text`, each call as a `function_call` item;
`status` `completed`, or `incomplete` (`incomplete_details.reason: "max_output_tokens"`) where it was cut;
`usage` with `input_tokens_details.cached_tokens`. Streamed: `response.created`, `response.in_progress`, per
item `response.output_item.added`, its parts and deltas (`response.content_part.added`,
`response.output_text.delta`/`.done`, `response.content_part.done`; `response.reasoning_text.delta`/`.done`;
`response.function_call_arguments.delta`/`.done`) and `response.output_item.done`, then `response.completed`
(or `response.incomplete`); each event with its `sequence_number`.
"""

from __future__ import annotations

import json
import time
import uuid

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from chatcli.chat.reasoning import THINKING
from chatcli.engine import Finished, Prefilled, new_call_id
from chatcli.server import schema
from chatcli.server.guard import cache_space
from chatcli.server.replies import CALL, END, FAILED, PeerResponse, Whole
from chatcli.server.responses_request import parse_request
from chatcli.server.schema import ChatRequest
from chatcli.server.serving import Service


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesResponse(PeerResponse):
    path = "/v1/responses"

    def __init__(self, request: ChatRequest, body: dict, *args, **kwargs) -> None:
        super().__init__(request, *args, **kwargs)
        self.cid, self.body, self.sequence = _item_id("resp"), body, 0
        self.created = time.time()

    def _call_item(self, call, status: str = "completed") -> dict:
        return {
            "type": "function_call",
            "id": _item_id("fc"),
            "call_id": new_call_id(self.syntax),
            "name": call.name,
            "arguments": call.arguments,
            "status": status,
        }

    @staticmethod
    def _message(text: str, status: str = "completed") -> dict:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {
            "type": "message",
            "id": _item_id("msg"),
            "status": status,
            "role": "assistant",
            "content": [part] if status == "completed" else [],
        }

    @staticmethod
    def _reasoning(text: str) -> dict:
        return {
            "type": "reasoning",
            "id": _item_id("rs"),
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
        }

    def _response(self, output: list, first: Prefilled, done: Finished | None) -> dict:
        params = self.request.params
        cut = done is not None and schema.finish_reason(done.finish_reason) == "length"
        status = "in_progress" if done is None else "incomplete" if cut else "completed"
        b = self.body
        out = {
            "id": self.cid,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": b.get("instructions"),
            "max_output_tokens": b.get("max_output_tokens"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": b.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": params.temperature,
            "text": b.get("text") or {"format": {"type": "text"}},
            "tool_choice": b.get("tool_choice") or "auto",
            "tools": b.get("tools") or [],
            "top_p": params.top_p,
            "truncation": b.get("truncation") or "auto",
            "metadata": b.get("metadata") or {},
            "usage": None,
        }
        if done is not None:
            n, cached = done.stats.completion_tokens, first.cached_tokens
            out["usage"] = {
                "input_tokens": first.prompt_tokens,
                "output_tokens": n,
                "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": first.prompt_tokens + n,
            }
        return out

    def _body(self, first: Prefilled, done: Finished, whole: Whole) -> dict:
        output = [] if whole.thinking is None else [self._reasoning(whole.thinking)]
        if whole.text or not (whole.calls or output):
            output.append(self._message(whole.text))
        return self._response(output + [self._call_item(c) for c in whole.calls], first, done)

    async def _event(self, send, kind: str, **data) -> None:
        payload = json.dumps({"type": kind, "sequence_number": self.sequence, **data}, ensure_ascii=False)
        self.sequence += 1
        await self._write(send, f"event: {kind}\ndata: {payload}\n\n".encode())

    async def _stream(self, first: Prefilled, events, send) -> None:
        await self._open(send, b"text/event-stream; charset=utf-8")
        await self._event(send, "response.created", response=self._response([], first, None))
        await self._event(send, "response.in_progress", response=self._response([], first, None))
        output: list[dict] = []
        open_kind, text = None, ""

        async def close() -> None:
            if open_kind is None:
                return
            item, at = output[-1], len(output) - 1
            if open_kind == THINKING:
                item["content"] = [{"type": "reasoning_text", "text": text}]
                await self._event(
                    send,
                    "response.reasoning_text.done",
                    item_id=item["id"],
                    output_index=at,
                    content_index=0,
                    text=text,
                )
            else:
                part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                item["content"], item["status"] = [part], "completed"
                await self._event(
                    send,
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=at,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
                await self._event(
                    send, "response.content_part.done", item_id=item["id"], output_index=at, content_index=0, part=part
                )
            await self._event(send, "response.output_item.done", output_index=at, item=item)

        async for kind, value in self._items(first, events):
            if kind == FAILED:
                await close()
                failed = self._response(output, first, None)
                failed["status"], failed["error"] = (
                    "failed",
                    {"code": value.code or "server_error", "message": value.message},
                )
                await self._event(send, "response.failed", response=failed)
                break
            if kind == END:
                await close()
                whole = self._response(output, first, value)
                await self._event(send, f"response.{whole['status']}", response=whole)
                break
            if kind == CALL:
                await close()
                open_kind, item = None, self._call_item(value, "in_progress")
                output.append({**item, "arguments": ""})
                at = len(output) - 1
                await self._event(send, "response.output_item.added", output_index=at, item=output[-1])
                await self._event(
                    send,
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=at,
                    delta=value.arguments,
                )
                await self._event(
                    send,
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=at,
                    arguments=value.arguments,
                    name=value.name,
                )
                output[-1] = {**item, "status": "completed"}
                await self._event(send, "response.output_item.done", output_index=at, item=output[-1])
                continue
            if kind != open_kind:
                await close()
                open_kind, text = kind, ""
                output.append(self._reasoning("") if kind == THINKING else self._message("", "in_progress"))
                item, at = output[-1], len(output) - 1
                if kind == THINKING:
                    item["content"] = []
                await self._event(send, "response.output_item.added", output_index=at, item=item)
                if kind != THINKING:
                    await self._event(
                        send,
                        "response.content_part.added",
                        item_id=item["id"],
                        output_index=at,
                        content_index=0,
                        part={"type": "output_text", "text": "", "annotations": []},
                    )
            text += value
            name = "response.reasoning_text.delta" if kind == THINKING else "response.output_text.delta"
            extra = {} if kind == THINKING else {"logprobs": []}
            await self._event(
                send,
                name,
                item_id=output[-1]["id"],
                output_index=len(output) - 1,
                content_index=0,
                delta=value,
                **extra,
            )
        await self._close(send)


def routes(service: Service) -> list[Route]:
    async def responses(request: Request) -> Response:
        b = service.backend()
        body = await service.read_object(request)
        service.check_model(body.get("model"))
        request_ = parse_request(body, service.defaults)
        await service.check_params(b.engine, request_.params)
        space = cache_space(request.scope["headers"], None)
        return ResponsesResponse(request_, body, b.worker, b.engine.name, b.tokenizer, space=space)

    return [Route(prefix + "/responses", responses, methods=["POST"]) for prefix in ("/v1", "")]
