"""Token log-probabilities (issue 17): the sampler's distribution, the engine's events (drafts too),
the one-shot's `--json --logprobs N` and the server's OpenAI fields through the openai client.

The reference is a direct log-softmax: of the model's logits (greedy), or of the logits at the
temperature over the candidates top-k/top-p/min-p keep, renormalised (sampling)."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from chatcli.engine.events import Finished, Token
from chatcli.engine.sample.sampling import SamplingParams, token_logprobs
from tests.servers import USER


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def test_greedy_logprobs_are_the_log_softmax_of_the_logits():
    logits = np.random.default_rng(0).standard_normal(300).astype(np.float32) * 3
    want = log_softmax(logits)
    params = SamplingParams(temperature=0.0)
    chosen, top = token_logprobs(logits, 17, params, top=5)
    assert chosen == pytest.approx(want[17], abs=1e-9)
    assert [i for i, _ in top] == list(np.argsort(-want)[:5])
    assert [lp for _, lp in top] == pytest.approx(sorted(want, reverse=True)[:5], abs=1e-9)


def test_sampled_logprobs_follow_temperature_and_truncation():
    logits = np.random.default_rng(1).standard_normal(300).astype(np.float32) * 3
    plain = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    assert token_logprobs(logits, 3, plain)[0] == pytest.approx(log_softmax(logits)[3], abs=1e-6)
    params = SamplingParams(temperature=0.7, top_k=5, top_p=1.0, min_p=0.0)
    keep = np.argsort(-logits)[:5]
    want = log_softmax(logits[keep] / np.float32(0.7))  # renormalised over the five
    chosen, top = token_logprobs(logits, int(keep[2]), params, top=8)
    assert chosen == pytest.approx(want[2], abs=1e-6)
    assert [i for i, _ in top] == list(keep) and len(top) == 5  # only what the sampler could draw
    outside = int(np.argsort(-logits)[10])
    assert token_logprobs(logits, outside, params)[0] == -math.inf


def turn(engine, params: SamplingParams, messages=USER):
    session = engine.new_session()
    events = list(engine.generate(messages, session, params))
    return [e for e in events if isinstance(e, Token) and e.token_id >= 0], events[-1]


def test_each_token_carries_the_log_softmax_of_the_model(tiny_engine, tiny_loaded):
    import torch

    tokens, done = turn(tiny_engine, SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, lookup=0))
    assert isinstance(done, Finished) and len(tokens) == 12
    prompt = tiny_engine.tokenizer.encode_chat(USER)
    ids = prompt + [t.token_id for t in tokens]
    with torch.no_grad():
        logits = tiny_loaded.model(torch.tensor([ids])).logits[0].float().numpy()  # [S, V]
    for j, t in enumerate(tokens):
        want = log_softmax(logits[len(prompt) - 1 + j])
        assert t.logprob == pytest.approx(want[t.token_id], abs=2e-3)
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0][0] == int(np.argmax(want)) == t.token_id


def test_drafted_tokens_get_the_logprobs_single_steps_give(tiny_engine):
    if not tiny_engine.runner.exact_verify:
        pytest.skip("drafts are not checked exactly on this runner")
    text = "one two three four five six seven eight nine ten " * 3
    messages = [{"role": "user", "content": "Repeat: " + text}]
    base = SamplingParams(temperature=0.0, max_tokens=24, logprobs=2)
    plain, _ = turn(tiny_engine, base.with_(lookup=0), messages)
    drafted, done = turn(tiny_engine, base.with_(lookup=4), messages)
    assert done.stats.draft_tokens > 0
    assert [t.token_id for t in drafted] == [t.token_id for t in plain]
    for a, b in zip(drafted, plain, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [i for i, _ in a.top_logprobs] == [i for i, _ in b.top_logprobs]


def test_no_logprobs_unless_asked(tiny_engine):
    tokens, _ = turn(tiny_engine, SamplingParams(temperature=0.0, max_tokens=4))
    assert all(t.logprob is None and t.top_logprobs is None for t in tokens)


def test_oneshot_json_has_per_token_logprobs(tiny_model_dir, tmp_path):
    import subprocess
    import sys

    env = {"XDG_DATA_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "chatcli", "-m", str(tiny_model_dir), "-p", "Hello", "--json"]
    cmd += ["--logprobs", "2", "--max-tokens", "6", "--temperature", "0", "--device", "cpu"]
    env = {**os.environ, **env}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    scored = record["logprobs"]
    assert len(scored) == record["stats"]["completion_tokens"] == 6
    for entry in scored:
        assert set(entry) == {"token", "id", "logprob", "bytes", "top"} and entry["logprob"] <= 0
        assert len(entry["top"]) == 2 and entry["top"][0]["logprob"] >= entry["top"][1]["logprob"]
    assert "".join(bytes(e["bytes"]).decode("utf-8", "replace") for e in scored).strip() == record["reply"].strip()
    bad = subprocess.run([*cmd[:-8], "--logprobs", "21"], capture_output=True, text=True, timeout=300, env=env)
    assert bad.returncode != 0 and "logprobs must be in [0, 20]" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    plain = [c for c in cmd if c != "--json"]  # nowhere to show them: said, not ignored
    unseen = subprocess.run(plain, capture_output=True, text=True, timeout=300, env=env)
    assert unseen.returncode == 2
    assert unseen.stderr == "chatcli: error: --logprobs shows in the --json output: add --json\n"


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_openai_client_gets_logprobs_whole_and_streamed(tiny_engine, serve):
    from openai import BadRequestError

    server = serve(tiny_engine)
    ask = dict(model="tiny", messages=USER, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3)
    done = client(server).chat.completions.create(**ask)
    content = done.choices[0].logprobs.content
    assert len(content) == 8 and "".join(c.token for c in content) == done.choices[0].message.content
    for c in content:
        assert c.logprob <= 0 and len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token
        # a whole character's token: its UTF-8; part of one (U+FFFD as text): the part's own bytes
        assert bytes(c.bytes) == c.token.encode() or (c.token == "\ufffd" and len(c.bytes) < 4)
    chunks = list(client(server).chat.completions.create(**ask, stream=True))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 5)) for e in streamed] == [(e.token, round(e.logprob, 5)) for e in content]
    plain = client(server).chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=4)
    assert plain.choices[0].logprobs is None
    with pytest.raises(BadRequestError, match=r"top_logprobs must be in \[0, 20\]"):
        client(server).chat.completions.create(**{**ask, "top_logprobs": 21})
    with pytest.raises(BadRequestError, match="top_logprobs needs logprobs: true"):
        client(server).chat.completions.create(**{**ask, "logprobs": False})
