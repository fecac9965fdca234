"""A cached file's record beside it: `<stem>.json` with the file's size, mtime and SHA-256, written
(atomically) once the file is in place.

Lean files (`lean_file`) and the compiled kernel's builds (`runners.kernels`) keep one. `unchanged`
is a start's quick check (same size, and the same mtime or else the same hash: hashing hundreds of
MB at each start would cost seconds); `check` always rehashes (`chatcli pull --verify`, and the
kernel's ~200 KB build at each load).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def path_of(path: Path) -> Path:
    """Where the record of `path` lives."""
    return path.with_suffix(".json")


def file_sha256(path: Path) -> str:
    """The file's SHA-256 (hex), read through one 256 KiB buffer (`hashlib.file_digest`). Not in
    4 MiB blocks: freeing a block that large raises glibc's mmap threshold, and the one-shot that
    hashed its ~200 KB kernel so held 12 MiB more heap to its end."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def record(path: Path, sha256: str | None = None) -> None:
    """Write the record of a finished file: its size, mtime and hash (atomically); `sha256`: the hash
    its writer computed as it wrote it (`prefix_hash`), else the file is read and hashed here."""
    from chatcli.paths import temp_file

    st = path.stat()
    side = path_of(path)
    digest = sha256 or file_sha256(path)
    fd, tmp = temp_file(side)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}))
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
        return st.st_mtime_ns == want["mtime_ns"] or file_sha256(path) == want["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def check(path: Path) -> str:
    """Rehash the file whatever its mtime: "" where it is the one its record names, else what is
    wrong in a few words."""
    try:
        want = json.loads(path_of(path).read_text())
        size, digest = int(want["size"]), str(want["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return "no readable record of its hash (its sidecar is missing or damaged)"
    try:
        got = path.stat().st_size
        if got != size:
            return f"{got:,} bytes where {size:,} were written"
        if file_sha256(path) != digest:
            return "its SHA-256 differs from the one recorded when it was written"
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    return ""


def remove(path: Path) -> None:
    """Remove a file and its record."""
    path.unlink(missing_ok=True)
    path_of(path).unlink(missing_ok=True)
