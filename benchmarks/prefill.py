"""Prefill tok/s of each runner on a prompt of `--tokens` ids (in the engine's chunks) vs the sgemm ceiling.

    python benchmarks/prefill.py [--model PATH] [--tokens 1000] [--threads N]
"""

from __future__ import annotations

import argparse
import time

import torch

from chatcli.bench.baseline import sgemm_ceiling
from chatcli.engine.engine import PREFILL_CHUNK
from chatcli.engine.quantize import calibration_ids
from chatcli.engine.load import LoadOptions, context_limit, load, make_runner


def prefill_s(runner, ids: list[int]) -> float:
    cache = runner.new_cache()
    with torch.inference_mode():
        t0 = time.perf_counter()
        for start in range(0, len(ids), PREFILL_CHUNK):
            runner.forward(ids[start : start + PREFILL_CHUNK], cache)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--runners", default="hf,lean,lean-int8")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load(args.model, LoadOptions(device="cpu"))
    limit = context_limit(loaded.model.config, loaded.tokenizer)
    ids = [(i * 7919) % loaded.model.config.vocab_size for i in range(args.tokens)]
    ceiling = sgemm_ceiling(loaded.model.config, args.tokens, PREFILL_CHUNK)
    print(f"sgemm ceiling {ceiling['ceiling_prefill_tok_s']:.0f} tok/s ({ceiling['sgemm_gflop_s']:.0f} GFLOP/s)")
    for name in args.runners.split(","):
        kind, _, quant = name.partition("-")
        runner = make_runner(loaded.model, limit, kind, quant or None, calibration_ids=calibration_ids(loaded.tokenizer))
        prefill_s(runner, ids[:64])  # warm-up
        best = min(prefill_s(runner, ids) for _ in range(2))
        rate = args.tokens / best
        print(f"{name:10s} {rate:6.0f} tok/s = {rate / ceiling['ceiling_prefill_tok_s']:.0%} of the ceiling")


if __name__ == "__main__":
    main()
