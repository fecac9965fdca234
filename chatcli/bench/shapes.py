"""`chatcli bench --shape NAME`: chatcli and llama.cpp on a random model of a real model's shapes.

No download: a random Llama is built from a config with the shapes of Llama-3.2-1B or
Qwen2.5-0.5B (the latter with Llama blocks, without its q/k/v biases), converted into a lean
file of the asked kind in a temporary folder and written as a GGUF (`gguf_write`) that
llama.cpp runs in the same bench where llama-cpp-python is installed. Both read the same
weights: for q4 / q8 the model's weights are first rounded to Q4_0 / Q8_0 values, the GGUF
holds those blocks and the lean file takes them as they are (`quant_blocks.GGUFBlocks`); fp32
runs beside llama.cpp's F32, int8 beside its Q8_0 (the same model, each with its own rounding).
Each side decodes in a child process of its own, which reports its peak resident memory
(`VmHWM`: the weights it touched, mapped, and everything else it holds).
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

SHAPES = {
    "llama-3.2-1b": dict(
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
        rope_theta=500000.0,
    ),
    "llama-3.2-3b": dict(
        hidden_size=3072,
        num_hidden_layers=28,
        num_attention_heads=24,
        num_key_value_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
        rope_theta=500000.0,
    ),
    "llama-3.1-8b": dict(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
        rope_theta=500000.0,
        tie_word_embeddings=False,
    ),
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        rope_theta=1000000.0,
    ),
    # mixtures of experts (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B; gpt-oss; Mixtral): --gguf-type only (gguf_blocks)
    "qwen3-30b-a3b": dict(
        hidden_size=2048,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        vocab_size=151936,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
    ),
    # gpt-oss-20b (transformers' GptOssConfig): MXFP4 experts, biases, sinks, YaRN, every other layer sliding
    "gpt-oss-20b": dict(
        gguf_arch="gpt-oss",
        hidden_size=2880,
        num_hidden_layers=24,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=2880,
        num_experts=32,
        num_experts_per_tok=4,
        sliding_window=128,
        vocab_size=201088,  # o200k's; the tokens here are SmolLM2's, padded (gguf_write)
        rope_theta=150000.0,
        rope_factor=32.0,
        original_max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    # Mixtral-8x7B: a llama with 8 experts of 14,336, 2 a token; at most 7 GiB of it (~8 of 32 layers)
    "mixtral-8x7b": dict(
        gguf_arch="llama",
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        num_experts=8,
        num_experts_per_tok=2,
        vocab_size=32000,
        rope_theta=1000000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        max_file_gib=7.0,
    ),
}
LLAMA_QUANT = {None: "F32", "int8": "Q8_0", "q8": "Q8_0", "q4": "Q4_0"}  # chatcli's --quantize -> the GGUF's
KINDS = {None: "float32-panels", "int8": "int8", "q8": "q8", "q4": "q4"}
CONTEXT = 2048


def build(fields: dict, seed: int = 0):
    """A random Llama of these shapes (tied embeddings, as the small models have, unless the shape says not)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    fields = dict(fields)
    rope = {"rope_type": "default", "rope_theta": fields.pop("rope_theta", 10000.0)}
    tied = fields.pop("tie_word_embeddings", True)
    config = LlamaConfig(**fields, max_position_embeddings=CONTEXT, tie_word_embeddings=tied, rope_parameters=rope)
    return LlamaForCausalLM(config).eval()


class RandomIds:
    """The tokenizer a conversion asks for: a context limit, and calibration ids for int8."""

    model_max_length = CONTEXT

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def encode(self, _text: str) -> list[int]:
        rng = random.Random(0)
        return [rng.randrange(self.vocab) for _ in range(256)]


def round_to(model, qtype: str) -> None:
    """Every matrix of `model` (the embedding included) replaced by its `qtype` blocks' values."""
    import gguf
    import torch

    kind = getattr(gguf.GGMLQuantizationType, qtype)
    with torch.no_grad():
        for _name, p in model.named_parameters():
            if p.dim() == 2:
                blocks = gguf.quants.quantize(p.detach().float().numpy(), kind)
                p.copy_(torch.from_numpy(gguf.quants.dequantize(blocks, kind)))


# A child that decodes on a lean file (or on a model as `chatcli -m` loads it) and reports its speed, the kernel
# build that ran and its peak memory (a fresh process, so VmHWM is its own).
CHATCLI_CHILD = r"""
import json, statistics, sys, time
a = json.loads(sys.argv[1])
if "model" in a:
    from chatcli.engine import load_engine
    from chatcli.engine.load.options import LoadOptions
    runner = load_engine(a["model"], LoadOptions(kv_dtype="float32")).runner
else:
    from chatcli.engine.weights.lean_file import LeanWeights
    from chatcli.engine.runners.native import NativeRunner
    runner = NativeRunner(LeanWeights(a["path"], a["kind"], a["source"]), kv_dtype="float32", threads=a["threads"])
cache = runner.new_cache()
t0 = time.perf_counter()
runner.forward(a["prefill"], cache)
prefill_s = time.perf_counter() - t0
cache = runner.new_cache()
token = int(runner.forward(a["decode"], cache).argmax())
steps = []
for _ in range(a["new_tokens"] - 1):
    t0 = time.perf_counter()
    token = int(runner.forward([token], cache).argmax())
    steps.append(time.perf_counter() - t0)
peak = next((int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")), None)
print(json.dumps({"decode_tok_s": 1 / statistics.median(steps), "prefill_tok_s": len(a["prefill"]) / prefill_s,
                  "weights": runner.weights_dtype, "weights_mib": runner.weight_bytes / 2**20, "peak_rss_kib": peak,
                  "active_mib": getattr(runner, "active_bytes", runner.weight_bytes) / 2**20,
                  "kernel": runner.kernel}))
"""


