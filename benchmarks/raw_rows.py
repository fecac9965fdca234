"""A GGUF's Q4_K / Q6_K rows read as the file holds them (the kernel's WEIGHT_RAW_*, kernels/project_raw.h) beside
the same rows repacked (what the lean file holds), one projection through `chatcli_project`, alternated.

    python benchmarks/raw_rows.py [--type Q4_K|Q6_K|MXFP4] [--rows 1] [--experts 64] [--threads 2]

The matrix is `--experts` copies of one expert's gate and up, random blocks (tests.kquants): Qwen3-30B-A3B's
(1,536 x 2,048) for Q4_K and Q6_K, gpt-oss-20b's (5,760 x 2,880) for MXFP4. 64 of them (108 MiB of Q4_K) are read
from memory, not a cache, as a decode step's experts are. Each line is the best of 7 calls of each, with the rows'
bytes over the time.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chatcli.engine.runners import kernels  # noqa: E402
from chatcli.engine.runners.kernels.structs import WEIGHT_RAW_MXFP4, WEIGHT_RAW_Q4K, WEIGHT_RAW_Q6K, Matrix  # noqa: E402
from chatcli.engine.runners.native import block_matrix  # noqa: E402
from chatcli.engine.weights import kquant_blocks as kb  # noqa: E402
from tests.kquants import random_blocks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--type", default="Q4_K", choices=["Q4_K", "Q6_K", "MXFP4"])
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    lib = kernels.library()
    if lib is None:
        sys.exit(f"no kernel: {kernels.why_not()}")
    rng = np.random.default_rng(0)
    k, rows = (2880, 5760) if args.type == "MXFP4" else (2048, 1536)
    raw = np.tile(random_blocks(rows, k, args.type, rng), (args.experts, 1))
    n = len(raw)
    _kind, arrays = kb.tensor_parts(args.type, raw, packer=lib)
    packed = block_matrix(_kind, n, k, k, lambda key: arrays[key].ctypes.data if key in arrays else None)
    kind = {"Q4_K": WEIGHT_RAW_Q4K, "Q6_K": WEIGHT_RAW_Q6K, "MXFP4": WEIGHT_RAW_MXFP4}[args.type]
    direct = Matrix(kind, n, k, k, raw.ctypes.data)
    x = rng.standard_normal((args.rows, k)).astype(np.float32)
    y = np.zeros((args.rows, n), np.float32)

    def best(m: Matrix) -> float:
        times = []
        for _ in range(7):
            start = time.perf_counter()
            lib.chatcli_project(ctypes.byref(m), x.ctypes.data, args.rows, y.ctypes.data, args.threads)
            times.append(time.perf_counter() - start)
        return min(times)

    print(f"{args.type}, {n} x {k}, {raw.nbytes / 2**20:.0f} MiB, {args.rows} row(s), {args.threads} threads")
    for _ in range(3):
        a, b = best(packed), best(direct)
        print(
            f"repacked {a * 1e3:6.2f} ms ({raw.nbytes / a / 1e9:5.1f} GB/s)   "
            f"as the file holds them {b * 1e3:6.2f} ms ({raw.nbytes / b / 1e9:5.1f} GB/s)   {b / a:.2f}x the time"
        )


if __name__ == "__main__":
    main()
