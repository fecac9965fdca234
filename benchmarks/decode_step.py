"""Per-step decode time of each runner on the current model (no engine, no sampling).

    python benchmarks/decode_step.py [--model PATH] [--threads N] [--steps N] [--context N]

Prints median and best ms/step (and tok/s) for HFRunner, LeanRunner fp32 and LeanRunner int8,
after prefilling `--context` tokens. A measuring aid for the lean path; `chatcli bench`
is the user-facing benchmark.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from chatcli.engine.quantize import calibration_ids
from chatcli.engine.load import LoadOptions, context_limit, load, make_runner


def step_times(runner, context: int, steps: int) -> list[float]:
    cache = runner.new_cache()
    with torch.inference_mode():
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
    ap.add_argument("--threads", type=int)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--runners", default="hf,lean,lean-int8")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load(args.model, LoadOptions(device="cpu"))
    limit = context_limit(loaded.model.config, loaded.tokenizer)
    names = args.runners.split(",")
    runners = {n: make_runner(loaded.model, limit, n.partition("-")[0], n.partition("-")[2] or None,
                               calibration_ids=calibration_ids(loaded.tokenizer)) for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):  # interleaved rounds: a shared machine's load hits every runner alike
        for name in names:
            times[name] += step_times(runners[name], args.context, args.steps // args.rounds)
    for name in names:
        med = statistics.median(times[name])
        print(f"{name:10s} threads={torch.get_num_threads()} median {med * 1e3:6.1f} ms/step "
              f"= {1 / med:5.1f} tok/s (best {min(times[name]) * 1e3:.1f} ms = {1 / min(times[name]):.1f} tok/s)")


if __name__ == "__main__":
    main()
