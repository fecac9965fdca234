"""Two builds of the compiled kernel on one file, their decode steps alternated in one process (a paired A/B).

    python benchmarks/kernel_ab.py FILE.gguf --before CHECKOUT [--depth 16,4096,10800] [--threads 2] [--rounds 12]
    python benchmarks/kernel_ab.py FILE.gguf --before CHECKOUT --depth 10288 --prefill 512

This machine's speed drifts by a third between minutes, so two processes run one after the other compare
badly. Here both builds (this checkout's, and the one `CHECKOUT`'s sources give, built by that checkout in its
own directory) run over the same mapped weights, each with its own KV cache filled to the depth with the same
random ids; then blocks of 16 decode steps (or, with `--prefill N`, one N-token prefill cropped back after)
alternate between the two, in turns (ABBA), and each build's block medians and the ratio of each pair are
printed: `speedup` > 1 means this checkout's build is the faster. The kernel's team is `--threads` wide, with
barriers (2) or without (-2: kernels/tolerant.h), fixed for both (the team-width learner is not used).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time

import numpy as np

BLOCK = 16  # decode steps a turn


class OlderBuild(ctypes.CDLL):
    """Another checkout's build: a function it does not export (a test hook added since) reads as 0."""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            stub = lambda *_args: 0  # noqa: E731 - ctypes declarations are set as its attributes
            setattr(self, name, stub)
            return stub


def build_of(checkout: str) -> str:
    """The path of `checkout`'s kernel build for this CPU (built there first if need be)."""
    code = "from chatcli.engine.runners import kernels; lib = kernels.library(); print(lib._name if lib else '')"
    out = subprocess.run([sys.executable, "-c", code], cwd=checkout, capture_output=True, text=True, check=True)
    path = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if not path:
        raise SystemExit(f"{checkout}: its kernel did not build: {out.stderr.strip()[-500:]}")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--before", required=True, metavar="CHECKOUT", help="the other checkout (its kernel sources)")
    ap.add_argument("--depth", default="16,4096", help="positions in the cache before the steps, comma-separated")
    ap.add_argument("--threads", type=int, default=2, help="the team's width (negative: without barriers)")
    ap.add_argument("--rounds", type=int, default=12, help="turns of each build per depth")
    ap.add_argument("--prefill", type=int, default=0, metavar="N", help="time an N-token prefill, not decode steps")
    args = ap.parse_args()

    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from chatcli.engine.runners import kernels, native

    before = OlderBuild(build_of(os.path.abspath(args.before)))
    kernels._declare(before)
    engine = load_engine(args.model, LoadOptions(), status=lambda *_a, **_k: None)
    weights, kv_dtype = engine.runner.weights, engine.runner.kv_dtype
    builds = {"before": before, "this": kernels.library()}
    depths = [int(d) for d in args.depth.split(",")]
    rng = np.random.default_rng(1)
    ids = [int(i) for i in rng.integers(10, min(30000, engine.runner.config.vocab), size=max(depths) + args.prefill)]
    print(f"{os.path.basename(args.model)} · {kv_dtype} KV cache · {args.threads} threads · before: {args.before}")
    for depth in depths:
        runs = {}
        for name, lib in builds.items():
            native.kernels.library = lambda lib=lib: lib  # the runner binds the build it is made with
            runner = native.NativeRunner(weights, kv_dtype=kv_dtype, threads=args.threads)
            cache = runner.new_cache()
            for i in range(0, depth, 512):
                runner.forward(ids[i : min(depth, i + 512)], cache)
            runs[name] = (runner, cache)
        times: dict[str, list[float]] = {name: [] for name in builds}
        for turn in range(2 * args.rounds):
            name = ("before", "this", "this", "before")[turn % 4]
            runner, cache = runs[name]
            if args.prefill:
                start = time.perf_counter()
                runner.forward(ids[depth : depth + args.prefill], cache)
                times[name].append(time.perf_counter() - start)
                cache.crop(depth)
                continue
            block = []
            for _ in range(BLOCK):
                start = time.perf_counter()
                runner.forward([123], cache)
                block.append(time.perf_counter() - start)
            times[name].append(statistics.median(block))
            cache.crop(depth)
        ratios = [b / t for b, t in zip(times["before"], times["this"], strict=True)]
        what = f"a {args.prefill}-token prefill" if args.prefill else "a decode step"
        print(
            f"depth {depth:6}: {what} {statistics.median(times['before']) * 1e3:7.2f} ms before, "
            f"{statistics.median(times['this']) * 1e3:7.2f} ms this: speedup {statistics.median(ratios):.3f} "
            f"(pairs {min(ratios):.3f}-{max(ratios):.3f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
