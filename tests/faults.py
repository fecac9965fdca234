"""A small OpenAI-shaped server that fails on purpose, one way per URL prefix: the faults a remote
engine meets (`/{scenario}/v1/models`, `/{scenario}/v1/chat/completions`).

    ok          streams "Hello", " world" and a usage chunk without cached tokens
    unauthorized, missing, ratelimited, unavailable   401, 404, 429 and 503 (with Retry-After)
    slow        answers after 5 s (for a client timeout)
    cut         two chunks, then the connection drops mid-body
    malformed   one chunk, then an event that is not JSON
    fussy       400 naming `top_k` when the request has the non-OpenAI sampling fields, then one naming
                `logprobs` when it asks for them
    endless     a chunk every 10 ms until the client leaves (`state.left` is set then)
    empty       /models lists nothing;  html   /models answers a web page

And a hostile (or broken) server, each one shape OpenAI's API never sends (`HOSTILE`, `shapeless`):

    content5, notalist, badchoice, badtools, badusage, deep, notjson-first   a chunk of the wrong shape
    endlessline a `data:` line that never ends (64 KiB at a time until the client leaves)
    overrun     200,000 chunks, whatever max_tokens said (until the client leaves)
    listerror   a 500 whose body is a JSON list;  modelsshape, models5   /models of the wrong shape
"""

from __future__ import annotations

import asyncio
import json
import threading

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.routing import Route

MODEL = "fault-model"


def _chunk(content: str | None = None, reason: str | None = None, usage: dict | None = None) -> bytes:
    body: dict = {"id": "x", "object": "chat.completion.chunk", "model": MODEL}
    body["choices"] = (
        []
        if content is None and reason is None
        else [{"index": 0, "delta": {"content": content} if content else {}, "finish_reason": reason}]
    )
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "error"}}, status_code=status, headers=headers)


def _raw(body) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


_OK = {"id": "x", "object": "chat.completion.chunk", "model": MODEL}
HOSTILE = {  # scenario: the events after one good chunk ("Hello"), or first where named `-first`
    "content5": [_raw({**_OK, "choices": [{"index": 0, "delta": {"content": 5}}]})],
    "notalist": [_raw({**_OK, "choices": "notalist"})],
    "badchoice": [_raw({**_OK, "choices": [5]})],
    "badtools": [_raw({**_OK, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": "first"}]}}]})],
    "badusage": [_chunk(reason="stop"), _raw({**_OK, "choices": [], "usage": {"prompt_tokens": "many"}})],
    "deep": [b"data: " + b"[" * 200_000 + b"\n\n"],
}
FIRST = {"notjson-first": [b"data: [1, 2\n\n"], "content5-first": HOSTILE["content5"]}


class State:
    def __init__(self) -> None:
        self.left = threading.Event()  # the endless stream's client went away
        self.sent_all = threading.Event()  # an endless scenario sent all it had: the client never left
        self.bodies: list[dict] = []  # every chat request, as sent


def fault_app() -> Starlette:
    state = State()

    async def models(request: Request):
        scenario = request.path_params["scenario"]
        if scenario == "empty":
            return JSONResponse({"object": "list", "data": []})
        if scenario == "html":
            return HTMLResponse("<html>not an API</html>")
        if scenario == "unauthorized":
            return _error(401, "Incorrect API key provided")
        if scenario == "modelsshape":
            return JSONResponse({"object": "list", "data": "everything"})
        if scenario == "models5":
            return JSONResponse({"object": "list", "data": [{"id": 5}]})
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 4096}]})

    async def chat(request: Request):
        scenario = request.path_params["scenario"]
        body = await request.json()
        state.bodies.append(body)
        if scenario == "unauthorized":
            return _error(401, "Incorrect API key provided")
        if scenario == "missing":
            return _error(404, f"The model `{body.get('model')}` does not exist")
        if scenario == "ratelimited":
            return _error(429, "Rate limit reached", {"Retry-After": "7"})
        if scenario == "unavailable":
            return _error(503, "The server is loading the model", {"Retry-After": "30"})
        if scenario == "slow":
            await asyncio.sleep(5)
        if scenario == "fussy" and "top_k" in body:
            return _error(400, "Unrecognized request argument supplied: top_k")
        if scenario == "fussy" and "logprobs" in body:
            return _error(400, "logprobs are not supported by this model")
        if scenario == "listerror":
            return JSONResponse(["no", "object"], status_code=500)

        async def events():
            if scenario == "endless":
                try:
                    while True:
                        yield _chunk("la ")
                        await asyncio.sleep(0.01)
                finally:
                    state.left.set()
            if scenario in ("endlessline", "overrun"):
                try:
                    yield _chunk("Hello") if scenario == "overrun" else b"data: "
                    for _ in range(200_000):
                        yield _chunk(" la") if scenario == "overrun" else b"a" * 65536
                        await asyncio.sleep(0)
                    state.sent_all.set()
                finally:
                    state.left.set()
                return
            if scenario in FIRST:
                for event in FIRST[scenario]:
                    yield event
                return
            yield _chunk("Hello")
            if scenario in HOSTILE:
                for event in HOSTILE[scenario]:
                    yield event
                return
            if scenario == "malformed":
                yield b"data: {this is not json\n\n"
                return
            yield _chunk(" world")
            if scenario == "cut":
                raise ConnectionResetError("the server went away")  # uvicorn drops the connection mid-body
            yield _chunk(reason="stop")
            yield _chunk(usage={"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = scenario_app(models, chat)
    app.state.faults = state
    return app


def scenario_app(models, chat) -> Starlette:
    """An app that answers `/{scenario}/v1/models` and `/{scenario}/v1/chat/completions` with these handlers."""
    return Starlette(
        routes=[
            Route("/{scenario}/v1/models", models, methods=["GET"]),
            Route("/{scenario}/v1/chat/completions", chat, methods=["POST"]),
        ]
    )
