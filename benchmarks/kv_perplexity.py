"""Perplexity at depth by KV cache dtype (issue 49: a q8_0 cache within 0.5 % of bf16's at 4K and 16K).

    python benchmarks/kv_perplexity.py --text FILE [--model M] [--tokens 4096] [--window 512]
        [--kv-dtypes bfloat16,q8_0,float32]

The text's first `--tokens` tokens (one long text: a licence, a book) are fed one at a time through the
decode path, as a chat's tokens are, each dtype's KV cache growing to that depth. Printed per dtype: the
perplexity over every position, and over the last `--window` positions only, where the cache holds the most
(the figure a long chat lives with). `--tokens` at most the model's context (SmolLM2's is 8,192).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

from chatcli.engine import LoadOptions, load_engine


def nll_by_position(engine, ids: list[int]) -> np.ndarray:
    """-log p(ids[i + 1] | ids[: i + 1]) for each i, the decode path (one token a step)."""
    runner, cache = engine.runner, engine.runner.new_cache()
    out = np.empty(len(ids) - 1)
    for i in range(len(ids) - 1):
        logits = runner.forward([ids[i]], cache).astype(np.float64)  # [V]
        top = logits.max()
        out[i] = -(logits[ids[i + 1]] - top - np.log(np.exp(logits - top).sum()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", required=True, help="a long plain text file")
    ap.add_argument("--model", default=None, help="a .gguf, folder or name (default: the embedded model)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--kv-dtypes", default="bfloat16,q8_0")
    args = ap.parse_args()
    text = Path(args.text).read_text(encoding="utf-8", errors="replace")
    print(f"| KV cache | tokens | perplexity, all | last {args.window} | seconds |")
    print("|---|---|---|---|---|")
    for kv in args.kv_dtypes.split(","):
        engine = load_engine(args.model, LoadOptions(kv_dtype=kv))
        ids = engine.tokenizer.encode(text)
        if len(ids) < args.tokens:
            raise SystemExit(f"the text is {len(ids)} tokens; --tokens {args.tokens} wants a longer one")
        start = time.perf_counter()
        nll = nll_by_position(engine, ids[: args.tokens])
        seconds = time.perf_counter() - start
        print(
            f"| {kv} | {args.tokens:,} | {math.exp(nll.mean()):.3f} | {math.exp(nll[-args.window :].mean()):.3f} "
            f"| {seconds:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
