"""Ollama's model routes: `GET /api/tags` (the model, under each name it answers to), `POST /api/show`
(its details, chat template and capabilities), `GET /api/ps` (it is loaded, for good: `keep_alive` is
accepted and changes nothing) and `GET /api/version`. Pulling, pushing, creating, copying and deleting
models are not this server's: those paths are a 404 in Ollama's shape."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chatcli import __version__
from chatcli.server.ollama import model_name
from chatcli.server.serving import Service

LOADED_UNTIL = "2999-12-31T23:59:59Z"  # /api/ps's expires_at: the model is never unloaded


def family(engine) -> str:
    """The model's architecture (`llama`, `qwen3`, …), as its runner knows it."""
    runner = engine.runner
    config = getattr(runner, "config", None) or getattr(getattr(runner, "model", None), "config", None)
    name = getattr(config, "family", None) or getattr(config, "model_type", None)
    return name if isinstance(name, str) else ""


def file_size(engine) -> int:
    """The bytes of the file the model was loaded from (0 where it is a folder or a hub id)."""
    source = getattr(engine, "source", "") or ""
    try:
        return os.path.getsize(source) if source and Path(source).is_file() else 0
    except OSError:
        return 0


def details(engine) -> dict:
    kind = family(engine)
    source = getattr(engine, "source", "") or ""
    return {
        "parent_model": "",
        "format": "gguf" if source.endswith(".gguf") else "safetensors",
        "family": kind,
        "families": [kind] if kind else None,
        "parameter_size": "",
        "quantization_level": engine.weights,
    }


def capabilities(engine) -> list[str]:
    """What Ollama's clients may ask of the model: completion, tools where its template renders them,
    thinking where it writes `<think>`, embedding (`/api/embed`: its pooled hidden states)."""
    template = getattr(getattr(engine, "tokenizer", None), "template_source", "") or ""
    out = ["completion"]
    if "tools" in template:
        out.append("tools")
    if "<think>" in template:
        out.append("thinking")
    return [*out, "embedding"]


def routes(service: Service) -> list[Route]:
    def modified() -> str:
        return datetime.fromtimestamp(service.started, UTC).isoformat().replace("+00:00", "Z")

    async def tags(_request: Request) -> Response:
        engine = service.backend().engine
        info = {"modified_at": modified(), "size": file_size(engine), "digest": "", "details": details(engine)}
        return JSONResponse({"models": [{"name": n, "model": n, **info} for n in service.names()]})

    async def show(request: Request) -> Response:
        engine = service.backend().engine
        body = await service.read_object(request)
        if "model" not in body and "name" in body:  # the older clients' field
            body["model"] = body["name"]
        model_name(service, body)
        context = engine.context_limit
        kind = family(engine) or "unknown"
        return JSONResponse(
            {
                "modelfile": "",
                "parameters": "",
                "template": getattr(getattr(engine, "tokenizer", None), "template_source", "") or "",
                "details": details(engine),
                "model_info": {"general.architecture": kind, f"{kind}.context_length": context},
                "capabilities": capabilities(engine),
                "modified_at": modified(),
            }
        )

    async def ps(_request: Request) -> Response:
        engine = service.backend().engine
        name = service.names()[0]
        model = {"name": name, "model": name, "size": file_size(engine), "digest": "", "details": details(engine),
                 "expires_at": LOADED_UNTIL, "size_vram": 0, "context_length": engine.context_limit}  # fmt: skip
        return JSONResponse({"models": [model]})

    async def version(_request: Request) -> Response:
        return JSONResponse({"version": __version__})

    return [
        Route("/api/tags", tags, methods=["GET"]),
        Route("/api/show", show, methods=["POST"]),
        Route("/api/ps", ps, methods=["GET"]),
        Route("/api/version", version, methods=["GET"]),
    ]
