"""chatcli and llama.cpp on random models of real models' shapes, the same weights, one run.

    python benchmarks/shapes.py [--shapes llama-3.2-1b,qwen2.5-0.5b] [--steps 32] [--context 100]
    CHATCLI_LLAMA_PYTHON=/path/to/llama-venv/bin/python python benchmarks/shapes.py

Each shape is a random Llama built from a config (no download; Qwen2.5-0.5B's shapes with Llama
blocks, without its q/k/v biases), converted to chatcli's lean files (fp32, int8, and q4 / q8
quantized from the fp32 weights at conversion: Q4_1 layers and a Q8_0 head, or Q8_0 throughout)
and written as GGUFs
(`gguf_llama.py`: F32, Q8_0, Q4_0) that llama.cpp runs in a child process of the venv that has
llama-cpp-python (`$CHATCLI_LLAMA_PYTHON`, as `chatcli bench` finds it). Decode tok/s is the
median step after a `--context`-token prefill (chatcli) or the mean over the steps (llama.cpp,
the bench's own child script), on the same number of threads.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from families import RandomIds, median_step
from gguf_llama import write_llama_gguf

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
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        rope_theta=1000000.0,
    ),
}


def build(shape: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    fields = dict(SHAPES[shape])
    rope = {"rope_type": "default", "rope_theta": fields.pop("rope_theta")}
    config = LlamaConfig(**fields, max_position_embeddings=2048, tie_word_embeddings=True, rope_parameters=rope)
    return LlamaForCausalLM(config).eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--quants", default="F32,Q8_0,Q4_0")
    ap.add_argument("--kinds", default="float32-panels,int8,q4,q8", help="chatcli's lean kinds")
    args = ap.parse_args()

    from chatcli.bench import _cpu_name
    from chatcli.bench.baseline import llama_cpp, llama_python
    from chatcli.engine.lean_convert import convert_lean
    from chatcli.engine.lean_weights import LeanWeights
    from chatcli.engine.native import NativeRunner, kernel_threads

    python = llama_python()
    threads = kernel_threads()
    print(f"# {_cpu_name()}, {threads} threads; decode tok/s after a {args.context}-token prefill")
    for shape in args.shapes.split(","):
        model = build(shape)
        folder = Path(tempfile.mkdtemp(prefix=f"shape-{shape}-"))
        for kind in args.kinds.split(","):
            path = folder / f"{kind}.safetensors"
            convert_lean(folder, path, kind, shape, model_loader=lambda m=model: (m, RandomIds()))
            runner = NativeRunner(LeanWeights(path, kind, shape))
            rate = 1 / median_step(runner, args.context, args.steps)
            print(f"{shape:14s} chatcli {kind:15s} {rate:7.1f} tok/s  weights {runner.weight_bytes / 2**20:7.0f} MiB")
            del runner
            path.unlink()
        if python is None:
            print(f"{shape:14s} llama.cpp: no llama-cpp-python ($CHATCLI_LLAMA_PYTHON)")
            continue
        ids = list(range(10, 10 + args.context))
        for quant in args.quants.split(","):
            gguf_path = write_llama_gguf(model, folder / f"{quant}.gguf", quant)
            size = gguf_path.stat().st_size / 2**20
            try:
                got = llama_cpp(python, str(gguf_path), ids, ids, args.steps, threads)
                print(f"{shape:14s} llama.cpp {quant:13s} {got['decode_tok_s']:7.1f} tok/s  file {size:7.0f} MiB")
            except RuntimeError as exc:
                print(f"{shape:14s} llama.cpp {quant}: {exc}")
            gguf_path.unlink()


if __name__ == "__main__":
    main()
