"""The HTTP side of `chatcli serve`: uvicorn, with the timeouts a server on a network needs.

uvicorn closes an idle keep-alive connection (`timeout_keep_alive`) but waits forever for a
request's headers: a client that connects and sends nothing, or headers a byte at a time
(slowloris), holds a connection open for good. `TimedH11Protocol` closes a connection whose
request headers are not complete `HEADER_TIMEOUT` seconds after it opened (or after its last
response); the body has its own limit in the app (`app.read_body`), and an idle keep-alive
connection goes after `IDLE_TIMEOUT`. `Host` checks and the rest are the app's (`app.py`).

On shutdown (the first Ctrl+C) uvicorn waits for every response in flight to end before the app's
own shutdown runs: `StoppingServer` first calls the app's `state.stop_generations`, which ends the
replies in flight (each stream closes with an error event), so the process exits at once.
"""

from __future__ import annotations

import asyncio
import socket

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT = 10.0  # seconds from connecting (or the last response) to a request's complete headers
IDLE_TIMEOUT = 5.0  # seconds a keep-alive connection may sit idle between requests (uvicorn's default)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers take over HEADER_TIMEOUT s."""

    header_timeout = HEADER_TIMEOUT
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # still reading a request's headers
            if self._header_timer is None:
                self._arm()
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()  # the next request's headers have the same time (the idle timeout may close it first)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


class StoppingServer(uvicorn.Server):
    """uvicorn's server, whose shutdown first stops the app's generations (`app.state.stop_generations`,
    where the app has it) rather than waiting for the replies in flight to run to their end."""

    async def shutdown(self, sockets=None) -> None:
        stop = getattr(getattr(self.config.app, "state", None), "stop_generations", None)
        if stop is not None:
            stop()
        await super().shutdown(sockets)


def uvicorn_config(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", **extra):
    """uvicorn's Config for `app` with chatcli's protocol and timeouts (`chatcli serve` and the tests')."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=TimedH11Protocol,
        timeout_keep_alive=int(IDLE_TIMEOUT),
        timeout_graceful_shutdown=5,
        **extra,
    )


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (an OSError, e.g. the port in use, before anything is printed)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
