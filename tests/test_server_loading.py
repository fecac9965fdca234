"""serve: the server answers while its model loads — /health says "loading" (503, as llama-server
does, so a load balancer waits), the API routes a 503 `model_loading` — then serves; a failed load
is reported and stops the server."""

from __future__ import annotations

import threading

import httpx

from tests.servers import TIMEOUT, USER


def test_health_says_loading_until_the_model_is_there(tiny_lean, serve):
    release = threading.Event()

    def load():
        assert release.wait(30)
        return tiny_lean

    server = serve(None, load=load, api_key="k")
    key = {"Authorization": "Bearer k"}
    for headers in ({}, key):  # the probe without the key learns the same
        health = httpx.get(server.url + "/health", headers=headers, timeout=TIMEOUT)
        assert health.status_code == 503 and health.json() == {"status": "loading"}
    body = {"messages": USER, "max_tokens": 2}
    early = httpx.post(server.url + "/v1/chat/completions", json=body, headers=key, timeout=TIMEOUT)
    assert early.status_code == 503 and early.json()["error"]["code"] == "model_loading"
    models = httpx.get(server.url + "/v1/models", headers=key, timeout=TIMEOUT)
    assert models.status_code == 503
    assert httpx.get(server.url + "/health", timeout=TIMEOUT).status_code == 503  # no key: still only the status
    release.set()
    server.wait_ready(30)
    health = httpx.get(server.url + "/health", headers=key, timeout=TIMEOUT)
    assert health.status_code == 200 and health.json()["model"] == tiny_lean.name
    assert httpx.get(server.url + "/health", timeout=TIMEOUT).json() == {"status": "ok"}
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, headers=key, timeout=TIMEOUT)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] is not None


def test_a_failed_load_is_reported_and_calls_back(serve):
    from chatcli.engine.load.options import LoadError

    failed = []
    done = threading.Event()

    def load():
        raise LoadError("no model could be loaded (tried nope.gguf: file not found)")

    def on_failure(message: str) -> None:
        failed.append(message)
        done.set()

    server = serve(None, load=load, on_load_failure=on_failure)
    assert done.wait(30)
    assert failed == ["no model could be loaded (tried nope.gguf: file not found)"]
    health = httpx.get(server.url + "/health", timeout=TIMEOUT)
    assert health.status_code == 503 and health.json()["status"] == "error"
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": USER}, timeout=TIMEOUT)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
