"""The KV cache of a long conversation with sliding-window layers: a strip per layer against the whole context.

    python benchmarks/sliding.py [--context 8192] [--steps 32] [--kind int8]

A random model with Gemma 3 1B's attention (1 KV head of 256, 4 query heads, a 512-position window
on five layers of six, 1,152 wide) but 6 layers, a 2,304-wide MLP and a 32,768 vocabulary (the KV
cache per layer is the point, not the weights), built from its config and converted to a lean file.
Each variant runs in a child of its own (so that its peak RSS, VmHWM, is its own): prefill
`--context` random ids in the engine's 512-id chunks, then `--steps` decode steps. "strip" is what
chatcli does (`kv_memory.Strip`); "whole" keeps every layer for the whole context, as before. Both
must give the same logits, bit for bit (checked). Needs the compiled kernel.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CONTEXT = 16384


class RandomIds:
    """The tokenizer a conversion asks for: a context limit, and calibration ids for int8."""

    model_max_length = CONTEXT

    def encode(self, _text: str) -> list[int]:
        return list(range(100, 356))


def build():
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        hidden_size=1152,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        intermediate_size=2304,
        vocab_size=32768,
        sliding_window=512,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        max_position_embeddings=CONTEXT,
        query_pre_attn_scalar=256,
    )
    return Gemma3ForCausalLM(config).eval()


CHILD = r"""
import json, sys, time
import numpy as np
a = json.loads(sys.argv[1])
from chatcli.engine.kv import memory as kv_memory
if a["variant"] == "whole":
    kv_memory.strip_for = lambda *args: None  # every layer for the whole context
from chatcli.engine.weights.lean_file import LeanWeights
from chatcli.engine.runners.native import NativeRunner
runner = NativeRunner(LeanWeights(a["path"], a["kind"], "sliding"))
cache = runner.new_cache()
rng = np.random.default_rng(0)
ids = rng.integers(100, 30000, a["context"]).tolist()
t = time.perf_counter()
for i in range(0, len(ids), 512):
    logits = runner.forward(ids[i : i + 512], cache)
prefill = time.perf_counter() - t
token, seen = int(logits.argmax()), [float(logits.sum())]
t = time.perf_counter()
for _ in range(a["steps"]):
    logits = runner.forward([token], cache)
    token = int(logits.argmax())
    seen.append(float(logits.sum()))
decode = time.perf_counter() - t
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"prefill_tok_s": len(ids) / prefill, "decode_tok_s": a["steps"] / decode,
                  "kv_cache_mib": cache.nbytes / 2**20, "peak_rss_mib": hwm / 1024, "logit_sums": seen,
                  "weights_mib": runner.weight_bytes / 2**20}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--kind", default="int8", choices=["float32-panels", "int8", "q4"])
    args = ap.parse_args()

    from chatcli.bench import _cpu_name as cpu_name
    from chatcli.engine.runners import kernels
    from chatcli.engine.weights.lean_convert import convert_lean

    if kernels.library() is None:
        sys.exit(f"the compiled kernel is not available: {kernels.why_not()}")
    model = build()
    folder = Path(tempfile.mkdtemp(prefix="lean-sliding-"))
    path = folder / f"{args.kind}.safetensors"
    convert_lean(folder, path, args.kind, "sliding", model_loader=lambda m=model: (m, RandomIds()))
    del model  # the children map the lean file; this process needs the weights no more
    print(f"# {cpu_name()}; {args.kind}; {args.context}-token prefill, then {args.steps} decode steps")
    rows = {}
    for variant in ("strip", "whole"):
        a = json.dumps({"variant": variant, "path": str(path), "kind": args.kind, **vars(args)})
        out = subprocess.run([sys.executable, "-c", CHILD, a], capture_output=True, text=True, check=True)
        rows[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    same = rows["strip"].pop("logit_sums") == rows["whole"].pop("logit_sums")
    print(f"{'':6s} {'KV MiB':>8s} {'peak MiB':>9s} {'prefill/s':>10s} {'decode/s':>9s}")
    for variant, r in rows.items():
        print(
            f"{variant:6s} {r['kv_cache_mib']:8.1f} {r['peak_rss_mib']:9.1f} {r['prefill_tok_s']:10.1f} "
            f"{r['decode_tok_s']:9.1f}"
        )
    print(f"same logits: {same}; weights {rows['strip']['weights_mib']:.0f} MiB")
    if not same:
        sys.exit("the strip changed the logits")


if __name__ == "__main__":
    main()
