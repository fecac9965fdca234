"""Ollama's API on `chatcli serve` (issue 48), end to end with the `ollama` Python client: chat and
generate (whole and NDJSON-streamed), options, format, tools, a reasoning model's thinking, the model
routes (tags, show, ps, version), and each refusal a 4xx the client raises as its ResponseError."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from chatcli.engine.sample.sampling import SamplingParams
from tests.peer_clients import ASK, SCHEMAS, THINKING, TOOLS, engine_reply, scripted, tools_engine
from tests.servers import ALIAS, TIMEOUT, USER, alone
from tests.test_server_tools import CALLS


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return tools_engine(tmp_path_factory)


def client(server, **kwargs):
    from ollama import Client

    return Client(host=server.url, timeout=TIMEOUT, **kwargs)


GREEDY = {"temperature": 0}


def test_chat_gives_the_engines_reply_whole_and_streamed(tiny_lean, serve):
    server = serve(tiny_lean)
    expected = engine_reply(tiny_lean, USER, max_tokens=8)
    ollama = client(server)
    done = ollama.chat(model=ALIAS, messages=USER, options={**GREEDY, "num_predict": 8}, keep_alive="5m")
    assert done.message.role == "assistant" and done.message.content == expected and done.model == ALIAS
    assert done.done and done.done_reason == "length" and done.eval_count == 8
    assert done.prompt_eval_count == len(tiny_lean.tokenizer.encode_chat(USER)) and done.total_duration > 0
    parts = list(ollama.chat(model=ALIAS, messages=USER, options={**GREEDY, "num_predict": 8}, stream=True))
    assert "".join(p.message.content for p in parts) == expected and len(parts) > 2
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True] and parts[-1].done_reason == "length"
    body = {"model": ALIAS, "messages": USER, "options": {"num_predict": 3}}  # streamed unless told not to
    with httpx.stream("POST", server.url + "/api/chat", json=body, timeout=TIMEOUT) as raw:
        assert raw.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in raw.iter_lines() if line]
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] == 3
    assert ollama.chat(model=f"{ALIAS}:latest", messages=USER, options={"num_predict": 1}).eval_count == 1


def test_options_set_the_sampling(tiny_lean, serve):
    server = serve(tiny_lean)
    ollama = client(server)
    options = {"temperature": 0.9, "seed": 7, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.2,
               "num_predict": 10, "num_ctx": 4096, "num_thread": 2}  # fmt: skip
    sampled = dict(temperature=0.9, seed=7, top_k=20, top_p=0.9, min_p=0.05, repeat_penalty=1.2, max_tokens=10)
    assert ollama.chat(model=ALIAS, messages=USER, options=options).message.content == alone(tiny_lean, USER, **sampled)
    expected = engine_reply(tiny_lean, USER, max_tokens=16)
    at = next(i for i in range(2, len(expected) - 1) if expected[i : i + 2].isascii() and expected[i : i + 2].strip())
    stop = expected[at : at + 2]
    cut = ollama.chat(model=ALIAS, messages=USER, options={**GREEDY, "num_predict": 16, "stop": [stop]})
    assert cut.message.content == expected[: expected.index(stop)] and cut.done_reason == "stop"
    whole = ollama.chat(model=ALIAS, messages=USER, options={**GREEDY, "num_predict": -1})
    assert whole.eval_count > 16  # -1: to the context's end (or the end of the turn)


def test_generate_templates_the_prompt_or_not_with_raw(tiny_lean, serve):
    server = serve(tiny_lean)
    ollama = client(server)
    chat = [{"role": "system", "content": "Be brief."}, *USER]
    done = ollama.generate(model=ALIAS, prompt=USER[0]["content"], system="Be brief.",
                           options={**GREEDY, "num_predict": 8})  # fmt: skip
    assert done.response == engine_reply(tiny_lean, chat, max_tokens=8) and done.done_reason == "length"
    parts = list(ollama.generate(model=ALIAS, prompt=USER[0]["content"], options={**GREEDY, "num_predict": 8},
                                 stream=True))  # fmt: skip
    assert "".join(p.response for p in parts) == engine_reply(tiny_lean, USER, max_tokens=8) and parts[-1].done
    raw = ollama.generate(model=ALIAS, prompt="The quick brown", raw=True, options={**GREEDY, "num_predict": 6})
    from openai import OpenAI

    legacy = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0).completions.create(
        model=ALIAS, prompt="The quick brown", max_tokens=6, temperature=0
    )
    assert raw.response == legacy.choices[0].text
    assert ollama.generate(model=ALIAS).done_reason == "load"  # no prompt: Ollama's way to load the model


def test_format_holds_the_reply_to_json_or_a_schema(qwen, serve):
    server = serve(qwen)
    ollama = client(server)
    free = ollama.chat(model=ALIAS, messages=ASK, format="json", options={**GREEDY, "num_predict": 300})
    assert isinstance(json.loads(free.message.content), dict)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
    held = ollama.chat(model=ALIAS, messages=ASK, format=schema, options={**GREEDY, "num_predict": 300})
    jsonschema.validate(json.loads(held.message.content), schema)


def test_tools_calls_and_their_results(qwen, serve, monkeypatch):
    scripted(qwen, CALLS, monkeypatch)
    server = serve(qwen, defaults=SamplingParams(lookup=0))
    ollama = client(server)
    want = [("get_weather", {"city": "Paris", "unit": "celsius"}), ("search", {"query": "rain", "site": "news"})]
    done = ollama.chat(model=ALIAS, messages=ASK, tools=TOOLS, options=GREEDY)
    assert [(c.function.name, dict(c.function.arguments)) for c in done.message.tool_calls] == want
    assert done.message.content == "Let me look."
    for name, arguments in want:
        jsonschema.validate(arguments, SCHEMAS[name])
    parts = list(ollama.chat(model=ALIAS, messages=ASK, tools=TOOLS, options=GREEDY, stream=True))
    streamed = [(c.function.name, dict(c.function.arguments)) for p in parts for c in p.message.tool_calls or ()]
    assert streamed == want and "".join(p.message.content for p in parts) == "Let me look."

    monkeypatch.undo()
    answered = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                          "arguments": want[0][1]}}]},
        {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"},
    ]  # fmt: skip
    reply = ollama.chat(model=ALIAS, messages=answered, tools=TOOLS, options={**GREEDY, "num_predict": 10})
    chat = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [{"id": "000000001", "type": "function", "function": {
            "name": "get_weather", "arguments": want[0][1]}}]},
        {"role": "tool", "content": "18 C, sunny", "tool_call_id": "000000001", "name": "get_weather"},
    ]  # fmt: skip
    assert reply.message.content == engine_reply(qwen, chat, TOOLS, max_tokens=10)


def test_a_reasoning_models_think_block_is_its_thinking(qwen, serve, monkeypatch):
    scripted(qwen, THINKING, monkeypatch)
    server = serve(qwen, defaults=SamplingParams(lookup=0))
    ollama = client(server)
    done = ollama.chat(model=ALIAS, messages=USER, options=GREEDY, think=True)
    assert (done.message.thinking, done.message.content) == ("Let me see: the capital.", "Paris is the capital.")
    parts = list(ollama.chat(model=ALIAS, messages=USER, options=GREEDY, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "Let me see: the capital."
    assert "".join(p.message.content for p in parts) == "Paris is the capital."
    generated = ollama.generate(model=ALIAS, prompt=USER[0]["content"], options=GREEDY)
    assert (generated.thinking, generated.response) == ("Let me see: the capital.", "Paris is the capital.")


def test_the_model_routes(tiny_lean, serve):
    from ollama import ResponseError

    server = serve(tiny_lean)
    ollama = client(server)
    assert [m.model for m in ollama.list().models] == [tiny_lean.name, ALIAS]
    shown = ollama.show(ALIAS)
    assert shown.modelinfo["llama.context_length"] == tiny_lean.context_limit and "completion" in shown.capabilities
    assert shown.template == tiny_lean.tokenizer.template_source and shown.details.family == "llama"
    assert ollama.show(f"{ALIAS}:latest").details.quantization_level == tiny_lean.weights
    running = ollama.ps().models
    assert [m.model for m in running] == [tiny_lean.name] and running[0].context_length == tiny_lean.context_limit
    assert httpx.get(server.url + "/api/version", timeout=TIMEOUT).json()["version"]
    with pytest.raises(ResponseError) as caught:
        ollama.show("nosuch")
    assert caught.value.status_code == 404 and tiny_lean.name in caught.value.error


@pytest.mark.parametrize(
    ("route", "fields", "status", "words"),
    [
        ("/api/chat", {"model": "llama3.2"}, 404, "does not exist"),
        ("/api/chat", {"model": None}, 400, "model is required"),
        ("/api/chat", {"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, 400, "images"),
        ("/api/chat", {"options": {"mirostat": 2}}, 400, "mirostat"),
        ("/api/chat", {"options": {"temperature": -1}}, 400, "temperature"),
        ("/api/chat", {"format": "yaml"}, 400, "format"),
        ("/api/chat", {"messages": [{"role": "robot", "content": "hi"}]}, 400, "role"),
        ("/api/generate", {"prompt": "hi", "suffix": "end"}, 400, "suffix"),
        ("/api/generate", {"prompt": "hi", "context": [1, 2]}, 400, "context"),
        ("/api/pull", {"model": "llama3.2"}, 404, ""),
    ],
)
def test_what_the_server_does_not_do_is_a_4xx_in_ollamas_shape(tiny_lean, serve, route, fields, status, words):
    server = serve(tiny_lean)
    body = {"model": ALIAS, "messages": USER, "stream": False, **fields}
    got = httpx.post(server.url + route, json={k: v for k, v in body.items() if v is not None}, timeout=TIMEOUT)
    assert got.status_code == status, got.text
    assert list(got.json()) == ["error"] and words in got.json()["error"]
