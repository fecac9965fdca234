"""`chatcli bench` on the tiny model: the shape and consistency of its result, and its errors.

Benchmarks are not tests: nothing here asserts a speed.
"""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from chatcli.bench import bench_command

SMALL = ["--turns", "3", "--max-tokens", "6", "--prefill-tokens", "60", "--turn-tokens", "12", "--reply-tokens", "4"]


def invoke(*args: str):
    return CliRunner().invoke(bench_command, list(args))


@pytest.fixture(scope="module")
def bench_json(tiny_model_dir):
    result = invoke(
        "--model",
        str(tiny_model_dir),
        "--device",
        "cpu",
        *SMALL,
        "--repeat",
        "2",
        "--startup-runs",
        "1",
        "--no-llama-cpp",
        "--json",
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_has_the_contract_keys(bench_json, tiny_model_dir):
    for key in ("model", "device", "dtype", "decode_tok_s", "prefill_tok_s", "ttft_s", "turns", "baseline"):
        assert key in bench_json
    assert bench_json["model"] == tiny_model_dir.name
    assert bench_json["device"] == "cpu" and bench_json["dtype"] == "float32"
    from chatcli.engine.runners.kernels import BUILDS, build_name, library, why_not

    # the default for a Llama model: the lean path, in the compiled kernel where it runs
    assert bench_json["runner"] == ("native" if library() else "lean")
    assert bench_json["decode_kernel"] == (f"compiled ({build_name()})" if library() else f"torch ({why_not()})")
    assert build_name() in (list(BUILDS) if library() else [""])
    assert bench_json["decode_tok_s"] > 0 and bench_json["prefill_tok_s"] > 0 and bench_json["ttft_s"] > 0
    assert bench_json["baseline"]["hf_generate_decode_tok_s"] > 0
    assert bench_json["repeat"] == 2
    assert bench_json["speedup"]["decode"] == pytest.approx(
        bench_json["decode_tok_s"] / bench_json["baseline"]["hf_generate_decode_tok_s"]
    )


def test_prefill_prompt_is_the_requested_size(bench_json):
    assert 40 <= bench_json["prefill_tokens"] <= 60


def test_turns_reuse_the_cache(bench_json):
    rows = bench_json["turns"]
    assert [r["turn"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert set(r) >= {"turn", "context_tokens", "cached_tokens", "prefill_tokens", "ttft_s", "ttft_recompute_s"}
        assert r["cached_tokens"] + r["prefill_tokens"] == r["context_tokens"]
        assert r["ttft_s"] > 0 and r["ttft_recompute_s"] > 0
    assert rows[0]["cached_tokens"] == 0
    for before, after in zip(rows, rows[1:], strict=False):
        # the previous prompt is a prefix of this one, so at least that much is reused
        assert after["cached_tokens"] >= before["context_tokens"]
        assert after["prefill_tokens"] < after["context_tokens"]


def test_extras_are_reported(bench_json):
    sgemm = bench_json["sgemm"]
    assert sgemm["ceiling_prefill_tok_s"] > 0 and sgemm["prompt_tokens"] > 0
    start = bench_json["startup"]
    commands = [row["command"] for row in start["rows"]]
    assert commands[:4] == ["chatcli (default)", "chatcli fp32", "chatcli int8", "python -c 'import torch'"]
    for row in start["rows"]:
        assert row["exit"] == 0, row
        assert row["wall_s"] > 0 and row["peak_mib"] > 10
    # quality only for quantized weights (asked for, or a GGUF's own blocks), --quality, or a KV cache in another
    # dtype than the model (auto: bf16 on some CPUs); the tiny model is no GGUF: auto leaves its weights as they are
    assert bench_json["quantize"] is None
    assert (bench_json["quality"] is None) == (bench_json["kv_dtype"] == bench_json["dtype"])


def test_quantized_bench_reports_quality(tiny_model_dir):
    result = invoke(
        "--model",
        str(tiny_model_dir),
        "--device",
        "cpu",
        "--quantize",
        "int8",
        *SMALL,
        "--turns",
        "1",
        "--no-baseline",
        "--no-ceiling",
        "--no-startup",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["quantize"] == "int8" and data["baseline"] is None
    quality = data["quality"]
    assert len(quality["prompts"]) == 3
    assert all(isinstance(p["answer"], str) and isinstance(p["reference"], str) for p in quality["prompts"])
    assert quality["perplexity"] > 1 and quality["perplexity_reference"] > 1
    assert quality["reference_weights"] == data["dtype"]  # the reference is never quantized
    assert quality["perplexity_ratio"] == pytest.approx(quality["perplexity"] / quality["perplexity_reference"])


def test_lookup_rows_compare_decode_without_and_with_drafting(bench_json):
    rows = bench_json["lookup"]
    assert [row["prompt"] for row in rows] == ["story", "code edit"]
    for row in rows:
        assert row["lookup"] == 4 and row["off_tok_s"] > 0 and row["on_tok_s"] > 0
        assert 0 <= row["accepted_tokens"] <= row["draft_tokens"]
        assert 0 < row["completion_tokens"] <= 6
        assert row["same_reply"] is True  # greedy with an fp32 model: drafting never changes a reply


def test_table_output(tiny_model_dir, bench_json):
    from rich.console import Console

    from chatcli.bench.report import render

    buf = io.StringIO()
    render(bench_json, Console(file=buf, width=160))
    text = buf.getvalue()
    assert "decode tok/s" in text and "transformers generate()" in text
    assert "multi-turn" in text and "one-shot `Hi`, process start to exit" in text and "prompt lookup" in text
    assert f"{bench_json['decode_tok_s']:.1f}" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (["--runner", "fast"], "Invalid value for '--runner': 'fast' is not one of 'auto', 'hf', 'lean'"),
        (["--quantize", "int4"], "Invalid value for '--quantize': 'int4' is not one of 'auto', 'none', 'int8'"),
        (["--turns", "-1"], "--turns must be >= 0"),
        (["--dtype", "float8"], "Invalid value for '--dtype'"),
        (["--kv-dtype", "int4"], "Invalid value for '--kv-dtype': 'int4' is not one of 'auto', 'float32'"),
        (["--lookup", "99"], "--lookup must be <= 16"),
    ],
)
def test_bad_options_give_one_line(tiny_model_dir, args, message):
    result = invoke("--model", str(tiny_model_dir), "--device", "cpu", *args, "--json")
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_missing_model_is_one_line(tmp_path):
    result = invoke("--model", str(tmp_path / "nope.gguf"), "--json")
    assert result.exit_code == 1
    assert "model file not found" in result.output and "Traceback" not in result.output
