"""serve's exposure to the network and to web pages: timeouts, Host, content type, Retry-After.

Checked from outside, through a real uvicorn on a loopback port with chatcli's protocol
(`server.http`): a connection that sends nothing or half its headers is closed, a body that stalls
gets a 408, a client that leaves mid-body leaves no traceback, a loopback server refuses other
Host names (DNS rebinding), a body not sent as JSON is refused (a page's form post needs no CORS
preflight), and a 503 says when to come back.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import httpx
import pytest

from chatcli.server import http as server_http
from chatcli.server.app import LOOPBACK_HOSTS
from chatcli.server.cli import serve_command, serving_line
from tests.servers import USER, Server

BODY = {"messages": USER, "max_tokens": 2}


def raw(server: Server, data: bytes) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(data)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing the connection within `seconds`; None if it stayed open."""
    sock.settimeout(seconds)
    got = b""
    try:
        while True:
            part = sock.recv(4096)
            if not part:
                return got
            got += part
    except TimeoutError:
        return None
    finally:
        sock.close()


def answer_of(sock: socket.socket, seconds: float) -> bytes:
    """What the server sends back within `seconds` (the headers and body may come in several segments)."""
    deadline, got = time.monotonic() + seconds, b""
    try:
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            part = sock.recv(4096)
            if not part:
                break
            got += part
    except TimeoutError:
        pass
    finally:
        sock.close()
    return got


def test_a_connection_whose_headers_never_finish_is_closed(tiny_lean, serve, monkeypatch):
    monkeypatch.setattr(server_http.TimedH11Protocol, "header_timeout", 0.5)
    server = serve(tiny_lean)
    silent = raw(server, b"")
    slowloris = raw(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: ")
    t0 = time.monotonic()
    assert closed_within(silent, 5) == b"" and closed_within(slowloris, 5) == b""
    assert time.monotonic() - t0 < 4
    assert server.post(BODY).status_code == 200  # a request that sends its headers at once is served


def test_a_stalled_body_gets_a_408_and_a_client_that_leaves_no_traceback(tiny_lean, serve, caplog):
    server = serve(tiny_lean, body_timeout=0.5)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    stalled = raw(server, head + b'Content-Length: 100\r\n\r\n{"messages"')
    answer = answer_of(stalled, 5)
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer, answer
    with caplog.at_level(logging.INFO):
        gone = raw(server, head + b'Content-Length: 1000\r\n\r\n{"messages": [')
        time.sleep(0.2)
        gone.close()
        time.sleep(0.5)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
    assert server.post(BODY).status_code == 200


def test_only_json_bodies_are_read(tiny_lean, serve):
    server = serve(tiny_lean)
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        got = httpx.post(server.url + "/v1/chat/completions", content=b'{"messages": []}',
                         headers={"Content-Type": content_type})  # fmt: skip
        assert got.status_code == 415 and got.json()["error"]["code"] == "unsupported_media_type"
    plain_json = httpx.post(server.url + "/v1/chat/completions", content=httpx.Request("POST", "/", json=BODY).content,
                            headers={"Content-Type": "application/json; charset=utf-8"}, timeout=60)  # fmt: skip
    assert plain_json.status_code == 200


@pytest.mark.parametrize(
    "host,status",
    [("127.0.0.1:8000", 200), ("localhost", 200), ("[::1]:1234", 200), ("127.0.0.2", 200),
     ("evil.example", 403), ("evil.example:8000", 403), ("localhost.evil.example", 403), ("10.0.0.1", 403)],
)  # fmt: skip
def test_a_loopback_server_answers_loopback_host_names_only(tiny_lean, serve, host, status):
    server = serve(tiny_lean, allowed_hosts=LOOPBACK_HOSTS)
    got = httpx.get(server.url + "/v1/models", headers={"Host": host})
    assert got.status_code == status
    if status == 403:
        assert got.json()["error"]["code"] == "host_not_allowed"
    assert httpx.get(serve(tiny_lean).url + "/v1/models", headers={"Host": host}).status_code == 200  # no check


def test_a_503_says_when_to_come_back(tiny_lean, serve):
    release = threading.Event()

    def load():
        release.wait(20)
        return tiny_lean

    from chatcli.server.app import create_app

    server = Server(create_app(None, load=load)).start()
    try:
        got = server.post(BODY)
        assert got.status_code == 503 and got.headers["retry-after"].isdigit()
        assert httpx.get(server.url + "/health").headers["retry-after"].isdigit()
    finally:
        release.set()
        server.stop()


def test_a_port_in_use_is_one_line_and_an_ipv6_host_is_bracketed_once(tmp_path):
    from click.testing import CliRunner

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(serve_command, ["--port", str(port), "--model", str(tmp_path / "none.gguf")])
    assert result.exit_code == 1
    assert "Serving at" not in result.output and result.output.count("\n") == 1, result.output
    assert "cannot serve on 127.0.0.1" in result.output
    assert "http://[::1]:8000/v1" in serving_line("[::1]", 8000) and "http://[::1]:8000/v1" in serving_line("::1", 8000)
    assert "Anthropic's at /v1/messages, Ollama's at /api" in serving_line("127.0.0.1", 8000)  # every API it serves
