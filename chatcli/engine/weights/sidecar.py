"""A cached file's record beside it: `<stem>.json` with the file's size, mtime and BLAKE3, written
(atomically) once the file is in place.

Lean files (`lean_file`) and the compiled kernel's builds (`runners.kernels`) keep one. `unchanged`
is a start's quick check (same size, and the same mtime or else the same hash: hashing hundreds of
MB at each start would cost seconds); `check` always rehashes (`chatcli pull --verify`, and the
kernel's ~840 KB build at each load).

`file_digest` is chatcli's digest of its own files (these records, `gguf_convert`'s manifests, a
GGUF's `identity`): BLAKE3, hex. A record written before it (`{"sha256": …}`, no `"blake3"`) is still
read: its file is checked with SHA-256 (`file_sha256`, which `load.pull` also uses: the hub
publishes SHA-256), so a cache and kernel builds written by an older chatcli are not made again.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3

PIECE = 256 << 10  # bytes a small file is read in at a time
AHEAD_PIECE = 4 << 20  # bytes a large file is read in at a time, two buffers of it
THREADS_ABOVE = 16 << 20  # bytes: a file this large is hashed on every core (BLAKE3's tree allows it)


def path_of(path: Path) -> Path:
    """Where the record of `path` lives."""
    return path.with_suffix(".json")


def file_digest(path: Path) -> str:
    """The file's BLAKE3 (hex, 64 digits): read in PIECE buffers on this thread; a file over THREADS_ABOVE
    in two AHEAD_PIECE ones, the next read (`pread`) on a thread of its own while this one is hashed on
    every core (the `blake3` package lets go of the GIL for both).

    Not `update_mmap`: mapping the file is no faster (the 9.9 GB GGUF of `identity`'s figures from the
    page cache: 2.79 s mapped, 2.40 s so; `python benchmarks/file_digest.py FILE`, AMD EPYC, 2 cores,
    load average ~2.5, 2026-12-07), makes the file's pages this process's resident set for the while (a
    first start of that GGUF peaked at 9.3 GiB of RSS, 2.5 GiB reading it), and a file that shrinks
    meanwhile would kill the process (SIGBUS) where a read ends short (`identity` then sees a new stat
    and remembers nothing)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size > THREADS_ABOVE:
            return _digest_reading_ahead(f.fileno())
        hasher = blake3.blake3()
        buffer = bytearray(PIECE)
        view = memoryview(buffer)
        while got := f.readinto(buffer):
            hasher.update(view[:got])
        return hasher.hexdigest()


def _digest_reading_ahead(fd: int) -> str:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    buffers = [mmap.mmap(-1, AHEAD_PIECE) for _ in range(2)]  # not malloc's: glibc's threshold stays put
    with ThreadPoolExecutor(1, thread_name_prefix="chatcli-digest-read") as reader:
        at, turn = 0, 0
        pending = reader.submit(os.preadv, fd, [buffers[turn]], at)
        while (got := pending.result()) > 0:
            at += got
            pending = reader.submit(os.preadv, fd, [buffers[1 - turn]], at)
            with memoryview(buffers[turn]) as view:
                hasher.update(view[:got])
            turn = 1 - turn
    return hasher.hexdigest()


def file_sha256(path: Path) -> str:
    """The file's SHA-256 (hex), read through one 256 KiB buffer (`hashlib.file_digest`): for a digest
    recorded as SHA-256 (the hub's, an older chatcli's records). Not in 4 MiB blocks: freeing a block
    that large raises glibc's mmap threshold, and the one-shot that hashed its ~200 KB kernel so held
    12 MiB more heap to its end."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def recorded(want) -> tuple[str, str]:
    """The hash a record holds (its key in HASHES) and its digest: its `"blake3"`, else (an older chatcli's
    record) its `"sha256"`; KeyError where it holds neither, TypeError where it is not text or the record is
    no mapping."""
    key = "blake3" if "blake3" in want else "sha256"
    digest = want[key]
    if not isinstance(digest, str):
        raise TypeError(f"a digest recorded as {type(digest).__name__}")
    return key, digest


def matches(path: Path, want: dict) -> bool:
    """The file's bytes hash to the digest a record holds, with that record's hash (`recorded`)."""
    key, digest = recorded(want)
    return HASHES[key][1](path) == digest


def hash_name(want: dict) -> str:
    """The hash a record holds, as a message names it: "BLAKE3", or "SHA-256" (an older chatcli's)."""
    return HASHES[recorded(want)[0]][0]


HASHES = {"blake3": ("BLAKE3", file_digest), "sha256": ("SHA-256", file_sha256)}  # a record's key: name, function


def record(path: Path, digest: str | None = None) -> None:
    """Write the record of a finished file: its size, mtime and BLAKE3 (atomically); `digest`: the one
    its writer computed as it wrote it (`prefix_hash`), else the file is read and hashed here."""
    from chatcli.paths import temp_file

    st = path.stat()
    side = path_of(path)
    digest = digest or file_digest(path)
    fd, tmp = temp_file(side)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "blake3": digest}))
        os.replace(tmp, side)
    finally:
        Path(tmp).unlink(missing_ok=True)


def unchanged(path: Path) -> bool:
    """The file is the one its record names: same size, and same mtime or same hash."""
    try:
        want = json.loads(path_of(path).read_text())
        st = path.stat()
        if st.st_size != want["size"]:
            return False
        return st.st_mtime_ns == want["mtime_ns"] or matches(path, want)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def check(path: Path) -> str:
    """Rehash the file whatever its mtime: "" where it is the one its record names, else what is
    wrong in a few words."""
    try:
        want = json.loads(path_of(path).read_text())
        size = int(want["size"])
        recorded(want)
    except (OSError, ValueError, KeyError, TypeError):
        return "no readable record of its hash (its sidecar is missing or damaged)"
    try:
        got = path.stat().st_size
        if got != size:
            return f"{got:,} bytes where {size:,} were written"
        if not matches(path, want):
            return f"its {hash_name(want)} differs from the one recorded when it was written"
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    return ""


def remove(path: Path) -> None:
    """Remove a file and its record."""
    path.unlink(missing_ok=True)
    path_of(path).unlink(missing_ok=True)
