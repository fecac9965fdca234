"""benchmarks/serve_load.py runs: N streamed clients at once against `chatcli serve` (the tiny model),
its rows counting every client's tokens. Not timed: the figures are the benchmark's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "serve_load.py"


def test_the_load_benchmark_counts_every_clients_tokens_through_each_api(tiny_model_dir):
    argv = [sys.executable, str(SCRIPT), "--model", str(tiny_model_dir), "--clients", "1,3", "--tokens", "4", "--json"]
    done = subprocess.run([*argv, "--api", "openai,anthropic,ollama"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    apis = ["openai", "anthropic", "ollama"]
    assert [(r["server"], r["api"], r["clients"]) for r in rows] == [("chatcli", a, n) for n in (1, 3) for a in apis]
    for r in rows:
        assert r["tokens"] == 4 * r["clients"]  # max_tokens each: the usage's counts, summed
        assert r["aggregate_tok_s"] > 0 and r["decode_tok_s"] > 0 and 0 < r["ttft_p50_s"] <= r["ttft_p95_s"]


def test_the_decode_rate_counts_the_tokens_after_each_first_from_the_earliest_first():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from serve_load import summary
    finally:
        sys.path.remove(str(SCRIPT.parent))
    # two clients: first tokens at 0.5 s and 1.0 s, 5 tokens each, last tokens at 2.5 s and 3.0 s
    row = summary(2, [(0.5, 5, 2.5), (1.0, 5, 3.0)])
    assert row["aggregate_tok_s"] == round(10 / 3.0, 1)  # prefill's wait included
    assert row["decode_tok_s"] == round(8 / 2.5, 1)  # 4 + 4 tokens after the firsts, from 0.5 s to 3.0 s
    assert row["per_client_tok_s"] == 2.0 and (row["ttft_p50_s"], row["ttft_p95_s"]) == (0.75, 1.0)


def test_each_api_is_judged_against_chat_completions_in_the_same_round():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from serve_load import api_shares
    finally:
        sys.path.remove(str(SCRIPT.parent))
    rates = {
        0: {"openai": 100.0, "ollama": 95.0},
        1: {"ollama": 150.0, "openai": 200.0},
        2: {"openai": 50, "ollama": 55},
    }
    rows = [
        {"server": "chatcli", "api": api, "clients": 1, "round": turn, "aggregate_tok_s": rate}
        for turn, apis in rates.items()
        for api, rate in apis.items()
    ] + [{"server": "llama-server", "api": "openai", "clients": 1, "round": 0, "aggregate_tok_s": 1.0}]
    (share,) = api_shares(rows)
    assert (share["api"], share["clients"], share["rounds"]) == ("ollama", 1, 3)
    assert share["median"] == 0.95 and (share["min"], share["max"]) == (0.75, 1.1)  # a pair a round, not the means
