"""llama-server's tokenizer routes, as its README defines them (errors in OpenAI's shape):

    POST /tokenize        {"content", "add_special" (false), "parse_special" (true), "with_pieces" (false)}
                          → {"tokens": [id, ...]}, or with pieces [{"id", "piece"}, ...]: a piece is its text
                          where its bytes are whole UTF-8, else the list of its bytes
    POST /detokenize      {"tokens": [id, ...]} → {"content"}: special tokens written as their text
    POST /apply-template  {"messages" (as chat completions'), "tools"} → {"prompt"}: the chat template's text,
                          the assistant's turn opened, to edit and send to /v1/completions

`add_special` adds what the tokenizer adds to a raw prompt (a Llama's BOS: `encode_prompt`); `parse_special`
false reads a special token's text as text. The model's own tokenizer and chat template, in process.
"""

from __future__ import annotations

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chatcli.engine import ChatTemplateError
from chatcli.server import schema
from chatcli.server.schema import APIError, bad
from chatcli.server.serving import Service
from chatcli.server.tools import ToolError, parse_tools


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad(f"{name} must be a boolean", name, "invalid_type")
    return value


def piece(tokenizer, token_id: int):
    """A token's text where its bytes are whole UTF-8, else its bytes as numbers (llama-server's `piece`)."""
    data = tokenizer.token_bytes(token_id)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def tokenized(tokenizer, content: str, add_special: bool, parse_special: bool) -> list[int]:
    if add_special and parse_special:
        return tokenizer.encode_prompt(content)
    ids = tokenizer.encode(content) if parse_special else tokenizer.encode_text(content)
    return (tokenizer.encode_prompt("") if add_special else []) + ids


def routes(service: Service) -> list[Route]:
    def tokenizer():
        found = service.backend().tokenizer
        if found is None:
            raise APIError(400, "the tokenizer routes need the in-process engine", None, "unsupported_parameter")
        return found

    async def tokenize(request: Request) -> Response:
        body = await service.read_object(request)
        tok = tokenizer()
        content = body.get("content")
        if not isinstance(content, str):
            raise bad("content must be a string", "content", "invalid_type")
        add, parse = _flag(body, "add_special", False), _flag(body, "parse_special", True)
        ids = await anyio.to_thread.run_sync(tokenized, tok, content, add, parse)
        if _flag(body, "with_pieces", False):
            return JSONResponse({"tokens": [{"id": i, "piece": piece(tok, i)} for i in ids]})
        return JSONResponse({"tokens": ids})

    async def detokenize(request: Request) -> Response:
        body = await service.read_object(request)
        tok = tokenizer()
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise bad("tokens must be an array of token ids", "tokens", "invalid_type")
        outside = [i for i in ids if not 0 <= i < tok.vocab_size]
        if outside:
            raise bad(f"token ids must be in [0, {tok.vocab_size}), got {outside[0]}", "tokens")
        return JSONResponse({"content": tok.decode(ids, skip_special_tokens=False)})

    async def apply_template(request: Request) -> Response:
        body = await service.read_object(request)
        tok = tokenizer()
        messages = schema.parse_messages(body.get("messages"))
        try:
            tools = parse_tools({"tools": body.get("tools"), "tool_choice": body.get("tool_choice")})
        except ToolError as exc:
            raise bad(str(exc), exc.param, exc.code) from None
        offered = None if tools is None else tools.offered()
        try:
            prompt = await anyio.to_thread.run_sync(tok.render, messages, offered)
        except ChatTemplateError as exc:
            raise APIError(400, str(exc), "messages") from None
        return JSONResponse({"prompt": prompt})

    return [
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/apply-template", apply_template, methods=["POST"]),
    ]
