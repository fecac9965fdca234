"""`chatcli bench --shape NAME --gguf-type TYPE`: both sides on one GGUF file of that type.

A random model of a real model's shapes is written as an F16 GGUF (`gguf_write.write_random_gguf`:
no transformers model, no fp32 copy), quantized to TYPE by llama.cpp's own quantizer in
llama-cpp-python's interpreter, and run by chatcli as a user runs it (`chatcli -m FILE`: its first
start into a cache that holds only the compiled kernel, built once per machine; later one-shots;
decode and prefill in a child of their own) and by llama.cpp beside it, with each side's peak memory.

A mixture of experts (`--shape qwen3-30b-a3b`, `mixtral-8x7b`, `gpt-oss-20b` as MXFP4_MOE), or any shape where
llama-cpp-python is not installed, is written straight as random blocks of the type (`gguf_blocks`: Q4_K_M's
mix, MXFP4_MOE's, Q8_0 or F16), with as many of its layers as this machine's memory holds the file of (the
result says how many); llama.cpp then runs beside it where it is installed, else the result says it did not.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from chatcli.bench.errors import BenchError
from chatcli.bench.shapes import CHATCLI_CHILD, CONTEXT, SHAPES, _child

# llama.cpp's own quantizer (llama-cpp-python), in its interpreter: F16 GGUF -> the asked type
_QUANTIZE = r"""
import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
params.nthread = int(sys.argv[4])
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params))
"""


def run_gguf_type(
    shape: str,
    gguf_type: str,
    context: int = 100,
    new_tokens: int = 32,
    prefill_tokens: int = 512,
    llama_python: str | None = None,
    threads: int = 2,
    runs: int = 3,
    progress=lambda _msg: None,
) -> dict:
    """`chatcli bench --shape NAME --gguf-type TYPE`: a random model of `shape` written as F16, quantized
    to `gguf_type` (Q4_K_M, Q5_K_M, Q6_K, Q8_0, …) by llama.cpp's own quantizer, and both sides on that
    one file: chatcli as a user gets it (`-m FILE`: its first start into an empty cache, timed with its
    peak memory; later one-shots; decode and prefill), llama.cpp the same where it runs."""
    import os

    from chatcli.bench.baseline import LLAMA_ONESHOT, llama_cpp, process_run
    from chatcli.bench.gguf_blocks import fitting_layers, shape_types, write_random_blocks

    fields = {**SHAPES[shape], "max_position_embeddings": CONTEXT}
    layers = fields["num_hidden_layers"]
    random_blocks = bool(fields.get("num_experts")) or not llama_python
    types = shape_types(fields)
    if random_blocks and gguf_type not in types:
        raise ValueError(
            f"--gguf-type {gguf_type} is made by llama.cpp's own quantizer (install llama-cpp-python)"
            if not fields.get("num_experts") else f"--shape {shape} is written as {', '.join(types)}, not {gguf_type}"
        )  # fmt: skip
    if random_blocks:
        fields["num_hidden_layers"] = fitting_layers(fields, gguf_type)
    folder = Path(tempfile.mkdtemp(prefix=f"chatcli-shape-{shape}-"))
    try:
        path = folder / f"{gguf_type}.gguf"
        if random_blocks:
            kept = fields["num_hidden_layers"]
            progress(f"writing a random {shape} model ({kept} of its {layers} layers) as {gguf_type}'s blocks")
            write_random_blocks(fields, path, gguf_type)
        else:
            _quantized_by_llama_cpp(fields, folder, path, shape, gguf_type, llama_python, threads, progress)
        cache, data = folder / "cache", folder / "data"
        env = {
            **os.environ,
            "CHATCLI_CACHE_DIR": str(cache),
            "CHATCLI_DATA_DIR": str(data),
            "CHATCLI_CONFIG": str(folder / "none.toml"),
        }
        oneshot = [sys.executable, "-m", "chatcli", "-m", str(path), "-p", "Hi", "--max-tokens", "1"]
        _copy_kernel(cache)
        progress("chatcli: first start (a cache empty but for the compiled kernel)")
        first = process_run(oneshot, env, timeout=3600)
        cache_mib = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) / 2**20
        rng = random.Random(1)
        vocab = fields["vocab_size"]
        prefill = [rng.randrange(vocab) for _ in range(prefill_tokens)]
        decode = prefill[:context]
        args = {"prefill": prefill, "decode": decode, "new_tokens": new_tokens, "threads": threads}
        progress("chatcli: later one-shots, decode and prefill")
        later = [process_run(oneshot, env) for _ in range(runs)]
        ours = _child([sys.executable, "-c", CHATCLI_CHILD, json.dumps({**args, "model": str(path)})], env)
        ours.update(_processes(first, later), cache_mib=cache_mib)
        result = {
            "shape": shape,
            "gguf_type": gguf_type,
            "layers": fields["num_hidden_layers"],
            "layers_of": layers,
            "max_file_gib": fields.get("max_file_gib"),
            "blocks": "random, written here" if random_blocks else "llama.cpp's quantizer",
            "file_mib": path.stat().st_size / 2**20,
            "threads": threads,
            "chatcli": ours,
            "llama_cpp": None,
        }
        if not llama_python:
            result["llama_cpp"] = {"error": "not run: llama-cpp-python is not installed here"}
            return result
        progress(f"llama.cpp {gguf_type}: one-shots, decode and prefill")
        try:
            theirs = llama_cpp(llama_python, str(path), decode, prefill, new_tokens, threads)
            shots = [process_run([llama_python, "-c", LLAMA_ONESHOT, str(path), str(threads)]) for _ in range(runs + 1)]
            theirs.update(_processes(shots[0], shots[1:]))
            theirs["decode_ratio"] = ours["decode_tok_s"] / theirs["decode_tok_s"]
            theirs["prefill_ratio"] = ours["prefill_tok_s"] / theirs["prefill_tok_s"]
        except Exception as exc:  # noqa: BLE001 - optional comparison: report, don't fail
            theirs = {"error": f"{type(exc).__name__}: {exc}"}
        result["llama_cpp"] = theirs
        return result
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _quantized_by_llama_cpp(fields, folder, path, shape, gguf_type, llama_python, threads, progress) -> None:
    """A random model of these fields written as an F16 GGUF, quantized to `gguf_type` at `path` by llama.cpp."""
    from chatcli.bench.gguf_write import write_random_gguf

    progress(f"writing a random {shape} model as an F16 GGUF")
    f16 = write_random_gguf(fields, folder / "F16.gguf")
    if gguf_type.upper() == "F16":  # the file as written: nothing to quantize
        f16.rename(path)
        return
    progress(f"quantizing it to {gguf_type} with llama.cpp")
    done = subprocess.run([llama_python, "-c", _QUANTIZE, str(f16), str(path), gguf_type, str(threads)],
                          capture_output=True, text=True, timeout=3600)  # fmt: skip
    if done.returncode != 0 or not path.is_file():
        raise RuntimeError(f"llama.cpp could not quantize to {gguf_type}: {(done.stderr or '').strip()[-300:]}")
    f16.unlink()


def _copy_kernel(cache: Path) -> None:
    """The compiled kernel (built once per machine, not per model) into the child's empty cache, so that
    its first start times the model's first start, not a compiler's."""
    from chatcli.engine.runners import kernels

    if kernels.library() is None:
        return
    built = kernels.library_path(kernels.compiler(), kernels.build_name())
    (cache / "kernels").mkdir(parents=True, exist_ok=True)
    for part in built.parent.glob(f"{built.stem}.*"):
        shutil.copy2(part, cache / "kernels" / part.name)


def _processes(first: tuple, later: list[tuple]) -> dict:
    """A first start's and later one-shots' (wall s, peak MiB, exit) as the result's fields (medians)."""
    import statistics

    return {
        "first_start_s": first[0],
        "first_start_peak_mib": first[1],
        "first_start_exit": first[2],
        "oneshot_s": statistics.median(w for w, _, _ in later),
        "oneshot_peak_mib": statistics.median(m for _, m, _ in later),
        "oneshot_exit": max((code for _, _, code in later), key=abs),
    }


def bench_gguf_type(shape, model, gguf_type, max_tokens, prefill_tokens, threads, progress) -> dict:
    """`--shape NAME --gguf-type TYPE`: both sides on one file of that type made by llama.cpp."""
    from chatcli.bench import baseline as ref
    from chatcli.engine.runners.native import kernel_threads

    if not shape or model:
        raise BenchError("--gguf-type takes --shape (a random model of that shape), not --model")
    llama_python = ref.llama_python()
    try:
        result = run_gguf_type(
            shape,
            gguf_type,
            new_tokens=max_tokens,
            prefill_tokens=prefill_tokens,
            llama_python=llama_python,
            threads=threads or kernel_threads(),
            progress=progress,
        )
    except (RuntimeError, ValueError) as exc:
        raise BenchError(str(exc)) from None
    return {"cpu": ref.cpu_name(), **result}
