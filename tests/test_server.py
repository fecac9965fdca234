"""`chatcli serve` end to end: a real uvicorn on a free loopback port, driven by the openai client and httpx."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatcli.engine.engine import Finished
from chatcli.engine.sample.sampling import SamplingParams
from tests.servers import ALIAS, TIMEOUT, USER, alone, free_port, leaves, slow, slow_endless


def client(server, **kwargs):
    from openai import OpenAI

    return OpenAI(
        base_url=server.url + "/v1", api_key=kwargs.pop("api_key", "unused"), max_retries=0, timeout=TIMEOUT, **kwargs
    )


def sse_events(response: httpx.Response) -> list:
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# -- the openai client -----------------------------------------------------------


def test_openai_client_gets_the_engines_reply(tiny_engine, serve):
    server = serve(tiny_engine)
    expected = alone(tiny_engine, USER, temperature=0, max_tokens=16)
    done = client(server).chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=16)
    assert done.object == "chat.completion"
    assert done.choices[0].message.role == "assistant"
    assert done.choices[0].message.content == expected
    assert done.model == tiny_engine.name
    assert done.usage.prompt_tokens == len(tiny_engine.tokenizer.encode_chat(USER))
    assert done.usage.completion_tokens == 16 and done.choices[0].finish_reason == "length"
    assert done.usage.total_tokens == done.usage.prompt_tokens + 16
    from openai import BadRequestError

    with pytest.raises(BadRequestError, match="top_k"):  # the extensions travel in extra_body
        client(server).chat.completions.create(model="tiny", messages=USER, extra_body={"top_k": -1})


def test_openai_client_streams_the_same_reply_in_pieces(tiny_engine, serve):
    server = serve(tiny_engine)
    expected = alone(tiny_engine, USER, temperature=0, max_tokens=16)
    stream = client(server).chat.completions.create(
        model="tiny", messages=USER, temperature=0, max_tokens=16, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == expected
    assert len(pieces) > 1  # streamed as decoded, not in one piece
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert all(c.usage is None for c in chunks[:-1])


def test_a_follow_up_that_extends_the_conversation_reuses_the_cache(tiny_engine, serve):
    server = serve(tiny_engine)
    openai = client(server)
    first = openai.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=8)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    follow = USER + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And of Spain?"},
    ]
    second = openai.chat.completions.create(model="tiny", messages=follow, temperature=0, max_tokens=8)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens  # at least the first prompt was not prefilled again
    assert cached < second.usage.prompt_tokens
    assert second.choices[0].message.content == alone(tiny_engine, follow, temperature=0, max_tokens=8)


def test_usage_reports_prompt_lookup_drafts_as_prediction_tokens(tiny_engine, serve):
    code = "def main():\n    print('hello world')\n    return 0\n" * 3
    messages = [{"role": "user", "content": code}]
    reply = client(serve(tiny_engine)).chat.completions.create(
        model="tiny", messages=messages, temperature=0, max_tokens=24
    )
    details = reply.usage.completion_tokens_details
    events = list(
        tiny_engine.generate(messages, tiny_engine.new_session(), SamplingParams(temperature=0, max_tokens=24))
    )
    stats = events[-1].stats
    assert stats.accepted_tokens > 0  # the tiny model repeats itself: drafts are kept
    assert details.accepted_prediction_tokens == stats.accepted_tokens
    assert details.rejected_prediction_tokens == stats.draft_tokens - stats.accepted_tokens
    assert reply.choices[0].message.content == events[-1].reply


def test_a_shared_system_prompt_is_forked_not_taken_from_its_first_client(tiny_engine, serve):
    server = serve(tiny_engine)
    system = {"role": "system", "content": "The quick brown fox jumps over the lazy dog. " * 4}
    ann = [system, {"role": "user", "content": "Hello"}]
    bob = [system, {"role": "user", "content": "def main():"}]
    body = {"temperature": 0, "max_tokens": 8}
    first = server.post({**body, "messages": ann}).json()
    second = server.post({**body, "messages": bob}).json()
    shared = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert shared > 32  # the system prompt came from Ann's cache
    assert second["choices"][0]["message"]["content"] == alone(tiny_engine, bob, temperature=0, max_tokens=8)
    follow = ann + [first["choices"][0]["message"], {"role": "user", "content": "Thanks"}]
    third = server.post({**body, "messages": follow}).json()
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] > first["usage"]["prompt_tokens"] > shared
    assert third["choices"][0]["message"]["content"] == alone(tiny_engine, follow, temperature=0, max_tokens=8)
    assert server.app.state.pool.forks == 1


SECRET = [{"role": "system", "content": "The quick brown fox jumps over the lazy dog. The vault PIN is 7391."}]


def cached(server, messages, route="/v1/chat/completions", key: str | None = None, **fields) -> int:
    """`usage.prompt_tokens_details.cached_tokens` of a request sent with `key` (as a Bearer token) and `fields`."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = {"max_tokens": 2, "temperature": 0, **fields}
    body.update({"messages": messages} if route.endswith("chat/completions") else {"prompt": messages})
    r = httpx.post(server.url + route, json=body, headers=headers, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize(
    "victim, attacker",
    [
        ({"key": "alice"}, {"key": "mallory"}),
        ({"cache_salt": "alice"}, {"cache_salt": "mallory"}),
        ({"cache_salt": "alice"}, {}),
        ({}, {"cache_salt": "mallory"}),
        ({"key": "k", "cache_salt": "alice"}, {"key": "k", "cache_salt": "mallory"}),
        ({"key": "k", "cache_salt": "s"}, {"key": "k2", "cache_salt": "s"}),
    ],
    ids=["keys", "salts", "salt-none", "none-salt", "one-key-two-salts", "two-keys-one-salt"],
)
def test_two_keys_or_salts_never_see_each_others_cached_tokens(tiny_lean, serve, victim, attacker):
    """The prefix pool is shared only within one API key and cache_salt (issue 46: guessing a secret digit
    by digit from `cached_tokens`): another's exact prompt, and a guess at its last digit, come back with no
    cached token; the victim's own follow-up, and the attacker's own second guess, still reuse their caches."""
    server = serve(tiny_lean)
    cached(server, SECRET + [{"role": "user", "content": "Hello"}], **victim)
    assert cached(server, SECRET + [{"role": "user", "content": "Hello"}], **attacker) == 0
    guess = [{"role": "system", "content": SECRET[0]["content"][:-2] + "2."}]
    assert cached(server, guess + [{"role": "user", "content": "Hello"}], **attacker) > 0  # its own first try
    follow = SECRET + [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}]
    assert cached(server, follow + [{"role": "user", "content": "PIN?"}], **victim) > len(SECRET[0]["content"]) // 4


