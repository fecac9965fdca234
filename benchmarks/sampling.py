"""The sampler's cost a token, by vocabulary size (issue 49: a 262K vocabulary must cost no more than a small one's).

    python benchmarks/sampling.py [--tokens 500] [--vocab 49152,128256,151936,262144]

For each vocabulary (SmolLM2's 49K, Llama 3's 128K, Qwen's 152K, Gemma 3's 262K) and each of greedy and the
default sampling (`SamplingParams()`: temperature, top-k 40, top-p), the median time of `sample` over
`--tokens` random logit rows, with 64 recent ids: the Python a decode step spends after the kernel's logits.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from chatcli.engine.params import SamplingParams
from chatcli.engine.sample.sampling import new_generator, sample


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--vocab", default="49152,128256,151936,262144")
    args = ap.parse_args()
    rng, generator = np.random.default_rng(0), new_generator(0)
    print("| vocabulary | greedy ms | default sampling ms |")
    print("|---|---|---|")
    for vocab in (int(v) for v in args.vocab.split(",")):
        rows = (3 * rng.standard_normal((8, vocab))).astype(np.float32)
        cells = []
        for params in (SamplingParams(temperature=0), SamplingParams()):
            times = []
            for i in range(args.tokens):
                start = time.perf_counter()
                sample(rows[i % 8], params, generator, recent_ids=list(range(64)))
                times.append(time.perf_counter() - start)
            cells.append(f"{statistics.median(times) * 1e3:.3f}")
        print(f"| {vocab:,} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
