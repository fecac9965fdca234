"""`chatcli bench`: the engine's speed on the current model, beside transformers' `generate()`.

One process, one model: decode tok/s, prefill tok/s on a ~1,000-token prompt, TTFT,
a multi-turn run (cached vs recomputed TTFT per turn), the `generate()` baseline, the
sgemm ceiling for prefill, int8 quality against fp32 (with `--quantize`), llama.cpp
when it happens to be installed, and a one-shot start-up breakdown in a child process.

Registered by the CLI as `app.add_command(bench_command)` (a click command); `python -m chatcli.bench`
runs it alone. Benchmarks are not tests: the suite checks the shape of the result only.
This module imports neither torch nor transformers at the top (CLI start-up time).
"""

from __future__ import annotations

import json
import sys

import click

from chatcli.bench.baseline import cpu_name
from chatcli.bench.depth import depth_options
from chatcli.bench.errors import BenchError
from chatcli.errors import one_line
from chatcli.flags import model_options

__all__ = ["bench_command", "run_bench"]


@click.command("bench", context_settings={"help_option_names": ["-h", "--help"]})
@model_options(without=("device_map", "trust_remote_code", "raw"))  # the engine's paths: transformers' is the baseline
@click.option("--turns", type=int, default=10, show_default=True, help="user turns in the multi-turn run (0 skips it)")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="tokens to decode in the decode run")
@click.option("--prefill-tokens", type=int, default=1000, show_default=True, help="prompt length of the prefill run")
@click.option(
    "--turn-tokens", type=int, default=160, show_default=True, help="tokens per user message in the multi-turn run"
)
@click.option(
    "--reply-tokens", type=int, default=32, show_default=True, help="reply tokens per turn in the multi-turn run"
)
@click.option(
    "--lookup", type=int, default=4, show_default=True, help="drafted tokens in the prompt-lookup run (0 skips it)"
)
@click.option("--baseline/--no-baseline", default=True, help="run transformers' generate() as the baseline")
@click.option("--ceiling/--no-ceiling", default=True, help="measure the sgemm ceiling for prefill")
@click.option(
    "--quality/--no-quality",
    default=None,
    help="greedy answers and perplexity vs fp32 (default: where the weights are quantized, auto included)",
)
@click.option(
    "--startup/--no-startup",
    default=True,
    help="time one-shot processes start to exit (the default, fp32, int8, import torch, llama.cpp)",
)
@click.option("--startup-runs", type=int, default=5, show_default=True, help="counted runs of each start-up command")
@click.option(
    "--llama-cpp/--no-llama-cpp",
    default=True,
    help="compare with llama.cpp where llama-cpp-python is installed ($CHATCLI_LLAMA_PYTHON names a venv's python)",
)
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
@click.option(
    "--repeat", type=int, default=1, show_default=True, help="run each measurement this many times; keep the best"
)
@click.option(
    "--shape",
    type=click.Choice(["llama-3.2-1b", "llama-3.2-3b", "qwen2.5-0.5b", "qwen3-30b-a3b", "gpt-oss-20b", "mixtral-8x7b"]),
    default=None,
    help="a random model of this model's shapes instead of --model, beside llama.cpp on the same weights",
)
@click.option(
    "--gguf-type",
    default=None,
    metavar="TYPE",
    help="with --shape: the model as an F16 GGUF quantized to TYPE (Q4_K_M, Q5_K_M, Q6_K, Q8_0, …) by "
    "llama.cpp's own quantizer (a mixture of experts, or without llama-cpp-python: random blocks of Q4_K_M, "
    "Q8_0, F16 or, for a mixture, MXFP4_MOE); chatcli runs that file as `-m FILE` does, llama.cpp beside it",
)
@depth_options
@click.option("--json", "json_output", is_flag=True, help="print the result as JSON")
def bench_command(
    model,
    device,
    dtype,
    runner,
    quantize,
    kv_dtype,
    ctx_size,
    chat_template,
    turns,
    max_tokens,
    prefill_tokens,
    turn_tokens,
    reply_tokens,
    lookup,
    baseline,
    ceiling,
    quality,
    startup,
    startup_runs,
    llama_cpp,
    threads,
    repeat,
    shape,
    gguf_type,
    depths,
    peers,
    json_output,
) -> None:
    """Measure decode, prefill, TTFT and multi-turn caching against transformers' generate()."""
    from rich.console import Console

    err = Console(stderr=True)
    said = lambda line: err.print(f"chatcli: error: {line}", markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    for name, value, low in (
        ("turns", turns, 0),
        ("max-tokens", max_tokens, 2),
        ("prefill-tokens", prefill_tokens, 8),
        ("turn-tokens", turn_tokens, 1),
        ("reply-tokens", reply_tokens, 1),
        ("lookup", lookup, 0),
        ("threads", threads or 1, 1),
        ("startup-runs", startup_runs, 1),
        ("repeat", repeat, 1),
    ):
        if value < low:
            said(f"--{name} must be >= {low}, got {value}")
            raise click.exceptions.Exit(2)
    from chatcli.engine.params import MAX_LOOKUP

    if lookup > MAX_LOOKUP:
        said(f"--lookup must be <= {MAX_LOOKUP}, got {lookup}")
        raise click.exceptions.Exit(2)
    shown = [""]  # the last progress line: a step said once however many times it is reported

    def progress(msg: str) -> None:
        if not json_output and msg != shown[0]:
            shown[0] = msg
            err.print(f"[dim]{msg}[/dim]", markup=True, highlight=False)

    from chatcli.bench import report

    def run() -> dict:
        if depths is not None or peers:
            from chatcli.bench.depth import bench_depth
            from chatcli.engine.load.options import LoadOptions

            options = LoadOptions(
                device=device, dtype=dtype, runner=runner, quantize=quantize, kv_dtype=kv_dtype, ctx_size=ctx_size,
                chat_template=chat_template,
            )  # fmt: skip
            depths_run = depths or [0]
            return bench_depth(model, options, depths_run, peers, max_tokens, prefill_tokens, repeat, threads, progress)
        if gguf_type:
            from chatcli.bench.gguf_types import bench_gguf_type

            return bench_gguf_type(shape, model, gguf_type, max_tokens, prefill_tokens, threads, progress)
        if shape:
            from chatcli.bench.shapes import bench_shape

            return bench_shape(shape, model, quantize, max_tokens, prefill_tokens, llama_cpp, threads, progress)
        return run_bench(
            model=model,
            device=device,
            dtype=dtype,
            runner=runner,
            quantize=quantize,
            kv_dtype=kv_dtype,
            ctx_size=ctx_size,
            chat_template=chat_template,
            turns=turns,
            max_tokens=max_tokens,
            prefill_tokens=prefill_tokens,
            turn_tokens=turn_tokens,
            reply_tokens=reply_tokens,
            lookup=lookup,
            baseline=baseline,
            ceiling=ceiling,
            quality=quality,
            startup=startup,
            llama_cpp=llama_cpp,
            threads=threads,
            repeat=repeat,
            progress=progress,
            startup_runs=startup_runs,
        )

    try:
        result = run()
    except BenchError as exc:
        said(exc)
        raise click.exceptions.Exit(1) from None
    if json_output:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        shown = report.render_gguf_type if gguf_type else report.render_shape if shape else report.render
        (report.render_depth if "rows" in result else shown)(result, Console())


RUNNER_NAMES = {"NativeRunner": "native", "LeanRunner": "lean", "HFRunner": "hf"}


def run_bench(
    model=None,
    device="auto",
    dtype="auto",
    runner="auto",
    quantize=None,
    kv_dtype="auto",
    ctx_size=None,
    chat_template=None,
    turns=10,
    max_tokens=128,
    prefill_tokens=1000,
    turn_tokens=160,
    reply_tokens=32,
    lookup=4,
    baseline=True,
    ceiling=True,
    quality=None,
    startup=True,
    llama_cpp=True,
    threads=None,
    repeat=1,
    progress=lambda _msg: None,
    startup_runs=5,
) -> dict:
    """Everything `chatcli bench` measures, as the dict `--json` prints."""
    from chatcli.bench import baseline as ref
    from chatcli.bench import measure
    from chatcli.bench.peers import gguf_of
    from chatcli.engine.engine import PREFILL_CHUNK, ContextOverflow
    from chatcli.engine.load.options import LoadError, LoadOptions

    options = LoadOptions(
        device=device,
        dtype=dtype,
        runner=runner,
        quantize=quantize,
        kv_dtype=kv_dtype,
        ctx_size=ctx_size,
        chat_template=chat_template,
    )
    engine = measure.load(model, options, threads, progress)  # the kernel's team `threads` wide; torch's below
    report = lambda text, *_a, **_k: progress(text)  # noqa: E731 - load steps as progress lines
    try:
        kv_name = str(getattr(engine.runner, "kv_dtype", engine.runner.dtype)).removeprefix("torch.")
        dtype_name = str(engine.runner.dtype).removeprefix("torch.")
        weights = engine.runner.weights_dtype  # what --quantize resolved to: int8 / q4 / q8, or the dtype
        if quality is None:
            quality = weights != dtype_name or kv_name != dtype_name
        hf = None
        if baseline or ceiling or quality:
            from chatcli.engine.load.hf import load

            progress("loading the transformers reference")
            hf = load(model, LoadOptions(device=device, dtype=dtype), status=report)
    except LoadError as exc:
        raise BenchError(str(exc)) from None
    import torch  # the reference and baseline run on it (the engine may not)

    if threads:
        torch.set_num_threads(threads)
    runner_name = RUNNER_NAMES.get(type(engine.runner).__name__, type(engine.runner).__name__)
    native = runner_name == "native"
    result: dict = {
        "model": engine.name,
        "cpu": cpu_name(),
        "device": str(getattr(engine.runner.device, "type", engine.runner.device)),
        "dtype": str(engine.runner.dtype).removeprefix("torch."),
        "runner": runner_name,
        "quantize": weights if weights != dtype_name else None,
        "kv_dtype": str(getattr(engine.runner, "kv_dtype", engine.runner.dtype)).removeprefix("torch."),
        # "compiled (avx512)" or "compiled (avx2)" (kernels/decode.cpp's build, the native runner), else
        # the torch path and why
        "decode_kernel": f"compiled ({_kernel_build()})" if native else f"torch ({_why_not_kernel(runner_name)})",
        "threads": getattr(engine.runner, "threads", None) or torch.get_num_threads(),
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
                bases.append(
                    ref.hf_generate(hf.model, decodes[-1]["prompt_ids"], prefills[-1]["prompt_ids"], max_tokens)
                )
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
        decode_tok_s=dec["decode_tok_s"],
        decode_tokens=dec["completion_tokens"],
        prefill_tok_s=pre["prefill_tok_s"],
        prefill_tokens=pre["prefill_tokens"],
        prefill_ttft_s=pre["ttft_s"],
        ttft_s=min(d["ttft_s"] for d in decodes),
        turns=rows,
        lookup=drafting,
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
        result["sgemm"] = ref.sgemm_ceiling(hf.model.config, len(pre["prompt_ids"]), PREFILL_CHUNK, hf.model.dtype)
        result["sgemm"]["prefill_fraction"] = pre["prefill_tok_s"] / result["sgemm"]["ceiling_prefill_tok_s"]
        result["sgemm"]["prefill_fraction_projections_only"] = (
            pre["prefill_tok_s"] / result["sgemm"]["ceiling_projections_tok_s"]
        )
    result["quality"] = None
    if quality:
        from chatcli.engine.load.hf import build_engine

        progress("quality against the unquantized reference with a cache in the model's dtype")
        runner_kind = "hf" if runner_name == "hf" else "lean"  # the weights as transformers has them: no blocks
        reference = build_engine(hf, runner=runner_kind, quantize="none", kv_dtype=result["dtype"], kernel=native)
        result["quality"] = measure.quality(engine, reference, 32)
        result["quality"]["reference_weights"] = reference.runner.weights_dtype
        del reference
    gguf = gguf_of(model)
    result["llama_cpp"] = None
    llama = ref.llama_python() if llama_cpp else None
    if llama and gguf:
        progress("llama.cpp on the same GGUF")
        try:
            lc = ref.llama_cpp(llama, gguf, dec["prompt_ids"], pre["prompt_ids"], max_tokens, result["threads"])
            lc["decode_ratio"] = dec["decode_tok_s"] / lc["decode_tok_s"]
            lc["prefill_ratio"] = pre["prefill_tok_s"] / lc["prefill_tok_s"]
        except Exception as exc:  # noqa: BLE001 - optional comparison: report, don't fail
            lc = {"error": f"{type(exc).__name__}: {one_line(exc)}"}
        result["llama_cpp"] = lc
    result["startup"] = None
    if startup:
        progress("one-shot processes, start to exit")
        result["startup"] = ref.startup(model, startup_runs, llama, gguf, result["threads"])
    return result


def _kernel_build() -> str:
    from chatcli.engine.runners import kernels

    return kernels.build_name()


def _why_not_kernel(runner_name: str) -> str:
    from chatcli.engine.runners import kernels

    if runner_name == "hf":
        return "not the lean runner"
    return kernels.why_not() or "the lean runner on torch (a GPU, bf16 weights, or an fp16 cache)"