def test_the_same_key_or_no_key_shares_its_cache_as_before(tiny_lean, serve):
    server = serve(tiny_lean)
    hello = SECRET + [{"role": "user", "content": "Hello"}]
    cached(server, hello, key="team")
    assert cached(server, SECRET + [{"role": "user", "content": "Bye"}], key="team") > 8  # forked from the first
    cached(server, hello)
    assert cached(server, SECRET + [{"role": "user", "content": "Bye"}]) > 8  # no key, no salt: one shared space
    text = "The quick brown fox jumps over the lazy dog. The vault PIN is 7391."
    cached(server, text, "/v1/completions", cache_salt="a")
    assert cached(server, text + " And", "/v1/completions", cache_salt="b") == 0
    assert cached(server, text + " And", "/v1/completions", cache_salt="a") > 8


def test_a_bad_cache_salt_is_a_400(tiny_lean, serve):
    server = serve(tiny_lean)
    for salt in ("", 5, ["a"]):
        r = server.post({"messages": USER, "cache_salt": salt})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text


def test_a_seed_makes_sampling_reproducible_across_requests(tiny_engine, serve):
    server = serve(tiny_engine)
    body = {"messages": USER, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "max_tokens": 16}
    a = server.post({**body, "seed": 7}).json()["choices"][0]["message"]["content"]
    b = server.post({**body, "seed": 7}).json()["choices"][0]["message"]["content"]
    c = server.post({**body, "seed": 8}).json()["choices"][0]["message"]["content"]
    assert a == b == alone(tiny_engine, USER, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=16, seed=7)
    assert c != a
    negative = server.post({**body, "seed": -5}).json()["choices"][0]["message"]["content"]
    assert negative == alone(
        tiny_engine, USER, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=16, seed=2**64 - 5
    )  # a signed seed names its two's complement


