"""Servers the tests start on a free loopback port: `chatcli serve`'s app (or any ASGI app) under a
real uvicorn in a thread of the test process."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx
import pytest

from chatcli.engine.engine import Finished
from chatcli.engine.sample.sampling import SamplingParams
from chatcli.server.app import create_app

TIMEOUT = 60.0
USER = [{"role": "user", "content": "What is the capital of France?"}]


def alone(engine, messages, **params) -> str:
    """The reply the engine gives this request on a fresh session: what the server must return."""
    events = list(engine.generate(messages, engine.new_session(), SamplingParams().with_(**params)))
    assert isinstance(events[-1], Finished)
    return events[-1].reply


def slow(engine, delay: float):
    """Make each forward take `delay` s longer, so requests overlap and disconnects land mid-reply; and
    each batched step (`forward_batch`, serve's slots), where the runner has them."""
    forward, batch = engine.runner.forward, getattr(engine.runner, "forward_batch", None)

    def slow_forward(ids, cache):
        time.sleep(delay)
        return forward(ids, cache)

    def slow_batch(requests):
        time.sleep(delay)
        return batch(requests)

    engine.runner.forward = slow_forward
    if batch is not None:
        engine.runner.forward_batch = slow_batch
    return engine


def slow_endless(engine, delay: float = 0.02):
    """Slow, and never stopping at an end-of-turn id: a reply that runs for a while."""
    engine.tokenizer.stop_ids = frozenset()
    return slow(engine, delay)


def leaves(server, route: str, body: dict, max_tokens: int = 400) -> None:
    """POST `body` and leave: after a few lines of a stream, or 0.5 s without a byte; then the job is
    cancelled, not run to `max_tokens`, and its slot is free."""
    with httpx.Client(timeout=httpx.Timeout(TIMEOUT, read=0.5)) as http:
        with contextlib.suppress(httpx.ReadTimeout):
            with http.stream("POST", server.url + route, json={**body, "max_tokens": max_tokens}) as r:
                assert r.status_code == 200
                for _ in zip(r.iter_lines(), range(4), strict=False):
                    pass
    assert server.worker.wait_idle(10) and server.worker.running == 0
    assert server.worker.cancelled == 1, list(server.worker.history)
    assert server.worker.history[-1]["completion_tokens"] < max_tokens


def free_port() -> list[str]:
    """`--port N` of a port free on loopback now (for commands that start a server of their own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return ["--port", str(sock.getsockname()[1])]


class Server:
    def __init__(self, app) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        from chatcli.server.http import StoppingServer, uvicorn_config

        self.server = StoppingServer(uvicorn_config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        return self

    def wait_ready(self, timeout: float) -> None:
        """Until /health answers 200 (a server started with `load=` has its model)."""
        deadline = time.monotonic() + timeout
        while httpx.get(self.url + "/health", timeout=TIMEOUT).status_code != 200:
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    @property
    def worker(self):
        return self.app.state.worker

    def post(self, body, **kwargs) -> httpx.Response:
        kwargs.setdefault("timeout", TIMEOUT)
        kwargs.setdefault("headers", {"Content-Type": "application/json"})  # also where `body` is None
        return httpx.post(self.url + "/v1/chat/completions", json=body, **kwargs)


ALIAS = "tiny"  # the name the tests' requests give the model: an alias of every server they start


@pytest.fixture
def serve():
    """serve(engine, **create_app options) → a started Server whose model also answers to `ALIAS`;
    all are stopped at teardown."""
    started: list[Server] = []

    def start(engine, **options) -> Server:
        options.setdefault("aliases", (ALIAS,))
        server = Server(create_app(engine, **options)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
