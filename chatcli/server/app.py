"""The ASGI app: OpenAI-compatible routes over an `Engine`, given or loaded in a thread meanwhile.

    POST /v1/chat/completions   chat.completion, or text/event-stream chunks then [DONE]
    POST /v1/completions        text_completion (legacy: a string prompt, no chat template), or its chunks
    GET  /v1/models             the one model this server has
    GET  /v1/models/{id}        that model, or a 404
    GET  /health                liveness, queue depth and cache pool numbers (open without the key)

`create_app(engine, ...)` builds it (tests pass the tiny engine; `chatcli serve`
the loaded model). A `GenerationWorker` runs the engine, `parallel` requests at once (its slots,
their steps batched; by default 4 where the kernel batches, else 1: `worker.slots_for`); each
response waits on its own asyncio queue, fed from its slot's thread with
`loop.call_soon_threadsafe`, while a watcher task listens for the client's
disconnect and sets the job's cancel event. Errors are OpenAI-shaped JSON:
400 for bad input, 401 without the API key, 403 for a Host a loopback server does not answer
(`allowed_hosts`: DNS rebinding), 408 for a body that takes over `BODY_TIMEOUT` s, 413 past the
body cap, 415 for a body that is not sent as JSON (a web page's form or `text/plain` post needs no
CORS preflight: only `application/json` is read), 503 (with `Retry-After`) while the model loads or
the queue is full. The connection's own timeouts are in `http.py`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chatcli.engine import Engine, GrammarError, InvalidParameter, SamplingParams, SessionPool
from chatcli.errors import one_line
from chatcli.server import schema
from chatcli.server.guard import BearerAuth, HostCheck, cache_space, error_response, status_response
from chatcli.server.legacy import TextCompletionResponse, parse_completion
from chatcli.server.respond import TRUNCATED_HEADER, CompletionResponse
from chatcli.server.schema import APIError
from chatcli.server.worker import GenerationWorker, slots_for

log = logging.getLogger("chatcli.server")

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: far more than a full context of text
DEFAULT_CACHE_BUDGET_BYTES = 1 << 30  # 1 GiB of KV cache across the pooled sessions
BODY_TIMEOUT = 30.0  # seconds a request's body may take to arrive (a stalled upload is a 408)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


async def read_body(request: Request, cap: int, timeout: float = BODY_TIMEOUT) -> bytes:
    """The request body, or a 413 as soon as it is known to pass `cap` bytes, a 408 where it takes
    over `timeout` s, and a 400 (no traceback in the log) where the client leaves while sending it."""
    too_large = APIError(413, f"the request body is over the limit of {cap} bytes", code="request_too_large")
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise APIError(400, "invalid Content-Length header")
        if int(length) > cap:
            raise too_large
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout):
            async for part in request.stream():
                size += len(part)
                if size > cap:
                    raise too_large
                chunks.append(part)
    except TimeoutError:
        raise APIError(408, f"the request body took over {timeout:g} s to arrive", code="request_timeout") from None
    except ClientDisconnect:
        log.info("a client disconnected while sending its request body")
        raise APIError(400, "the client disconnected while sending its body", code="client_disconnected") from None
    return b"".join(chunks)


def is_json(content_type: str) -> bool:
    """`application/json` (any parameters, e.g. a charset) or a `+json` type."""
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


@dataclass
class Backend:
    """What serves once the model is there: the engine, its session pool and generation worker."""

    engine: Engine
    pool: SessionPool
    worker: GenerationWorker
    tokenizer: object | None  # names the tokens of logprobs (in-process engines)


class ModelState:
    """The model a server has, is loading, or failed to load; `backend()` is what a route serves
    with, else a 503 that says which."""

    def __init__(self) -> None:
        self.ready: Backend | None = None
        self.error: str | None = None

    def backend(self) -> Backend:
        if self.ready is not None:
            return self.ready
        if self.error is not None:
            message = f"the model failed to load: {self.error}"
            raise APIError(503, message, code="model_load_failed", type="server_error")
        raise APIError(503, "the model is still loading", code="model_loading", type="server_error")

    def status(self) -> tuple[int, dict]:
        """/health's answer without the key: ok, loading or error (503 until ready, as llama-server's;
        the load's message, which may name local paths, only for the key's holder)."""
        if self.ready is not None:
            return 200, {"status": "ok"}
        return 503, {"status": "error" if self.error is not None else "loading"}


def create_app(
    engine: Engine | None,
    *,
    load: Callable[[], Engine] | None = None,
    on_load_failure: Callable[[str], None] | None = None,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    cache_budget_bytes: int = DEFAULT_CACHE_BUDGET_BYTES,
    defaults: SamplingParams | None = None,
    pool: SessionPool | None = None,
    max_pending: int = 64,
    parallel: int | None = None,
    cors_origins: tuple[str, ...] = (),
    allowed_hosts: tuple[str, ...] | None = None,
    body_timeout: float = BODY_TIMEOUT,
) -> Starlette:
    """The server for `engine`; its worker thread starts with the app's lifespan (or the first request).
    Or, with `engine` None, for the engine `load()` returns: called in a thread when the app starts,
    the routes answer 503 (`/health` {"status": "loading"}) until it is there; a load that raises
    leaves them at 503 with its message, which `on_load_failure` also gets (`chatcli serve` stops).
    `parallel`: the requests generated at once (None: `worker.slots_for`'s default).
    `cors_origins`: the web origins whose pages may call it (`*`: any); none by default.
    `allowed_hosts`: the only `Host` names answered (`HostCheck`; `chatcli serve` on loopback); None: any."""
    if (engine is None) == (load is None):
        raise ValueError("create_app takes an engine or a load function")
    defaults = defaults or SamplingParams()
    started = int(time.time())
    state = ModelState()

    def attach(found: Engine, start: bool = False) -> Backend:
        pooled = pool or SessionPool(found.new_session, cache_budget_bytes)
        worker = GenerationWorker(found, pooled, max_pending, slots_for(found, parallel))
        backend = Backend(found, pooled, worker, getattr(found, "tokenizer", None))
        app.state.engine, app.state.pool, app.state.worker = found, pooled, backend.worker
        if start:
            worker.start()  # before the routes can see it
        state.ready = backend
        return backend

    def load_in_background() -> None:
        try:
            found = load()
        except Exception as exc:  # noqa: BLE001 - LoadError, or anything else: one line to the caller
            state.error = one_line(exc)
            if on_load_failure is not None:
                on_load_failure(state.error)
            else:
                log.error("model load failed: %s", state.error)
            return
        attach(found, start=True)

    async def read_json(request: Request):
        if not is_json(request.headers.get("content-type", "")):
            raise APIError(
                415,
                "send the body as JSON, with 'Content-Type: application/json'",
                code="unsupported_media_type",
            )
        body = await read_body(request, max_body_bytes, body_timeout)
        try:
            return json.loads(body)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise APIError(400, "the request body is not valid JSON", code="invalid_json") from None

    async def chat_completions(request: Request) -> Response:
        b = state.backend()
        request_ = schema.parse_request(await read_json(request), defaults)
        if request_.params.logprobs is not None and b.tokenizer is None:
            raise APIError(400, "logprobs are not available from this engine", "logprobs", "unsupported_parameter")
        await check_params(b.engine, request_.params)
        space = cache_space(request.scope["headers"], request_.cache_salt)
        return CompletionResponse(request_, b.worker, b.engine.name, b.tokenizer, space=space)

    async def text_completions(request: Request) -> Response:
        b = state.backend()
        request_ = parse_completion(await read_json(request), defaults)
        tokenizer = b.tokenizer
        if tokenizer is None:
            raise APIError(400, "/v1/completions needs the in-process engine", "prompt", "unsupported_parameter")
        prompt = request_.prompt
        ids = tokenizer.encode_prompt(prompt) if isinstance(prompt, str) else prompt
        if not ids:
            raise APIError(400, "the prompt is empty (and the tokenizer adds no start token)", "prompt")
        if max(ids) >= tokenizer.vocab_size:
            raise APIError(400, f"prompt token ids must be < {tokenizer.vocab_size}, got {max(ids)}", "prompt")
        text = prompt if isinstance(prompt, str) else tokenizer.decode(ids, skip_special_tokens=False)
        space = cache_space(request.scope["headers"], request_.cache_salt)
        return TextCompletionResponse(request_, ids, text, b.worker, b.engine.name, tokenizer, space=space)

    async def check_params(engine: Engine, params: SamplingParams) -> None:
        """A 400 for a logit_bias past the vocabulary, or a response_format the engine cannot hold
        replies to (checked off the event loop: the first one builds the tokenizer's grammar side, ~0.2 s)."""
        if params.response_format is None and not params.logit_bias:
            return
        try:
            await anyio.to_thread.run_sync(engine.check_params, params)
        except GrammarError as exc:  # the response_format's schema, or a tool's
            raise APIError(400, str(exc), exc.param, "invalid_value") from None
        except InvalidParameter as exc:
            raise APIError(400, str(exc), "logit_bias", "invalid_value") from None

    async def models(_request: Request) -> Response:
        engine = state.backend().engine
        return JSONResponse(schema.models_list(engine.name, started, engine.context_limit))

    async def model(request: Request) -> Response:
        engine = state.backend().engine
        wanted = request.path_params["model"]
        if wanted != engine.name:
            raise APIError(404, f"no model {wanted!r}: this server has {engine.name!r}", "model", "model_not_found")
        return JSONResponse(schema.models_list(engine.name, started, engine.context_limit)["data"][0])

    async def health(_request: Request) -> Response:
        code, body = state.status()
        if state.error is not None:
            body = {**body, "error": state.error}
        b = state.ready
        if b is not None:
            requests = {"served": b.worker.served, "cancelled": b.worker.cancelled, "failed": b.worker.failed}
            body = {**body, "model": b.engine.name, "pending": b.worker.pending, "requests": requests}
            body["slots"] = {"total": b.worker.parallel, "busy": b.worker.running}
            body["cache"] = b.pool.stats()
        return status_response(code, body)

    async def metrics(_request: Request) -> Response:
        from chatcli.server.metrics import CONTENT_TYPE, exposition

        b = state.ready
        text = exposition(b.engine.name, b.worker, b.pool) if b is not None else exposition(None)
        return Response(text, media_type=CONTENT_TYPE)

    async def on_api_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def on_http_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(APIError(exc.status_code, str(exc.detail), code=code))

    async def on_crash(_request: Request, exc: Exception) -> Response:
        log.error("request failed: %r", exc)
        return error_response(APIError(500, "internal server error", type="server_error"))

    def stop_generations() -> None:
        """The server's shutdown began (`http.StoppingServer`): every job ends now, with a 503 `shutting_down`."""
        if state.ready is not None:
            state.ready.worker.stop()

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if load is not None:
            threading.Thread(target=load_in_background, name="chatcli-load", daemon=True).start()
        elif state.ready is not None:
            state.ready.worker.start()
        try:
            yield
        finally:
            if state.ready is not None:
                state.ready.worker.close()

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", text_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    middleware = [Middleware(BearerAuth, api_key=api_key, status=state.status)] if api_key else []
    if cors_origins:  # outermost: a preflight carries no key, and a 401 needs the headers too
        cors = Middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["*"],  # clients add their own (the openai SDKs' X-Stainless-*)
            expose_headers=[TRUNCATED_HEADER.decode()],
            max_age=600,
        )
        middleware.insert(0, cors)
    if allowed_hosts is not None:  # outermost: a rebinding page's preflight is refused too
        middleware.insert(0, Middleware(HostCheck, allowed=allowed_hosts))
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={APIError: on_api_error, HTTPException: on_http_error, Exception: on_crash},
        lifespan=lifespan,
    )
    app.state.stop_generations = stop_generations
    if engine is not None:
        attach(engine)
    return app