def test_stop_strings_and_max_tokens(tiny_engine, serve):
    server = serve(tiny_engine)
    full = alone(tiny_engine, USER, temperature=0, max_tokens=24)
    stop = full[6:9]
    assert stop and stop not in full[:8]
    body = {"messages": USER, "temperature": 0, "max_tokens": 24, "stop": [stop]}
    done = server.post(body).json()
    assert done["choices"][0]["message"]["content"] == full[: full.index(stop)]
    assert done["choices"][0]["finish_reason"] == "stop"
    short = server.post({"messages": USER, "temperature": 0, "max_completion_tokens": 3, "max_tokens": 20}).json()
    assert short["usage"]["completion_tokens"] == 3  # the newer field wins
    assert short["choices"][0]["finish_reason"] == "length"


def test_models_and_health(tiny_engine, serve):
    server = serve(tiny_engine)
    models = client(server).models.list()
    assert [m.id for m in models.data] == [tiny_engine.name, ALIAS]  # its id first, then the alias the tests give it
    assert models.data[0].max_model_len == tiny_engine.context_limit  # vLLM's field: clients learn the context
    health = httpx.get(server.url + "/health", timeout=TIMEOUT).json()
    assert health["status"] == "ok" and health["model"] == tiny_engine.name and health["pending"] == 0


def test_cors_is_off_no_browser_page_may_call_the_server(tiny_engine, serve):
    server = serve(tiny_engine)
    origin = {"Origin": "https://evil.example"}
    preflight = httpx.options(
        server.url + "/v1/chat/completions",
        headers={**origin, "Access-Control-Request-Method": "POST"},
        timeout=TIMEOUT,
    )
    assert preflight.status_code == 405
    assert not any(k.lower().startswith("access-control-") for k in preflight.headers)
    plain = httpx.get(server.url + "/v1/models", headers=origin, timeout=TIMEOUT)
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


# -- bad input ---------------------------------------------------------------------

