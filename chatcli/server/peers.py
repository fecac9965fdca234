"""Which API a request came through, told by its path, and the error body that API's clients read.

- OpenAI's (chat completions, completions, responses, embeddings, models, and the routes without
  `/v1`, as llama-server serves them): `{"error": {"message", "type", "param", "code"}}`;
- Anthropic's (`/v1/messages…`): `{"type": "error", "error": {"type", "message"}}`, its type named
  by the status (`invalid_request_error`, `not_found_error`, `authentication_error`, …), which the
  `anthropic` SDK turns into its exception classes;
- Ollama's (`/api/…`): `{"error": "message"}`, which the `ollama` client raises as `ResponseError`.

Every error the server answers (the routes', the middlewares': 401, 403, 413, 415, and a 404 for a
path no route has) goes through `error_body`, so each client reads its own shape.
"""

from __future__ import annotations

from chatcli.server.schema import APIError

OPENAI, ANTHROPIC, OLLAMA = "openai", "anthropic", "ollama"

ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def peer(path: str) -> str:
    """The API a request path belongs to."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return ANTHROPIC
    if path.startswith("/api/"):
        return OLLAMA
    return OPENAI


def anthropic_error(err: APIError) -> dict:
    kind = ANTHROPIC_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def error_body(err: APIError, path: str = "") -> dict:
    """`err` in the shape the API of `path` answers errors in."""
    which = peer(path)
    if which == ANTHROPIC:
        return anthropic_error(err)
    if which == OLLAMA:
        return {"error": err.message}
    return err.body()
