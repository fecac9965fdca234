"""serve: the legacy `/v1/completions` (a string prompt, no chat template), whole and streamed, through
the openai client; `Engine.complete` under it."""

from __future__ import annotations

import httpx
import pytest

from chatcli.engine.engine import ContextOverflow
from chatcli.engine.events import Finished, Token
from chatcli.engine.params import SamplingParams

PROMPT = "The capital of France is"


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def completed(engine, ids, **params):
    events = list(engine.complete(ids, engine.new_session(), SamplingParams().with_(**params)))
    assert isinstance(events[-1], Finished)
    return events


def test_complete_continues_the_raw_ids(tiny_engine):
    ids = tiny_engine.tokenizer.encode_prompt(PROMPT)
    events = completed(tiny_engine, ids, temperature=0, max_tokens=6)
    assert events[0].prompt_tokens == len(ids) and events[0].ids == ids  # no chat template around it
    chat = tiny_engine.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    assert chat != ids
    with pytest.raises(ContextOverflow):
        list(tiny_engine.complete([1] * tiny_engine.context_limit, tiny_engine.new_session(), SamplingParams()))


def test_a_completion_is_the_engines_and_streams_the_same(tiny_engine, serve):
    server = serve(tiny_engine)
    ids = tiny_engine.tokenizer.encode_prompt(PROMPT)
    expected = completed(tiny_engine, ids, temperature=0, max_tokens=8)[-1]
    done = client(server).completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0)
    assert done.object == "text_completion" and done.id.startswith("cmpl-")
    assert done.choices[0].text == expected.reply
    assert done.choices[0].finish_reason == ("length" if expected.finish_reason == "length" else "stop")
    assert done.usage.prompt_tokens == len(ids) and done.usage.completion_tokens == expected.stats.completion_tokens
    usage = {"include_usage": True}
    chunks = list(
        client(server).completions.create(
            model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, stream=True, stream_options=usage
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.reply
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == done.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == done.usage.completion_tokens
    by_ids = client(server).completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == expected.reply
    again = client(server).completions.create(model="tiny", prompt=PROMPT + " Paris", max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the pool kept the first prompt's cache


def test_max_tokens_defaults_to_16_and_echo_returns_the_prompt(tiny_engine, serve, monkeypatch):
    monkeypatch.setattr(tiny_engine.tokenizer, "stop_ids", frozenset())  # never stops early: the limit shows
    server = serve(tiny_engine)
    done = client(server).completions.create(model="tiny", prompt=PROMPT, temperature=0)
    assert done.usage.completion_tokens == 16 and done.choices[0].finish_reason == "length"
    echoed = client(server).completions.create(model="tiny", prompt=PROMPT, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + done.choices[0].text
    stream = client(server).completions.create(model="tiny", prompt=PROMPT, temperature=0, echo=True, stream=True)
    assert "".join(c.choices[0].text for c in stream) == echoed.choices[0].text


def test_legacy_logprobs_are_parallel_lists(tiny_engine, serve):
    server = serve(tiny_engine)
    done = client(server).completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2)
    lp = done.choices[0].logprobs
    n = done.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert "".join(lp.tokens) == done.choices[0].text
    assert lp.text_offset == [len(PROMPT) + sum(len(t) for t in lp.tokens[:i]) for i in range(n)]  # OpenAI's
    ids = tiny_engine.tokenizer.encode_prompt(PROMPT)
    tokens = [e for e in completed(tiny_engine, ids, temperature=0, max_tokens=6, logprobs=2) if isinstance(e, Token)]
    assert lp.token_logprobs == pytest.approx([t.logprob for t in tokens if t.token_id >= 0])
    assert all(len(top) <= 2 for top in lp.top_logprobs)


@pytest.mark.parametrize(
    "body,param",
    [
        ({}, "prompt"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"prompt": "x", "n": 2}, "n"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "echo": True, "logprobs": 1}, "echo"),
        ({"prompt": "x", "logprobs": 99}, "logprobs"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": [1, 2, 10**9]}, "prompt"),
        ({"prompt": [1, 2**70]}, "prompt"),
    ],
)
def test_bad_completion_requests_are_400s(tiny_lean, serve, body, param):
    server = serve(tiny_lean)
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
