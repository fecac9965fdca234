"""Prefill tok/s of each runner on a prompt of `--tokens` ids (in the engine's chunks) vs the sgemm ceiling.

python benchmarks/prefill.py [--model PATH] [--tokens 1000] [--runners native,lean,...]
"""

from __future__ import annotations

import argparse
import time

from runners import engine_named

from chatcli.bench.baseline import sgemm_ceiling
from chatcli.engine.engine import PREFILL_CHUNK


def prefill_s(runner, ids: list[int]) -> float:
    cache = runner.new_cache()
    t0 = time.perf_counter()
    for start in range(0, len(ids), PREFILL_CHUNK):
        runner.forward(ids[start : start + PREFILL_CHUNK], cache)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--runners", default="native,native-int8,lean,lean-int8,hf")
    args = ap.parse_args()
    engines = {name: engine_named(name, args.model) for name in args.runners.split(",")}
    from chatcli.engine.load.hf import load

    config = load(args.model).model.config
    ids = [(i * 7919) % config.vocab_size for i in range(args.tokens)]
    ceiling = sgemm_ceiling(config, args.tokens, PREFILL_CHUNK)
    print(f"sgemm ceiling {ceiling['ceiling_prefill_tok_s']:.0f} tok/s ({ceiling['sgemm_gflop_s']:.0f} GFLOP/s)")
    for name, engine in engines.items():
        runner = engine.runner
        prefill_s(runner, ids[:64])  # warm-up
        best = min(prefill_s(runner, ids) for _ in range(2))
        rate = args.tokens / best
        print(f"{name:12s} {rate:6.0f} tok/s = {rate / ceiling['ceiling_prefill_tok_s']:.0%} of the ceiling")


if __name__ == "__main__":
    main()
