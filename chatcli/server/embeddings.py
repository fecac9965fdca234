"""Embeddings: OpenAI's `POST /v1/embeddings`, Ollama's `POST /api/embed`
(and its older `/api/embeddings`), over `Engine.embed`: each input's final hidden states pooled as the GGUF
says (mean, CLS or last token; mean for a chat model's own states) and normalised (`runners.pooling`).

OpenAI's request: `input` (a string or a list of them), `encoding_format` (`float`, or `base64`: the float32
values' little-endian bytes, what the openai client asks for by default), `dimensions` (an embedding model's
first N values, normalised again; a chat model's pooled states cannot be cut: a 400), `user`. The answer: a
`list` of `embedding` objects and `usage` (`prompt_tokens`, `total_tokens`). An input past the context is a
400 (Ollama's `truncate`, true by default, cuts it instead). The sequences of one request go through the
kernel together (one call: `NativeRunner.hidden_states`); one request's embeddings are computed at a time,
in a thread beside the generation slots, whose turns go on meanwhile.
"""

from __future__ import annotations

import base64
import threading
import time

import anyio.to_thread
import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chatcli.engine import EmbeddingError, release_cpu_threads
from chatcli.server.ollama import model_name
from chatcli.server.schema import APIError, bad, number
from chatcli.server.serving import Service

MAX_INPUTS = 2048  # OpenAI's limit of inputs a request


def _inputs(value, param: str = "input") -> list[str]:
    """One string or a list of them (token ids are not taken: send the text)."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise bad(f"{param} must be a string or a non-empty array of strings", param, "invalid_type")
    if len(texts) > MAX_INPUTS:
        raise bad(f"{param} takes at most {MAX_INPUTS} strings, got {len(texts)}", param)
    return texts


def routes(service: Service) -> list[Route]:
    one_at_a_time = threading.Lock()  # one request's sequences at a time: a kernel team, not one per request

    async def embed(texts: list[str], dimensions, truncate: bool):
        engine = service.backend().engine
        if not hasattr(engine, "embed"):
            raise APIError(400, "embeddings need the in-process engine", "input", "unsupported_parameter")

        def run():
            with one_at_a_time:
                try:
                    return engine.embed(texts, dimensions, truncate)
                finally:
                    release_cpu_threads()  # this thread waits now: its OpenMP team lets go of the cores

        try:
            return await anyio.to_thread.run_sync(run)
        except EmbeddingError as exc:
            raise APIError(400, str(exc), "dimensions" if exc.index is None else "input") from None
        except NotImplementedError as exc:
            raise APIError(400, f"this model cannot give embeddings: {exc}", "input", "unsupported_parameter") from None

    async def embeddings(request: Request) -> Response:
        body = await service.read_object(request)
        service.check_model(body.get("model"))
        texts = _inputs(body.get("input"))
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise bad(f"encoding_format must be float or base64, got {encoding!r}", "encoding_format")
        dimensions = number(body, "dimensions", integer=True)
        done = await embed(texts, dimensions, truncate=False)

        def encoded(vector: np.ndarray):
            data = vector.astype("<f4")
            return base64.b64encode(data.tobytes()).decode() if encoding == "base64" else data.tolist()

        data = [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(done.vectors)]
        usage = {"prompt_tokens": done.tokens, "total_tokens": done.tokens}
        return JSONResponse({"object": "list", "data": data, "model": service.names()[0], "usage": usage})

    async def ollama_embed(request: Request) -> Response:
        body = await service.read_object(request)
        name = model_name(service, body)
        legacy = request.url.path == "/api/embeddings"  # the older route: one `prompt`, one `embedding`
        texts = _inputs(body.get("prompt") if legacy else body.get("input"), "prompt" if legacy else "input")
        truncate = body.get("truncate", True) is not False
        started = time.perf_counter()
        done = await embed(texts, number(body, "dimensions", integer=True), truncate)
        vectors = [v.astype(np.float32).tolist() for v in done.vectors]
        if legacy:
            return JSONResponse({"embedding": vectors[0]})
        took = int((time.perf_counter() - started) * 1e9)
        return JSONResponse({"model": name, "embeddings": vectors, "total_duration": took, "load_duration": 0,
                             "prompt_eval_count": done.tokens})  # fmt: skip

    return [
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/api/embed", ollama_embed, methods=["POST"]),
        Route("/api/embeddings", ollama_embed, methods=["POST"]),
    ]
