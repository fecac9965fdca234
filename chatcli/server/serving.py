"""What every API's routes share: the model a server has (loading, ready or failed: `ModelState`), the
engine, pool and worker that serve it (`Backend`), the request body read within its limits, and the
names the model answers to (`Service.check_model`).

The model answers to its id (the engine's name: a file name, a model's name or a hub id), the file
name it was loaded from and every `--alias NAME`; a request that names another model is a 404
`model_not_found` that names what is served, in the shape of the API it came through (`peers`). A
request that names none is served: llama-server's clients often send none.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread
from starlette.requests import ClientDisconnect, Request

from chatcli.engine import Engine, GrammarError, InvalidParameter, SamplingParams, SessionPool
from chatcli.server.schema import APIError
from chatcli.server.worker import GenerationWorker

log = logging.getLogger("chatcli.server")

BODY_TIMEOUT = 30.0  # seconds a request's body may take to arrive (a stalled upload is a 408)


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


def model_names(engine: Engine, aliases: tuple[str, ...] = ()) -> list[str]:
    """The names `engine`'s model answers to: its id first, the file it was loaded from, the aliases."""
    names = [engine.name]
    source = getattr(engine, "source", "") or ""
    if source and Path(source).suffix == ".gguf":
        names.append(Path(source).name)
    names += aliases
    return list(dict.fromkeys(n for n in names if n))


class Service:
    """The routes' shared state: `backend()`, `read_json`, `check_model`, `check_params`, and the
    server's sampling defaults."""

    def __init__(
        self,
        state: ModelState,
        defaults: SamplingParams,
        max_body_bytes: int,
        body_timeout: float,
        aliases: tuple[str, ...],
        started: int,
    ) -> None:
        self.state = state
        self.defaults = defaults
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.aliases = tuple(aliases)
        self.started = started  # the models' `created`

    def backend(self) -> Backend:
        return self.state.backend()

    def names(self) -> list[str]:
        return model_names(self.backend().engine, self.aliases)

    def check_model(self, name, param: str = "model", required: bool = False) -> str:
        """The model a request names, when this server serves it (None or "": the model served, unless
        `required`); a 404 `model_not_found` that names what is served otherwise."""
        names = self.names()
        if (name is None or name == "") and not required:
            return names[0]
        if not isinstance(name, str):
            raise APIError(400, f"{param} must be a string, got {json.dumps(name)[:40]}", param, "invalid_type")
        if name not in names:  # "" where one is required
            served = ", ".join(repr(n) for n in names)
            message = f"the model {name!r} does not exist: this server serves {served}"
            raise APIError(404, message, param, "model_not_found")
        return name

    async def read_json(self, request: Request):
        if not is_json(request.headers.get("content-type", "")):
            raise APIError(
                415,
                "send the body as JSON, with 'Content-Type: application/json'",
                code="unsupported_media_type",
            )
        body = await read_body(request, self.max_body_bytes, self.body_timeout)
        try:
            return json.loads(body)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise APIError(400, "the request body is not valid JSON", code="invalid_json") from None

    async def read_object(self, request: Request) -> dict:
        """The body as a JSON object (a 400 for any other JSON value)."""
        body = await self.read_json(request)
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object", None, "invalid_type")
        return body

    @staticmethod
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
