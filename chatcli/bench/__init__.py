"""`chatcli bench`: the engine's speed on the current model, beside transformers' `generate()`.

One process, one model: decode tok/s, prefill tok/s on a ~1,000-token prompt, TTFT,
a multi-turn run (cached vs recomputed TTFT per turn), the `generate()` baseline, the
sgemm ceiling for prefill, int8 quality against fp32 (with `--quantize`), llama.cpp
when it happens to be installed, and a one-shot start-up breakdown in a child process.

Registered by the CLI as `app.command("bench")(bench_command)`; `python -m chatcli.bench`
runs it alone. Benchmarks are not tests: the suite checks the shape of the result only.
This module imports neither torch nor transformers at the top (CLI start-up time).
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

__all__ = ["bench_command", "run_bench"]


def bench_command(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="A .gguf file, model folder or hub id.")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | mps")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16")] = "auto",
    runner: Annotated[str, typer.Option(help="auto | hf | lean: which forward the engine uses")] = "auto",
    quantize: Annotated[Optional[str], typer.Option(help="int8 (CPU): dynamic int8 weights and activations")] = None,
    kv_dtype: Annotated[str, typer.Option(help="KV cache dtype: auto | float32 | bfloat16 | float16")] = "auto",
    turns: Annotated[int, typer.Option(help="user turns in the multi-turn run (0 skips it)")] = 10,
    max_tokens: Annotated[int, typer.Option(help="tokens to decode in the decode run")] = 128,
    prefill_tokens: Annotated[int, typer.Option(help="prompt length of the prefill run")] = 1000,
    turn_tokens: Annotated[int, typer.Option(help="tokens per user message in the multi-turn run")] = 160,
    reply_tokens: Annotated[int, typer.Option(help="reply tokens per turn in the multi-turn run")] = 32,
    lookup: Annotated[int, typer.Option(help="drafted tokens in the prompt-lookup run (0 skips it)")] = 4,
    baseline: Annotated[bool, typer.Option(help="run transformers' generate() as the baseline")] = True,
    ceiling: Annotated[bool, typer.Option(help="measure the sgemm ceiling for prefill")] = True,
    quality: Annotated[Optional[bool], typer.Option(help="greedy answers and perplexity vs fp32 (default: with --quantize)")] = None,
    startup: Annotated[bool, typer.Option(help="time a one-shot start-up (import, load, first token) in a child process")] = True,
    llama_cpp: Annotated[bool, typer.Option("--llama-cpp/--no-llama-cpp", help="compare with llama.cpp if llama-cpp-python is installed")] = True,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads (default: torch's choice)")] = None,
    repeat: Annotated[int, typer.Option(help="run each measurement this many times; keep the best")] = 1,
    json_output: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Measure decode, prefill, TTFT and multi-turn caching against transformers' generate()."""
    from rich.console import Console

    err = Console(stderr=True)
    for name, value, low in (("turns", turns, 0), ("max-tokens", max_tokens, 2), ("prefill-tokens", prefill_tokens, 8),
                             ("turn-tokens", turn_tokens, 1), ("reply-tokens", reply_tokens, 1), ("lookup", lookup, 0),
                             ("threads", threads or 1, 1),
                             ("repeat", repeat, 1)):
        if value < low:
            err.print(f"chatcli: error: --{name} must be >= {low}, got {value}", markup=False, highlight=False)
            raise typer.Exit(2)
    from chatcli.engine.params import MAX_LOOKUP

    if lookup > MAX_LOOKUP:
        err.print(f"chatcli: error: --lookup must be <= {MAX_LOOKUP}, got {lookup}", markup=False, highlight=False)
        raise typer.Exit(2)
    progress = (lambda _msg: None) if json_output else (lambda msg: err.print(f"[dim]{msg}[/dim]"))
    try:
        result = run_bench(
            model=model, device=device, dtype=dtype, runner=runner, quantize=quantize, kv_dtype=kv_dtype, turns=turns,
            max_tokens=max_tokens, prefill_tokens=prefill_tokens, turn_tokens=turn_tokens, reply_tokens=reply_tokens,
            lookup=lookup, baseline=baseline, ceiling=ceiling, quality=quality, startup=startup, llama_cpp=llama_cpp,
            threads=threads, repeat=repeat, progress=progress,
        )
    except BenchError as exc:
        err.print(f"chatcli: error: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    if json_output:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        from chatcli.bench.report import render

        render(result, Console())


class BenchError(RuntimeError):
    """The bench cannot run as asked; one line for the user."""


def run_bench(
    model=None, device="auto", dtype="auto", runner="auto", quantize=None, kv_dtype="auto", turns=10, max_tokens=128,
    prefill_tokens=1000, turn_tokens=160, reply_tokens=32, lookup=4, baseline=True, ceiling=True, quality=None,
    startup=True, llama_cpp=True, threads=None, repeat=1, progress=lambda _msg: None,
) -> dict:
    """Everything `chatcli bench` measures, as the dict `--json` prints."""
    import torch

    from chatcli.bench import baseline as ref
    from chatcli.bench import measure
    from chatcli.engine.engine import PREFILL_CHUNK, ContextOverflow, Engine
    from chatcli.engine.load import LoadError, LoadOptions, build_engine, load, make_runner

    if threads:
        torch.set_num_threads(threads)
    try:
        progress("loading the model")
        loaded = load(model, LoadOptions(device=device, dtype=dtype, runner=runner, quantize=quantize,
                                                  kv_dtype=kv_dtype), status=progress)
        engine = build_engine(loaded)
    except LoadError as exc:
        raise BenchError(str(exc)) from None
    runner_name = "lean" if type(engine.runner).__name__ == "LeanRunner" else "hf"
    result: dict = {
        "model": loaded.name,
        "device": loaded.device,
        "dtype": loaded.dtype,
        "runner": runner_name,
        "quantize": quantize,
        "kv_dtype": str(getattr(engine.runner, "kv_dtype", loaded.model.dtype)).removeprefix("torch."),
        # decode steps: "compiled" (kernels/decode.cpp), else the torch path and why
        "decode_kernel": "compiled" if getattr(engine.runner, "compiled", None) is not None
        else f"torch ({getattr(engine.runner, 'kernel_why_not', '') or 'not the lean runner'})",
        "threads": torch.get_num_threads(),
        "repeat": repeat,
        "context_limit": engine.context_limit,
    }
    try:
        progress("warming up")
        measure.warm_up(engine)
        decodes, prefills, bases = [], [], []
        for r in range(repeat):  # engine and baseline alternate, so both see the same machine load
            progress(f"decode: up to {max_tokens} tokens (run {r + 1}/{repeat})")
            decodes.append(measure.decode(engine, max_tokens))
            progress(f"prefill: a {prefill_tokens}-token prompt")
            prefills.append(measure.prefill(engine, prefill_tokens))
            if baseline:
                progress("baseline: transformers generate()")
                bases.append(ref.hf_generate(loaded.model, decodes[-1]["prompt_ids"], prefills[-1]["prompt_ids"],
                                             max_tokens))
        dec = max(decodes, key=lambda d: d["decode_tok_s"])
        pre = max(prefills, key=lambda d: d["prefill_tok_s"])
        progress(f"multi-turn: {turns} turns")
        rows = measure.turns(engine, turns, turn_tokens, reply_tokens, repeat) if turns else []
        drafting = []
        if lookup:
            progress(f"prompt lookup: greedy decode with and without --lookup {lookup}")
            drafting = measure.lookup(engine, max_tokens, lookup, repeat) if engine.runner.exact_verify else []
    except ContextOverflow as exc:
        raise BenchError(f"{exc}; use smaller --prefill-tokens / --turn-tokens") from None
    result.update(
        decode_tok_s=dec["decode_tok_s"], decode_tokens=dec["completion_tokens"], prefill_tok_s=pre["prefill_tok_s"],
        prefill_tokens=pre["prefill_tokens"], prefill_ttft_s=pre["ttft_s"], ttft_s=min(d["ttft_s"] for d in decodes),
        turns=rows, lookup=drafting,
    )
    if rows:
        last, first = rows[-1], rows[0]
        result["turns_summary"] = {
            "ttft_last_over_first": last["ttft_s"] / first["ttft_s"] if first["ttft_s"] else None,
            "recompute_over_cached_last": last["ttft_recompute_s"] / last["ttft_s"] if last["ttft_s"] else None,
            "history_tokens_last": last["cached_tokens"],
        }
    result["baseline"] = None
    if bases:
        result["baseline"] = {k: (min if k.endswith("ttft_s") else max)(b[k] for b in bases) for k in bases[0]}
        b = result["baseline"]
        result["speedup"] = {
            "decode": dec["decode_tok_s"] / b["hf_generate_decode_tok_s"],
            "prefill": pre["prefill_tok_s"] / b["hf_generate_prefill_tok_s"],
        }
    result["sgemm"] = None
    if ceiling:
        progress("sgemm ceiling")
        result["sgemm"] = ref.sgemm_ceiling(loaded.model.config, len(pre["prompt_ids"]), PREFILL_CHUNK, loaded.model.dtype)
        result["sgemm"]["prefill_fraction"] = pre["prefill_tok_s"] / result["sgemm"]["ceiling_prefill_tok_s"]
        result["sgemm"]["prefill_fraction_projections_only"] = (
            pre["prefill_tok_s"] / result["sgemm"]["ceiling_projections_tok_s"]
        )
    result["quality"] = None
    if quality or (quality is None and (quantize or result["kv_dtype"] != loaded.dtype)):
        progress("quality against the unquantized reference with a cache in the model's dtype")
        reference = Engine(make_runner(loaded.model, engine.context_limit, runner_name, None, loaded.dtype),
                           engine.tokenizer)
        result["quality"] = measure.quality(engine, reference, 32)
        del reference
    result["llama_cpp"] = None
    if llama_cpp and ref.llama_cpp_available() and loaded.source.endswith(".gguf"):
        progress("llama.cpp on the same GGUF")
        try:
            lc = ref.llama_cpp(loaded.source, dec["prompt_ids"], pre["prompt_ids"], max_tokens, torch.get_num_threads())
            lc["decode_ratio"] = dec["decode_tok_s"] / lc["decode_tok_s"]
            lc["prefill_ratio"] = pre["prefill_tok_s"] / lc["prefill_tok_s"]
        except Exception as exc:  # noqa: BLE001 - optional comparison: report, don't fail
            lc = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        result["llama_cpp"] = lc
    result["startup"] = None
    if startup:
        progress("one-shot start-up in a child process")
        result["startup"] = ref.startup(model, device, dtype, runner, quantize, kv_dtype)
    return result
