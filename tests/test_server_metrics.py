"""`GET /metrics`: the server's counters in Prometheus' text format, as the requests left them."""

from __future__ import annotations

import httpx

from chatcli.server.metrics import exposition
from tests.servers import TIMEOUT, USER


def scrape(server, **headers) -> dict[str, float]:
    """name{labels} -> value of every sample; the format's own lines checked on the way."""
    r = httpx.get(server.url + "/metrics", headers=headers, timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in r.text.splitlines():
        if line.startswith("#"):
            assert line.startswith(("# HELP chatcli_", "# TYPE chatcli_")), line
            continue
        name, value = line.rsplit(" ", 1)
        samples[name] = float(value)
    return samples


def ask(server, messages: list[dict]) -> tuple[dict, str]:
    body = {"model": "tiny", "messages": messages, "max_tokens": 5, "temperature": 0}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()["usage"], r.json()["choices"][0]["message"]["content"]


def test_the_counters_follow_the_requests(tiny_lean, serve):
    server = serve(tiny_lean)
    before = scrape(server)
    assert before["chatcli_model_loaded"] == 1 and before['chatcli_requests_total{outcome="served"}'] == 0
    assert before[f'chatcli_model_info{{model="{tiny_lean.name}"}}'] == 1
    first, reply = ask(server, USER)
    turn = [*USER, {"role": "assistant", "content": reply}, {"role": "user", "content": "And of Spain?"}]
    second, _ = ask(server, turn)  # the conversation goes on: its first turn is read from the cache
    after = scrape(server)
    assert after['chatcli_requests_total{outcome="served"}'] == 2 and after["chatcli_requests_pending"] == 0
    assert after["chatcli_slots_busy"] == 0 and after["chatcli_slots_total"] == 1
    assert after["chatcli_prompt_tokens_total"] == first["prompt_tokens"] + second["prompt_tokens"]
    assert after["chatcli_generated_tokens_total"] == first["completion_tokens"] + second["completion_tokens"]
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and after["chatcli_prompt_cached_tokens_total"] == cached
    assert after["chatcli_prefill_tokens_total"] == after["chatcli_prompt_tokens_total"] - cached
    assert after["chatcli_prompt_cache_hits_total"] + after["chatcli_prompt_cache_forks_total"] >= 1
    assert 0 < after["chatcli_kv_cache_bytes"] <= after["chatcli_kv_cache_budget_bytes"]


def test_metrics_are_for_the_keys_holder(tiny_lean, serve):
    server = serve(tiny_lean, api_key="s3cret")
    assert httpx.get(server.url + "/metrics", timeout=TIMEOUT).status_code == 401
    assert scrape(server, authorization="Bearer s3cret")["chatcli_model_loaded"] == 1


def test_while_loading_only_that_is_said():
    text = exposition(None)
    assert "chatcli_model_loaded 0" in text and "requests_total" not in text
    assert 'model_info{model="a \\"b\\""}' in exposition('a "b"', _Worker(), _Pool())
    assert "chatcli_kv_cache_budget_bytes 3159525376\n" in exposition("m", _Worker(), _Pool(3159525376))


class _Worker:
    served = cancelled = failed = pending = running = 0
    parallel = 1
    tokens = {"prompt": 0, "cached": 0, "prefilled": 0, "generated": 0}
    engine = None


class _Pool:
    def __init__(self, budget: int = 0) -> None:
        self.budget = budget

    def stats(self) -> dict:
        return {**dict.fromkeys(("hits", "forks", "misses", "evictions", "bytes"), 0), "budget_bytes": self.budget}
