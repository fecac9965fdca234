"""Decode tok/s without and with prompt lookup, sampled, over several seeds.

    python benchmarks/lookup.py [--model PATH] [--temperature 0.8] [--seeds 4] [--lookup 4] [--max-tokens 128]

`chatcli bench` measures lookup greedy; this measures it with sampling, where drafts are
kept less often (a kept draft must be the id the sampler draws). Prints, per prompt, the
median decode rate over the seeds and the drafts kept. A measuring aid, not a test.
"""

from __future__ import annotations

import argparse
import statistics

from chatcli.bench.measure import warm_up
from chatcli.bench.prompts import DECODE_PROMPT, EDIT_PROMPT
from chatcli.engine.engine import Finished
from chatcli.engine.load.build import load_engine
from chatcli.engine.load.options import LoadOptions
from chatcli.engine.sample.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--lookup", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    engine = load_engine(args.model, LoadOptions(device="cpu"))
    warm_up(engine)
    for name, prompt in (("story", DECODE_PROMPT), ("code edit", EDIT_PROMPT)):
        for lookup in (0, args.lookup):
            rates, drafted, kept = [], 0, 0
            for seed in range(args.seeds):
                params = SamplingParams(
                    temperature=args.temperature, seed=seed, max_tokens=args.max_tokens, lookup=lookup
                )
                events = engine.generate([{"role": "user", "content": prompt}], engine.new_session(), params)
                stats = next(e for e in events if isinstance(e, Finished)).stats
                rates.append(stats.decode_tok_s)
                drafted += stats.draft_tokens
                kept += stats.accepted_tokens
            print(
                f"{name:9s} temperature {args.temperature:g} lookup {lookup:2d}: "
                f"median {statistics.median(rates):5.1f} tok/s, drafts kept {kept} of {drafted}"
            )


if __name__ == "__main__":
    main()
