"""How long chatcli's digest of a file takes (`sidecar.file_digest`: BLAKE3), beside the ways it could
have been computed, on files from the page cache.

    python benchmarks/file_digest.py FILE [FILE ...] [--repeat 3]

Each way runs in a child process of its own (its peak RSS is its own: a mapped file's pages count
there), each file read once first; the best of `--repeat` runs is printed, with the child's peak RSS:

- `file_digest`: what chatcli runs (over THREADS_ABOVE: two AHEAD_PIECE buffers, the next one read
  while this one is hashed on every core);
- `update_mmap`: the `blake3` package mapping the file and hashing it on every core;
- `sha256`: `sidecar.file_sha256` (OpenSSL's SHA-256, what chatcli hashed with before BLAKE3).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, resource, sys, time
from pathlib import Path
import blake3
from chatcli.engine.weights import sidecar
how, path = sys.argv[1], Path(sys.argv[2])
ways = {
    "file_digest": sidecar.file_digest,
    "update_mmap": lambda p: blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(p).hexdigest(),
    "sha256": sidecar.file_sha256,
}
started = time.perf_counter()
digest = ways[how](path)
took = time.perf_counter() - started
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"s": took, "rss": rss, "digest": digest}))
"""


def run(how: str, path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, how, str(path)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for path in args.files:
        size = path.stat().st_size
        run("file_digest", path)  # into the page cache
        digests = {}
        for how in ("file_digest", "update_mmap", "sha256"):
            runs = [run(how, path) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["s"])
            digests[how] = best["digest"]
            print(
                f"{path.name} ({size / 1e6:,.0f} MB) {how}: {best['s']:.2f} s ({size / best['s'] / 1e9:.1f} GB/s), "
                f"peak RSS {max(r['rss'] for r in runs) / 2**20:,.0f} MiB"
            )
        if digests["file_digest"] != digests["update_mmap"]:
            sys.exit(f"{path}: file_digest and update_mmap differ")


if __name__ == "__main__":
    main()
