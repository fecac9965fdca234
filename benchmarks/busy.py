"""Decode and prefill with the CPU to ourselves, and with another process busy on one core.

    python benchmarks/busy.py [--model PATH] [--quantize auto] [--tokens 128] [--rounds 3] [--json]

A reply of `--tokens` greedy tokens (prompt lookup off) through the engine, as a user gets it, for
four ways of sizing the compiled kernel's team: `learned` (the default: runners/team.py picks the
width from the calls' times), `whole team` (every call as wide as the machine, with barriers:
chatcli before the team learned its width), `no barriers` (as wide, decode steps without barriers
on the kernel's own threads while the caller's sleeps: kernels/tolerant.h, pool.h) and `one thread`.
Each runs idle, then beside a busy process (a Python
loop spinning on one core, as a browser tab or a build would), in interleaved rounds; the table
gives each one's median decode and prefill tok/s, and the cores the process used over the reply
(its CPU seconds a second). The native runner only (the torch path is
torch's own threads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from chatcli.engine import LoadOptions, SamplingParams, load_engine

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle. " * 4


def reply_rates(engine, tokens: int) -> tuple[float, float, float]:
    """(decode tok/s, prefill tok/s, cores: this process's CPU seconds a second) of one greedy reply in a
    fresh session."""
    params = SamplingParams(temperature=0, max_tokens=tokens, lookup=0)
    cpu, wall = os.times(), time.perf_counter()
    events = list(engine.generate([{"role": "user", "content": PROMPT}], engine.new_session(), params))
    used, wall = os.times(), time.perf_counter() - wall
    stats = events[-1].stats
    return stats.decode_tok_s, stats.prefill_tok_s, (used.user + used.system - cpu.user - cpu.system) / wall


def sized(engine, how: str, most: int):
    runner = engine.runner
    if how == "learned":
        from chatcli.engine.runners.team import TeamWidth

        runner.team, runner.threads = TeamWidth(most), most
    else:  # a negative width: decode steps without barriers, the caller's thread asleep (kernels/pool.h)
        runner.team, runner.threads = None, {"whole team": most, "no barriers": -most}.get(how, 1)
    return engine


def busy_process() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--quantize", default="auto")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    engine = load_engine(args.model, LoadOptions(quantize=args.quantize))
    if getattr(engine.runner, "team", "none") == "none":
        sys.exit(f"busy.py measures the compiled kernel's team; this model runs on {type(engine.runner).__name__}")
    most = engine.runner.threads
    hows = ["learned", "whole team", "no barriers", "one thread"]
    rates: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for _ in range(args.rounds):
        for load in ("idle", "busy"):
            other = busy_process() if load == "busy" else None
            try:
                time.sleep(0.5 if other else 0)
                for how in hows:
                    sized(engine, how, most)
                    reply_rates(engine, 8)  # warm: the learned width's first tries, the team's threads
                    rates.setdefault((how, load), []).append(reply_rates(engine, args.tokens))
            finally:
                if other is not None:
                    other.kill()
                    other.wait()
    result = {
        "model": engine.name,
        "weights": engine.weights,
        "threads": most,
        "cpu": _cpu(),
        "tokens": args.tokens,
        "rounds": args.rounds,
        "runs": {
            f"{how} / {load}": {
                "decode_tok_s": round(statistics.median(d for d, _, _ in runs), 1),
                "prefill_tok_s": round(statistics.median(p for _, p, _ in runs), 1),
                "cores": round(statistics.median(c for _, _, c in runs), 2),
            }
            for (how, load), runs in rates.items()
        },
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{result['model']} ({result['weights']}), {most} threads, {result['cpu']}; median of {args.rounds}")
    print(f"{'':12s} {'decode idle':>12s} {'decode busy':>12s} {'prefill idle':>13s} {'prefill busy':>13s}", end="")
    print(f" {'cores idle':>11s} {'cores busy':>11s}")
    for how in hows:
        idle, busy = result["runs"][f"{how} / idle"], result["runs"][f"{how} / busy"]
        print(
            f"{how:12s} {idle['decode_tok_s']:12.1f} {busy['decode_tok_s']:12.1f} "
            f"{idle['prefill_tok_s']:13.1f} {busy['prefill_tok_s']:13.1f} {idle['cores']:11.2f} {busy['cores']:11.2f}"
        )


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        name = "?"
    return f"{name}, {os.cpu_count()} CPUs"


if __name__ == "__main__":
    main()