def run_shape(
    shape,
    quantize: str | None = None,
    context: int = 100,
    new_tokens: int = 32,
    prefill_tokens: int = 512,
    llama_python: str | None = None,
    threads: int = 2,
    progress=lambda _msg: None,
) -> dict:
    """Decode and prefill tok/s and peak memory of chatcli and llama.cpp on a random model of
    `shape` (a name in SHAPES, or a config's fields), as `chatcli bench --shape --json` prints."""
    from chatcli.bench.baseline import llama_cpp
    from chatcli.bench.gguf_write import write_llama_gguf
    from chatcli.engine.weights.lean_convert import convert_lean

    name = shape if isinstance(shape, str) else "custom"
    fields = SHAPES[shape] if isinstance(shape, str) else shape
    if fields.get("num_experts"):
        kind = "MXFP4_MOE" if fields.get("gguf_arch") == "gpt-oss" else "Q4_K_M"
        raise BenchError(f"--shape {name} is a mixture of experts: add --gguf-type {kind}")
    qtype, kind = LLAMA_QUANT[quantize], KINDS[quantize]
    progress(f"building a random {name} model")
    model = build(fields)
    if quantize in ("q4", "q8"):
        progress(f"rounding its weights to {qtype}")
        round_to(model, qtype)
    folder = Path(tempfile.mkdtemp(prefix=f"chatcli-shape-{name}-"))
    try:
        gguf_path = None
        if quantize in ("q4", "q8") or llama_python:
            progress(f"writing it as a {qtype} GGUF")
            gguf_path = write_llama_gguf(model, folder / f"{qtype}.gguf", qtype)
        progress(f"converting it to chatcli's {kind} lean file")
        lean = folder / f"{kind}.safetensors"
        grouped_from = gguf_path if quantize in ("q4", "q8") else None
        vocab = fields["vocab_size"]
        taken = []
        convert_lean(
            folder,
            lean,
            kind,
            name,
            status=lambda text, *_a, **_k: taken.append(text) if text.startswith("Took") else None,
            model_loader=lambda: (model, RandomIds(vocab)),
            gguf_file=grouped_from,
        )
        model = None  # the bench process lets go of the fp32 copy before the children run
        rng = random.Random(1)
        prefill = [rng.randrange(vocab) for _ in range(prefill_tokens)]
        decode = prefill[:context]
        args = {"prefill": prefill, "decode": decode, "new_tokens": new_tokens, "threads": threads}
        progress(f"chatcli {kind}: decode and prefill")
        ours = _child(
            [sys.executable, "-c", CHATCLI_CHILD, json.dumps({**args, "path": str(lean), "kind": kind, "source": name})]
        )
        result = {
            "shape": name,
            "fields": fields,
            "quantize": quantize,
            "threads": threads,
            "chatcli": {"kind": kind, "blocks": taken[0] if taken else None, **ours},
            "llama_cpp": None,
        }
        if llama_python and gguf_path:
            progress(f"llama.cpp {qtype}: decode and prefill")
            try:
                theirs = llama_cpp(llama_python, str(gguf_path), decode, prefill, new_tokens, threads)
                theirs["decode_ratio"] = ours["decode_tok_s"] / theirs["decode_tok_s"]
                if theirs.get("peak_rss_kib") and ours.get("peak_rss_kib"):
                    theirs["memory_ratio"] = ours["peak_rss_kib"] / theirs["peak_rss_kib"]
            except Exception as exc:  # noqa: BLE001 - optional comparison: report, don't fail
                theirs = {"error": f"{type(exc).__name__}: {exc}"}
            result["llama_cpp"] = {"quant": qtype, "file_mib": gguf_path.stat().st_size / 2**20, **theirs}
        return result
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _child(command: list[str], env: dict | None = None) -> dict:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=env)
    if proc.returncode != 0:
        lines = (proc.stderr or "").strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit status {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_shape(shape, model, quantize, max_tokens, prefill_tokens, llama_cpp, threads, progress) -> dict:
    """`--shape`: a random model of that shape on the compiled kernel, beside llama.cpp (bench/shapes.py)."""
    from chatcli.bench import baseline as ref
    from chatcli.bench.shapes import run_shape
    from chatcli.engine.load.options import QUANTIZE_CHOICES, explicit_quantize
    from chatcli.engine.runners import kernels
    from chatcli.engine.runners.native import kernel_threads

    if model:
        raise BenchError("--shape builds its own random model: leave out --model")
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise BenchError(f"--quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {quantize!r}")
    quantize = explicit_quantize(quantize)  # a random model has no GGUF blocks: auto is none
    if kernels.library() is None:
        raise BenchError(f"--shape runs on the compiled kernel, which is not available: {kernels.why_not()}")
    result = run_shape(
        shape,
        quantize,
        new_tokens=max_tokens,
        prefill_tokens=prefill_tokens,
        llama_python=ref.llama_python() if llama_cpp else None,
        threads=threads or kernel_threads(),
        progress=progress,
    )
    return {"cpu": ref.cpu_name(), **result}
