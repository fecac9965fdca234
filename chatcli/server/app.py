"""The ASGI app: the routes of each API over one `Engine`, given or loaded in a thread meanwhile.

    completions.py    OpenAI's chat completions, completions and models (with and without /v1)
    responses.py      OpenAI's Responses API          embeddings.py   /v1/embeddings, /api/embed
    anthropic.py      Anthropic's Messages API        utility.py      /tokenize, /detokenize, /apply-template
    ollama.py         Ollama's /api/chat, /api/generate; ollama_models.py its /api/tags, show, ps, version
    here              GET /health (liveness, queue, slots and cache; open without the key), GET /metrics

`create_app(engine, ...)` builds it (tests pass the tiny engine; `chatcli serve`
the loaded model). A `GenerationWorker` runs the engine, `parallel` requests at once (its slots,
their steps batched; by default 4 where the kernel batches, else 1: `worker.slots_for`); each
response waits on its own asyncio queue, fed from its slot's thread with
`loop.call_soon_threadsafe`, while a watcher task listens for the client's
disconnect and sets the job's cancel event. Errors are JSON in the shape of the route's API (`peers`):
400 for bad input, 401 without the API key, 403 for a Host a loopback server does not answer
(`allowed_hosts`: DNS rebinding), 408 for a body that takes over `BODY_TIMEOUT` s, 413 past the
body cap, 415 for a body that is not sent as JSON (a web page's form or `text/plain` post needs no
CORS preflight: only `application/json` is read), 503 (with `Retry-After`) while the model loads or
the queue is full. The connection's own timeouts are in `http.py`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from chatcli.engine import Engine, SamplingParams, SessionPool
from chatcli.errors import one_line
from chatcli.server import anthropic, completions, embeddings, ollama, ollama_models, responses, utility
from chatcli.server.guard import BearerAuth, HostCheck, error_response, status_response
from chatcli.server.respond import TRUNCATED_HEADER
from chatcli.server.schema import APIError
from chatcli.server.serving import BODY_TIMEOUT, Backend, ModelState, Service
from chatcli.server.worker import GenerationWorker, slots_for

log = logging.getLogger("chatcli.server")

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: far more than a full context of text
DEFAULT_CACHE_BUDGET_BYTES = 1 << 30  # 1 GiB of KV cache across the pooled sessions
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


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
    aliases: tuple[str, ...] = (),
) -> Starlette:
    """The server for `engine`; its worker thread starts with the app's lifespan (or the first request).
    Or, with `engine` None, for the engine `load()` returns: called in a thread when the app starts,
    the routes answer 503 (`/health` {"status": "loading"}) until it is there; a load that raises
    leaves them at 503 with its message, which `on_load_failure` also gets (`chatcli serve` stops).
    `parallel`: the requests generated at once (None: `worker.slots_for`'s default).
    `cors_origins`: the web origins whose pages may call it (`*`: any); none by default.
    `allowed_hosts`: the only `Host` names answered (`HostCheck`; `chatcli serve` on loopback); None: any.
    `aliases`: more names the model answers to, beside its id and file name (`serving.model_names`)."""
    if (engine is None) == (load is None):
        raise ValueError("create_app takes an engine or a load function")
    defaults = defaults or SamplingParams()
    started = int(time.time())
    state = ModelState()
    service = Service(state, defaults, max_body_bytes, body_timeout, aliases, started)

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

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return error_response(exc, request.url.path)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(APIError(exc.status_code, str(exc.detail), code=code), request.url.path)

    async def on_crash(request: Request, exc: Exception) -> Response:
        log.error("request failed: %r", exc)
        return error_response(APIError(500, "internal server error", type="server_error"), request.url.path)

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
        *completions.routes(service),
        *anthropic.routes(service),
        *ollama.routes(service),
        *ollama_models.routes(service),
        *responses.routes(service),
        *embeddings.routes(service),
        *utility.routes(service),
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
