"""`GET /metrics`: the server's counters in Prometheus' text format (version 0.0.4), as llama-server
and vLLM expose theirs: requests by outcome, the queue and the slot, tokens prompted, read from the
prompt cache, prefilled and generated, the prefix pool's hits, misses and evictions, and its bytes.
Written by hand: a dozen lines of text, no client library. Behind the API key where one is set."""

from __future__ import annotations

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _number(value: float) -> str:
    """A sample's value: whole numbers exactly (a byte count past a million keeps its digits)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(model: str | None, worker=None, pool=None) -> str:
    """The metrics text; `model` None (with no worker or pool): still loading."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.extend([f"# HELP chatcli_{name} {help_}", f"# TYPE chatcli_{name} {kind}"])
        lines.extend(f"chatcli_{name}{labels} {_number(value)}" for labels, value in samples)

    metric("model_loaded", "gauge", "1 once the model answers.", [("", 1 if model is not None else 0)])
    if model is None or worker is None or pool is None:
        return "\n".join(lines) + "\n"
    metric("model_info", "gauge", "The model this server answers with.", [(f'{{model="{_label(model)}"}}', 1)])
    outcomes = {"served": worker.served, "cancelled": worker.cancelled, "failed": worker.failed}
    metric(
        "requests_total",
        "counter",
        "Requests finished, by how they ended.",
        [(f'{{outcome="{k}"}}', v) for k, v in outcomes.items()],
    )
    metric("requests_pending", "gauge", "Requests queued or generating.", [("", worker.pending)])
    metric("slots_total", "gauge", "Requests generated at once at most (--parallel).", [("", worker.parallel)])
    metric("slots_busy", "gauge", "Slots generating now.", [("", worker.running)])
    runner = getattr(worker.engine, "runner", None)
    if hasattr(runner, "batches"):  # the slots' steps, run as batches
        metric("batches_total", "counter", "Forward calls of the slots' steps, batched.", [("", runner.batches)])
        metric("batch_rows_total", "counter", "Rows (tokens) in those calls.", [("", runner.rows)])
    tokens = worker.tokens
    metric("prompt_tokens_total", "counter", "Prompt tokens of the turns served.", [("", tokens["prompt"])])
    metric("prompt_cached_tokens_total", "counter", "Prompt tokens read from the KV cache.", [("", tokens["cached"])])
    metric("prefill_tokens_total", "counter", "Prompt tokens prefilled.", [("", tokens["prefilled"])])
    metric("generated_tokens_total", "counter", "Tokens generated.", [("", tokens["generated"])])
    stats = pool.stats()
    for key, help_ in (
        ("hits", "Requests served from a cached prefix."),
        ("forks", "Requests that forked a cached prefix."),
        ("misses", "Requests that found no cached prefix."),
        ("evictions", "Cached sessions evicted to stay within the budget."),
    ):
        metric(f"prompt_cache_{key}_total", "counter", help_, [("", stats[key])])
    metric("kv_cache_bytes", "gauge", "Bytes of the KV caches in the prefix pool.", [("", stats["bytes"])])
    metric("kv_cache_budget_bytes", "gauge", "The prefix pool's budget.", [("", stats["budget_bytes"])])
    return "\n".join(lines) + "\n"
