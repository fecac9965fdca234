"""One decode step's time by KV cache dtype, two dtypes alternating step by step (issue 49).

    python benchmarks/kv_step.py [--model M] [--kv-dtypes bfloat16,float16] [--depths 0,4096] [--steps 300]

On a shared machine `chatcli bench --depth` runs minutes apart and cannot tell 3 % apart; here each
dtype's runner holds a cache filled to the depth (random ids, in 512-token chunks), then the two take
turns, one decode step each (the cache cropped back after it), `--steps` times. Printed per depth: each
dtype's median step and the median of the paired ratios (second / first), which the machine's drift
moves least.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from chatcli.engine import LoadOptions, load_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a .gguf, folder or name (default: the embedded model)")
    ap.add_argument("--kv-dtypes", default="bfloat16,float16", help="two dtypes")
    ap.add_argument("--depths", default="0,4096")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    kinds = args.kv_dtypes.split(",")
    if len(kinds) != 2:
        raise SystemExit("--kv-dtypes takes two dtypes, e.g. bfloat16,float16")
    runners = {kv: load_engine(args.model, LoadOptions(kv_dtype=kv)).runner for kv in kinds}
    rng = np.random.default_rng(0)
    for depth in (int(d) for d in args.depths.split(",")):
        ids = [int(t) for t in rng.integers(100, 40_000, depth + 1)]
        caches = {}
        for kv, runner in runners.items():
            cache = runner.new_cache()
            for start in range(0, depth, 512):
                runner.forward(ids[start : start + 512], cache)
            caches[kv] = cache
        times: dict[str, list[float]] = {kv: [] for kv in kinds}
        for step in range(args.steps):
            for kv in kinds if step % 2 else kinds[::-1]:
                start = time.perf_counter()
                runners[kv].forward([ids[-1] + step % 7], caches[kv])
                times[kv].append(time.perf_counter() - start)
                caches[kv].crop(depth)
        first, second = (np.array(times[kv]) * 1e3 for kv in kinds)
        print(
            f"depth {depth}: {kinds[0]} {np.median(first):.3f} ms, {kinds[1]} {np.median(second):.3f} ms, "
            f"paired {kinds[1]} / {kinds[0]} median {np.median(second / first):.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
