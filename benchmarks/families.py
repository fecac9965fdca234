"""Decode speed of each lean family against transformers' `generate()`, on random 135M-shaped models.

    python benchmarks/families.py [--families qwen2,gemma2,...] [--steps 64] [--context 100]

For each family a random model with SmolLM2-135M's shapes (576 wide, 30 layers, 9 heads of 64,
3 KV heads, 1,536 MLP, 49,152 vocab) and the family's own defaults otherwise
(`AutoConfig.for_model`), built from the config (no download), converted to lean files in a
temporary folder; then per runner the median decode step after a `--context`-token prefill:
the kernel in fp32, int8 and q4 where it runs, the torch lean runner, and transformers' greedy
`generate()` (the bench's baseline: (N - 1) tokens over the time beyond one new token).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from decode_step import step_times

from chatcli.bench.shapes import RandomIds  # a context limit and calibration ids for int8

SHAPES = dict(
    hidden_size=576,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    intermediate_size=1536,
    vocab_size=49152,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
EXTRA = {"gemma2": {"query_pre_attn_scalar": 64}, "gemma3_text": {"query_pre_attn_scalar": 64}}
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text")


def build(family: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(family, **SHAPES, **EXTRA.get(family, {}))
    return AutoModelForCausalLM.from_config(config).eval()


def median_step(runner, context: int, steps: int) -> float:
    return statistics.median(step_times(runner, context, steps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--hf-tokens", type=int, default=32)
    args = ap.parse_args()

    from chatcli.bench import _cpu_name as cpu_name
    from chatcli.bench.baseline import hf_generate
    from chatcli.engine.runners import kernels
    from chatcli.engine.runners.lean import LeanRunner
    from chatcli.engine.weights.lean_convert import convert_lean
    from chatcli.engine.weights.lean_file import LeanWeights

    native = kernels.library() is not None
    print(f"# {cpu_name()}; decode tok/s after a {args.context}-token prefill (median step)")
    columns = ("native fp32", "native int8", "native q4", "lean torch", "hf generate", "fp32 / hf", "q4 / hf")
    print(f"{'family':12s} " + " ".join(f"{c:>11s}" for c in columns))
    for family in args.families.split(","):
        model = build(family)
        folder = Path(tempfile.mkdtemp(prefix=f"lean-{family}-"))
        kinds = ["float32-dense"] + (["float32-panels", "int8", "q4"] if native else [])
        files = {}
        for kind in kinds:
            path = folder / f"{kind}.safetensors"
            convert_lean(folder, path, kind, family, model_loader=lambda m=model: (m, RandomIds(SHAPES["vocab_size"])))
            files[kind] = LeanWeights(path, kind, family)
        rates = {"lean": 1 / median_step(LeanRunner(files["float32-dense"]), args.context, args.steps)}
        if native:
            from chatcli.engine.runners.native import NativeRunner

            for name, kind in (("native", "float32-panels"), ("native-int8", "int8"), ("native-q4", "q4")):
                rates[name] = 1 / median_step(NativeRunner(files[kind]), args.context, args.steps)
        ids = list(range(10, 10 + args.context))
        hf = hf_generate(model, ids, ids, args.hf_tokens)["hf_generate_decode_tok_s"]
        fp32 = max(rates.get("native", 0), rates["lean"])
        nan = float("nan")
        print(
            f"{family:12s} {rates.get('native', nan):11.1f} {rates.get('native-int8', nan):11.1f} "
            f"{rates.get('native-q4', nan):11.1f} {rates['lean']:11.1f} {hf:11.1f} {fp32 / hf:10.1f}x "
            f"{rates.get('native-q4', nan) / hf:10.1f}x"
        )


if __name__ == "__main__":
    main()
