"""Per-step decode time of each runner on the current model (no engine, no sampling).

    python benchmarks/decode_step.py [--model PATH] [--runners native,lean,...] [--steps N] [--context N]

Prints median and best ms/step (and tok/s) for each of `--runners` (see benchmarks/runners.py),
after prefilling `--context` tokens. A measuring aid for the lean path; `chatcli bench`
is the user-facing benchmark.
"""

from __future__ import annotations

import argparse
import statistics
import time

from runners import engine_named


def step_times(runner, context: int, steps: int) -> list[float]:
    cache = runner.new_cache()
    runner.forward(list(range(10, 10 + context)), cache)
    times = []
    token = 42
    for _ in range(steps):
        t0 = time.perf_counter()
        token = int(runner.forward([token], cache).argmax())
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--runners", default="native,native-int8,lean,lean-int8,hf")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    names = args.runners.split(",")
    runners = {n: engine_named(n, args.model).runner for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):  # interleaved rounds: a shared machine's load hits every runner alike
        for name in names:
            times[name] += step_times(runners[name], args.context, args.steps // args.rounds)
    for name in names:
        med = statistics.median(times[name])
        print(
            f"{name:12s} median {med * 1e3:6.1f} ms/step "
            f"= {1 / med:5.1f} tok/s (best {min(times[name]) * 1e3:.1f} ms = {1 / min(times[name]):.1f} tok/s)"
        )


if __name__ == "__main__":
    main()
