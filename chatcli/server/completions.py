"""OpenAI's routes: chat completions, legacy completions and the models, each under `/v1` and, as
llama-server serves them, without it (`/chat/completions`, `/completions`, `/models`).

    POST /v1/chat/completions   chat.completion, or text/event-stream chunks then [DONE]
    POST /v1/completions        text_completion (a string prompt, no chat template), or its chunks
    GET  /v1/models             the model this server has, under each name it answers to
    GET  /v1/models/{id}        that model, by any of its names, or a 404 `model_not_found`

A reply names the model by its id, whichever of its names the request gave (as OpenAI's name the
model an alias stands for).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chatcli.server import schema
from chatcli.server.guard import cache_space
from chatcli.server.legacy import TextCompletionResponse, parse_completion
from chatcli.server.respond import CompletionResponse
from chatcli.server.schema import APIError
from chatcli.server.serving import Service


def models_list(service: Service) -> dict:
    """OpenAI's list: the model once under each of its names, its id first (what a client that picks
    the first one takes)."""
    engine = service.backend().engine
    entries = [schema.models_list(n, service.started, engine.context_limit)["data"][0] for n in service.names()]
    return {"object": "list", "data": entries}


def routes(service: Service) -> list[Route]:
    async def chat_completions(request: Request) -> Response:
        b = service.backend()
        body = await service.read_object(request)
        service.check_model(body.get("model"))
        request_ = schema.parse_request(body, service.defaults)
        if request_.params.logprobs is not None and b.tokenizer is None:
            raise APIError(400, "logprobs are not available from this engine", "logprobs", "unsupported_parameter")
        await service.check_params(b.engine, request_.params)
        space = cache_space(request.scope["headers"], request_.cache_salt)
        return CompletionResponse(request_, b.worker, b.engine.name, b.tokenizer, space=space)

    async def text_completions(request: Request) -> Response:
        b = service.backend()
        body = await service.read_object(request)
        service.check_model(body.get("model"))
        request_ = parse_completion(body, service.defaults)
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

    async def models(_request: Request) -> Response:
        return JSONResponse(models_list(service))

    async def model(request: Request) -> Response:
        name = service.check_model(request.path_params["model"], required=True)
        return JSONResponse(next(m for m in models_list(service)["data"] if m["id"] == name))

    table = []
    for prefix in ("/v1", ""):  # llama-server answers both
        table += [
            Route(prefix + "/chat/completions", chat_completions, methods=["POST"]),
            Route(prefix + "/completions", text_completions, methods=["POST"]),
            Route(prefix + "/models", models, methods=["GET"]),
            Route(prefix + "/models/{model:path}", model, methods=["GET"]),
        ]
    return table
