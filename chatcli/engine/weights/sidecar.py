"""A cached file's record beside it: `<stem>.json` with the file's size, mtime and BLAKE3, written
(atomically) once the file is in place.

Lean files (`lean_file`) and the compiled kernel's builds (`runners.kernels`) keep one. `unchanged`
is a start's quick check (same size, and the same mtime or else the same hash: hashing hundreds of
MB at each start would cost seconds); `check` always rehashes (`chatcli pull --verify`, and the
kernel's ~200 KB build at each load).

`file_digest` is chatcli's digest of its own files (these records, `gguf_convert`'s manifests, a
GGUF's `identity`): BLAKE3, hex. A record written before it (`{"sha256": …}`, no `"blake3"`) is still
read: its file is checked with SHA-256 (`file_sha256`, which `load.pull` also uses: the hub
publishes SHA-256), so a cache and kernel builds written by an older chatcli are not made again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import blake3

PIECE = 256 << 10  # bytes a read loop reads at a time
THREADS_ABOVE = 16 << 20  # bytes: a file this large is hashed on every core (BLAKE3's tree allows it)


def path_of(path: Path) -> Path:
    """Where the record of `path` lives."""
    return path.with_suffix(".json")


def file_digest(path: Path) -> str:
    """The file's BLAKE3 (hex, 64 digits): mapped and hashed in place with the GIL let go
    (`update_mmap`), on every core for a file over THREADS_ABOVE; read in PIECE buffers where it cannot
    be mapped. The file must not shrink while it is mapped (a read past its new end is SIGBUS): these
    are files chatcli wrote into its cache, or a model the user gave it."""
    threads = blake3.blake3.AUTO if os.stat(path).st_size > THREADS_ABOVE else 1
    try:
        return blake3.blake3(max_threads=threads).update_mmap(path).hexdigest()
    except OSError:
        pass  # not mappable (a pipe, a filesystem without mmap): read it; a missing file raises again below
    hasher = blake3.blake3(max_threads=threads)
    buffer = bytearray(PIECE)
    view = memoryview(buffer)
    with open(path, "rb") as f:
        while got := f.readinto(buffer):
            hasher.update(view[:got])
    return hasher.hexdigest()


def file_sha256(path: Path) -> str:
    """The file's SHA-256 (hex), read through one 256 KiB buffer (`hashlib.file_digest`): for a digest
    recorded as SHA-256 (the hub's, an older chatcli's records). Not in 4 MiB blocks: freeing a block
    that large raises glibc's mmap threshold, and the one-shot that hashed its ~200 KB kernel so held
    12 MiB more heap to its end."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def matches(path: Path, want: dict) -> bool:
    """The file's bytes hash to the digest a record holds: its `"blake3"`, else (an older chatcli's
    record) its `"sha256"` (KeyError where it holds neither, TypeError where it is not text)."""
    if "blake3" in want:
        return file_digest(path) == _text(want["blake3"])
    return file_sha256(path) == _text(want["sha256"])


def hash_name(want: dict) -> str:
    """The hash a record holds, as a message names it: "BLAKE3", or "SHA-256" (an older chatcli's)."""
    return "BLAKE3" if "blake3" in want else "SHA-256"


def _text(digest) -> str:
    if not isinstance(digest, str):
        raise TypeError(f"a digest recorded as {type(digest).__name__}")
    return digest


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
        if not isinstance(want.get("blake3", want.get("sha256")), str):
            raise KeyError("blake3")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
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
