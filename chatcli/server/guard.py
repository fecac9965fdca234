"""Who may ask, and whose cached prompts a request shares: the middlewares in front of the routes
(`HostCheck`: a loopback server answers loopback names only; `BearerAuth`: the API key, as a bearer token
or Anthropic's `x-api-key`) and the prefix pool's space of a request (`cache_space`), with the answers they
give (`error_response`: in the shape of the API the request's path belongs to, `peers`)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

from starlette.responses import JSONResponse

from chatcli.server import schema
from chatcli.server.hosts import is_loopback
from chatcli.server.peers import error_body
from chatcli.server.schema import APIError


def error_response(err: APIError, path: str = "") -> JSONResponse:
    """`err` as the API of the request's `path` answers errors (`peers.error_body`)."""
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else {}
    if err.status == 503:
        headers["Retry-After"] = schema.RETRY_AFTER
    return JSONResponse(error_body(err, path), status_code=err.status, headers=headers or None)


def status_response(code: int, body: dict) -> JSONResponse:
    """/health's answer, with the key or without it: a 503 (loading) says when to ask again."""
    return JSONResponse(body, status_code=code, headers={"Retry-After": schema.RETRY_AFTER} if code == 503 else None)


class HostCheck:
    """A loopback server answers only requests whose `Host` is a loopback name (localhost, 127.0.0.1,
    [::1], any port), as Jupyter and llama-server do: a web page on another name that a DNS rebinding
    points at 127.0.0.1 gets a 403, not the model."""

    def __init__(self, app, allowed: tuple[str, ...]) -> None:
        self.app = app
        self.allowed = {h.lower() for h in allowed}

    def permits(self, host: str) -> bool:
        name = host.strip().lower()
        if name.startswith("["):
            name = name[: name.find("]") + 1]
        else:
            name = name.rsplit(":", 1)[0] if name.count(":") == 1 else name
        return name in self.allowed or is_loopback(name)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            host = next((v for k, v in scope["headers"] if k == b"host"), None)
            if host is not None and not self.permits(host.decode("latin-1")):
                err = APIError(
                    403,
                    f"Host {host.decode('latin-1')!r} is not one this loopback server answers "
                    f"({', '.join(sorted(self.allowed))}): bind to another address to serve other names",
                    code="host_not_allowed",
                )
                await error_response(err, scope.get("path", ""))(scope, receive, send)
                return
        await self.app(scope, receive, send)


def bearer_token(headers) -> bytes | None:
    """The key a request carries among raw ASGI `headers`: the token of an `Authorization: Bearer TOKEN`,
    else an `x-api-key` header's (Anthropic's clients send the key so); None without either."""
    header = next((v for k, v in headers if k == b"authorization"), b"")
    scheme, _, token = header.partition(b" ")
    if scheme.lower() == b"bearer":
        return token.strip()
    key = next((v for k, v in headers if k == b"x-api-key"), None)
    return key.strip() if key is not None else None


def cache_space(headers, salt: str | None) -> str:
    """The prefix pool's space of a request: its API key (the Bearer token it carried, checked or not) and its
    `cache_salt`, hashed; "" (the one shared space) with neither. Requests of different spaces never reuse
    each other's cached positions, so a prompt's tokens cannot be guessed from `cached_tokens` or timing."""
    token = bearer_token(headers)
    if token is None and salt is None:
        return ""
    digest = hashlib.sha256()
    for part in (token, None if salt is None else salt.encode()):  # each part with its length: no ambiguity
        digest.update(b"-" if part is None else len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


class BearerAuth:
    """Every HTTP request needs `Authorization: Bearer KEY` (or `x-api-key: KEY`); compared in constant time. `/health`
    without it answers only the status, `{"status": "ok"}` or loading (a load balancer's probe has
    no key; the model, the queue and the cache numbers are for the key's holder)."""

    def __init__(self, app, api_key: str, status: Callable[[], tuple[int, dict]]) -> None:
        self.app = app
        self.key = api_key.encode()
        self.status = status  # /health's answer without the key: ok, loading or error

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            token = bearer_token(scope["headers"])
            ok = token is not None and hmac.compare_digest(token, self.key)
            if not ok and scope.get("path") == "/health":
                await status_response(*self.status())(scope, receive, send)
                return
            if not ok:
                err = APIError(
                    401,
                    "missing or wrong API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')",
                    code="invalid_api_key",
                )
                await error_response(err, scope.get("path", ""))(scope, receive, send)
                return
        await self.app(scope, receive, send)