BAD = [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"messages": USER, "temperature": -1}, "temperature"),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "top_p": 1.5}, "top_p"),
    ({"messages": USER, "top_k": -2}, "top_k"),
    ({"messages": USER, "min_p": 2}, "min_p"),
    ({"messages": USER, "repetition_penalty": 0}, "repetition_penalty"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "max_completion_tokens": 2.5}, "max_completion_tokens"),
    ({"messages": USER, "seed": "x"}, "seed"),
    ({"messages": USER, "seed": 2**70}, "seed"),
    ({"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": USER, "stop": [""]}, "stop"),
    ({"messages": USER, "stop": 3}, "stop"),
    ({"messages": USER, "stream": "yes"}, "stream"),
    ({"messages": USER, "n": 2}, "n"),
    ({"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}, "messages[0].content"),
    ({"messages": [5]}, "messages[0]"),
    ({"messages": USER, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ({"messages": USER, "stream_options": []}, "stream_options"),
    ({"messages": USER, "stop": [1]}, "stop"),
    ({"messages": USER, "tools": [{"type": "function"}]}, "tools"),
    ([1, 2], None),
    (None, None),
    ("text", None),
]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    [
        "messages",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "stream",
        "stream_options",
        "n",
        "model",
    ]
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool"]) | JSON, "content": st.text(max_size=5) | JSON}
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(FIELDS, JSON | st.lists(MESSAGE, max_size=3), max_size=6) | JSON)
def test_any_json_body_is_a_request_or_a_400(body):
    from chatcli.server.schema import APIError, ChatRequest, parse_request

    try:
        request = parse_request(body, SamplingParams())
    except APIError as exc:
        assert exc.status == 400 and exc.message and "\n" not in exc.message
    else:
        assert isinstance(request, ChatRequest) and request.messages
        assert all(
            m["role"] in ("system", "user", "assistant") and isinstance(m["content"], str) for m in request.messages
        )


def test_invalid_requests_get_an_openai_style_400(tiny_engine, serve):
    server = serve(tiny_engine)
    for body, param in BAD:
        r = server.post(body)
        assert r.status_code == 400, body
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, body
        assert error["message"] and "\n" not in error["message"]
    as_json = {"Content-Type": "application/json"}
    r = httpx.post(server.url + "/v1/chat/completions", content=b'{"messages": [', headers=as_json, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    for raw in (b"\xff\xfe", b"[" * 100_000, b""):
        r = httpx.post(server.url + "/v1/chat/completions", content=raw, headers=as_json, timeout=TIMEOUT)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert httpx.get(server.url + "/v1/nothing", timeout=TIMEOUT).json()["error"]["code"] == "not_found"
    assert httpx.get(server.url + "/v1/chat/completions", timeout=TIMEOUT).status_code == 405
    assert server.post({"messages": USER, "temperature": 0, "max_tokens": 4}).status_code == 200  # still serving


def test_a_prompt_over_the_context_is_a_400_streaming_or_not(tiny_engine, serve):
    server = serve(tiny_engine)
    huge = [{"role": "user", "content": "word " * 400}]  # the tiny model's context is 256
    for stream in (False, True):
        r = server.post({"messages": huge, "stream": stream})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"


def test_the_api_key_is_required_on_every_route(tiny_engine, serve):
    server = serve(tiny_engine, api_key="s3cret")
    body = {"messages": USER, "temperature": 0, "max_tokens": 4}
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "s3cret"},
        {"Authorization": "Basic s3cret"},
    ):
        r = server.post(body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    health = httpx.get(server.url + "/health", timeout=TIMEOUT)  # open: a probe has no key, and learns no more
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    full = httpx.get(server.url + "/health", headers={"Authorization": "Bearer s3cret"}, timeout=TIMEOUT).json()
    assert full["status"] == "ok" and "model" in full and "cache" in full
    assert httpx.get(server.url + "/v1/models", timeout=TIMEOUT).status_code == 401
    assert server.post(body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    done = client(server, api_key="s3cret").chat.completions.create(model="tiny", messages=USER, max_tokens=4)
    assert done.usage.completion_tokens >= 1
    from openai import AuthenticationError

    with pytest.raises(AuthenticationError):
        client(server, api_key="nope").chat.completions.create(model="tiny", messages=USER, max_tokens=4)


def test_bodies_over_the_cap_get_a_413(tiny_engine, serve):
    server = serve(tiny_engine, max_body_bytes=2000)
    big = {"messages": [{"role": "user", "content": "x" * 3000}]}
    r = server.post(big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: the cap holds while reading
        for _ in range(10):
            yield b" " * 500

    as_json = {"Content-Type": "application/json"}
    r = httpx.post(server.url + "/v1/chat/completions", content=chunks(), headers=as_json, timeout=TIMEOUT)
    assert r.status_code == 413
    assert server.post({"messages": USER, "max_tokens": 4}).status_code == 200  # just under the cap: served


# -- load and faults ----------------------------------------------------------------


def test_a_client_that_disconnects_stops_its_generation(tiny_engine, serve):
    engine = slow_endless(tiny_engine)
    server = serve(engine)
    body = {"messages": USER, "temperature": 0, "max_tokens": 200, "stream": True}
    with (
        httpx.Client(timeout=TIMEOUT) as http,
        http.stream("POST", server.url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [line for line, _ in zip(lines, range(6), strict=False) if line.startswith("data: ")]
        assert got
    assert server.worker.wait_idle(30)
    last = server.worker.history[-1]
    assert last["finish_reason"] == "cancelled"
    assert last["completion_tokens"] < 200
    assert server.worker.cancelled == 1
    # The next request is served normally, from a consistent cache.
    after = server.post({"messages": USER, "temperature": 0, "max_tokens": 6}).json()
    assert after["choices"][0]["message"]["content"] == alone(engine, USER, temperature=0, max_tokens=6)


def test_a_full_queue_answers_503_and_recovers(tiny_engine, serve):
    server = serve(slow_endless(tiny_engine), max_pending=1)
    body = {"messages": USER, "temperature": 0, "max_tokens": 200, "stream": True}
    with (
        httpx.Client(timeout=TIMEOUT) as http,
        http.stream("POST", server.url + "/v1/chat/completions", json=body) as r,
    ):
        lines = r.iter_lines()  # held: dropping it would close the connection
        assert next(lines).startswith("data: ")  # the first request is running
        busy = server.post({"messages": USER, "max_tokens": 4})
        assert busy.status_code == 503
        assert busy.json()["error"]["code"] == "server_busy"
    assert server.worker.wait_idle(30)
    assert server.post({"messages": USER, "max_tokens": 4}).status_code == 200


def test_closing_the_worker_finishes_the_running_job_and_refuses_the_queued_ones(tiny_engine):
    from chatcli.engine.kv.pool import SessionPool
    from chatcli.server.worker import Failed, GenerationWorker, Job

    engine = slow_endless(tiny_engine, 0.01)
    worker = GenerationWorker(engine, SessionPool(engine.new_session, 1 << 30))
    got: dict[str, list] = {"a": [], "b": []}
    params = SamplingParams(temperature=0, max_tokens=30)
    assert worker.submit(Job(USER, params, got["a"].append))
    assert worker.submit(Job(USER, params, got["b"].append))
    deadline = time.monotonic() + 30
    while not got["a"]:  # a is running
        assert time.monotonic() < deadline
        time.sleep(0.01)
    worker.close(timeout=30)
    assert isinstance(got["a"][-1], Finished) and got["a"][-1].finish_reason == "length"
    assert len(got["b"]) == 1 and isinstance(got["b"][0], Failed) and got["b"][0].error.status == 503
    assert not worker.submit(Job(USER, params, got["b"].append))


def test_stopping_the_worker_ends_the_running_and_the_queued_jobs_with_a_503(tiny_engine):
    """`stop` (the server's shutdown) cancels every job: the running one ends at its next step, the queued one
    is not run; both are told `shutting_down`, and nothing is taken after."""
    from chatcli.engine.kv.pool import SessionPool
    from chatcli.server.worker import Failed, GenerationWorker, Job

    engine = slow_endless(tiny_engine, 0.01)
    worker = GenerationWorker(engine, SessionPool(engine.new_session, 1 << 30))
    got: dict[str, list] = {"a": [], "b": []}
    params = SamplingParams(temperature=0, max_tokens=200)
    assert worker.submit(Job(USER, params, got["a"].append))
    assert worker.submit(Job(USER, params, got["b"].append))
    deadline = time.monotonic() + 30
    while len(got["a"]) < 3:  # a is generating
        assert time.monotonic() < deadline
        time.sleep(0.01)
    worker.stop()
    assert worker.wait_idle(5)
    for name in "ab":
        assert isinstance(got[name][-1], Failed) and got[name][-1].error.code == "shutting_down", got[name][-1]
    assert len(got["a"]) < 100 and got["b"] == got["b"][-1:]
    assert not worker.submit(Job(USER, params, got["b"].append))
    worker.close()


def test_a_non_streaming_client_that_leaves_stops_its_generation_too(tiny_engine, serve):
    server = serve(slow_endless(tiny_engine))
    with pytest.raises(httpx.ReadTimeout):
        server.post({"messages": USER, "max_tokens": 200}, timeout=httpx.Timeout(TIMEOUT, read=0.5))
    assert server.worker.wait_idle(30)
    assert server.worker.history[-1]["finish_reason"] == "cancelled"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_legacy_completion_whose_client_leaves_is_cancelled(tiny_lean, serve, stream):
    """/v1/completions stops its generation when its client leaves, as chat turns do (test_server_tools has
    the tool-call turns)."""
    server = serve(slow_endless(tiny_lean))
    leaves(server, "/v1/completions", {"prompt": "The capital of France", "stream": stream})


def test_eight_concurrent_clients_each_get_their_own_reply(tiny_engine, serve):
    prompts = ["Hello", "café naïve", "def main():", "quick brown fox", "中文测试", "Emoji 🙂", "tabs\tand", "France?"]
    requests = [
        {"messages": [{"role": "user", "content": p}], "temperature": 0 if i % 2 else 1.0, "seed": i, "max_tokens": 24}
        for i, p in enumerate(prompts)
    ]
    expected = [
        alone(tiny_engine, r["messages"], temperature=r["temperature"], seed=r["seed"], max_tokens=24) for r in requests
    ]
    assert len(set(expected)) == len(expected)
    server = serve(slow(tiny_engine, 0.003))  # ~0.1 s a reply: the requests queue up behind each other
    barrier = threading.Barrier(len(requests))

    def run(i: int) -> str:
        barrier.wait(TIMEOUT)
        if i % 2:  # half stream, half not
            with httpx.stream(
                "POST", server.url + "/v1/chat/completions", json={**requests[i], "stream": True}, timeout=TIMEOUT
            ) as r:
                events = sse_events(r)
            assert events[-1] == "[DONE]"
            return "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"])
        return server.post(requests[i]).json()["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(len(requests)) as pool:
        replies = list(pool.map(run, range(len(requests))))
    assert replies == expected


def test_an_engine_failure_is_a_500_and_the_server_goes_on(tiny_engine, serve):
    server = serve(tiny_engine)
    forward = tiny_engine.runner.forward
    calls = {"n": 0}  # the third forward of a request fails: mid-reply

    def flaky(ids, cache):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated failure\nwith a second line")
        return forward(ids, cache)

    expected = alone(tiny_engine, USER, temperature=0, max_tokens=8)
    tiny_engine.runner.forward = flaky
    r = server.post({"messages": USER, "temperature": 0, "max_tokens": 8})
    assert r.status_code == 500
    assert r.json()["error"]["message"] == "generation failed: simulated failure"
    assert len(server.app.state.pool) == 0  # the session it ran on was dropped
    calls["n"] = 0  # fail again, mid-stream this time: an error event, then [DONE]
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json={"messages": USER, "temperature": 0, "max_tokens": 8, "stream": True},
        timeout=TIMEOUT,
    ) as s:
        events = sse_events(s)
    assert s.status_code == 200 and events[-1] == "[DONE]"
    assert events[-2]["error"]["message"] == "generation failed: simulated failure"
    assert len(server.app.state.pool) == 0
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json={"messages": USER, "temperature": 0, "max_tokens": 8, "stream": True},
        timeout=TIMEOUT,
    ) as s:
        events = sse_events(s)
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e.get("choices"))
    assert text == expected


# -- the command -------------------------------------------------------------------


def test_bind_warning_only_for_exposed_hosts_without_a_key():
    from chatcli.server.cli import bind_warning, is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.9.1", "localhost", "::1", "[::1]"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "192.168.1.4", "::", "example.org"))
    assert bind_warning("127.0.0.1", None) is None
    assert bind_warning("0.0.0.0", "key") is None
    assert "--api-key" in bind_warning("0.0.0.0", None)


def test_serve_command_reports_a_bad_model_in_one_line(tmp_path, monkeypatch):
    import click
    from click.testing import CliRunner

    from chatcli.server.cli import serve_command

    monkeypatch.setenv("CHATCLI_CONFIG", str(tmp_path / "none.toml"))
    app = click.Group(commands={"serve": serve_command})  # "serve" is a subcommand, as in chatcli
    result = CliRunner().invoke(
        app,
        ["serve", "--model", str(tmp_path / "missing.gguf"), "--device", "cpu", "--host", "0.0.0.0", *free_port()],
    )
    assert result.exit_code == 1
    output = result.output.strip().splitlines()
    assert output[-1] == f"chatcli: error: model file not found: {tmp_path / 'missing.gguf'}"
    assert any(line.startswith("warning: serving on 0.0.0.0 without --api-key") for line in output)
    assert "Traceback" not in result.output


@pytest.mark.real_model
def test_ctrl_c_ends_the_streams_in_flight_and_exits_at_once(tmp_path):
    """`chatcli serve` on Ctrl+C ends the replies in flight, each stream with an error event, and exits
    within a second or so, where it waited for a 300-token reply to run to its end (issue 46)."""
    port = free_port()
    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "none.toml")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "chatcli", "serve", *port, "--log-level", "warning"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # an ignored SIGINT would be inherited
    )
    url = f"http://127.0.0.1:{port[1]}"
    story = [{"role": "user", "content": "Write a very long story about a dragon."}]
    body = {"messages": story, "stream": True, "temperature": 0, "max_tokens": 300}  # greedy: the whole 300
    try:
        deadline = time.monotonic() + 300
        while not ready(url):
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
            lines = (line for line in r.iter_lines() if line.startswith("data: "))
            assert '"content":"' in next(lines) and '"content":"' in next(lines)  # the reply is streaming
            proc.send_signal(signal.SIGINT)
            stopped = time.monotonic()
            rest = list(lines)
        proc.wait(30)
        exited = time.monotonic() - stopped
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rest[-1] == "data: [DONE]", rest[-3:]
    assert json.loads(rest[-2][len("data: ") :])["error"]["code"] == "shutting_down"
    assert not any('"finish_reason":"' in line for line in rest), "the reply ran to its end"
    assert exited < 2.0, f"the server took {exited:.1f} s to exit"
    assert proc.returncode == 130 and "Traceback" not in err, err


def ready(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_importing_the_command_stays_light():
    code = (
        "import sys, chatcli.server.cli\n"
        "heavy = [m for m in ('torch', 'transformers', 'textual', 'starlette', 'uvicorn') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# -- the real model ------------------------------------------------------------------


@pytest.mark.real_model
def test_real_model_streams_and_reuses_its_cache(real_engine, serve):
    server = serve(real_engine)
    openai = client(server)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    stream = openai.chat.completions.create(
        model=real_engine.name,
        messages=messages,
        temperature=0,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "paris" in text.lower()
    follow = messages + [{"role": "assistant", "content": text}, {"role": "user", "content": "And of Italy?"}]
    second = openai.chat.completions.create(model=real_engine.name, messages=follow, temperature=0, max_tokens=12)
    assert second.usage.prompt_tokens_details.cached_tokens >= chunks[-1].usage.prompt_tokens
    assert "rome" in second.choices[0].message.content.lower()


def test_cors_origins_let_those_pages_call_the_server_and_no_other(tiny_engine, serve):
    server = serve(tiny_engine, api_key="k", cors_origins=("http://localhost:3000",))
    ok, evil = {"Origin": "http://localhost:3000"}, {"Origin": "https://evil.example"}
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    allowed = httpx.options(server.url + "/v1/chat/completions", headers={**ok, **preflight}, timeout=TIMEOUT)
    assert allowed.status_code == 200  # answered before the key check: a preflight carries none
    assert allowed.headers["access-control-allow-origin"] == "http://localhost:3000"
    refused = httpx.options(server.url + "/v1/chat/completions", headers={**evil, **preflight}, timeout=TIMEOUT)
    assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
    body = {"messages": USER, "max_tokens": 2}
    reply = httpx.post(
        server.url + "/v1/chat/completions", json=body, headers={**ok, "Authorization": "Bearer k"}, timeout=TIMEOUT
    )
    assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "x-chatcli-truncated-turns" in reply.headers["access-control-expose-headers"].lower()
    no_key = httpx.post(server.url + "/v1/chat/completions", json=body, headers=ok, timeout=TIMEOUT)
    assert no_key.status_code == 401 and no_key.headers["access-control-allow-origin"] == "http://localhost:3000"


@pytest.mark.parametrize("value", ["localhost:3000", "http://a.example/path", "ftp://x"])
def test_a_bad_cors_origin_is_one_line(value):
    from click.testing import CliRunner

    from chatcli.server.cli import serve_command

    result = CliRunner().invoke(serve_command, ["--cors-origins", value])
    assert result.exit_code == 2 and "--cors-origins takes origins like" in result.output
