"""A file's identity: the BLAKE3 (hex, 64 digits) of all its bytes, computed once and remembered against
its (device, inode, size, mtime, ctime), so that a later start hashes nothing.

A GGUF's cache entries (`gguf_convert`: its metadata folder, its dequantized model, and through
them its lean files) are named by it, not by the file's name and header: two files with the same
name, shapes and types but other weights never share an entry, and a file replaced or rewritten in
place is hashed again and gets an entry of its own. The ctime is what tells a new file: the filesystem
gives a removed file's inode to the next one it makes, and a copy (`cp -p`, rsync, a test's `os.utime`)
can carry the old one's size and mtime; no one can set a ctime, which every change of the inode moves
(a move or a `chmod` too: such a file is hashed once more).

The index is `<cache dir>/identities.json`, `{"dev:inode:size:mtime_ns:ctime_ns": {"blake3", "path"}}`,
rewritten atomically; each write drops the records whose file no longer has that stat. A hash is
not remembered where the file's mtime is within RACY_S of the hash's start (the file may still be
being written, and a write within the filesystem's timestamp granularity keeps its mtime: git's
"racy" rule), nor where the file changed while it was read; this process remembers it all the
same.

A record holding only `"sha256"` (an older chatcli's identity, which named its folders) is not read:
the file is hashed again and gets its new identity, so its first start under this version converts it
again, and `gguf_convert.sweep` then removes the folders named by the old one (their source is now
known to have another identity; the lean files made from them go with them, `lean_file.sweep`).

A split model (`gguf_parts`: named by its first part) is identified by all its parts: the BLAKE3
of "split" and each part's own identity in turn, each part hashed and remembered as a file of its
own, so that a part replaced or rewritten in place gives the model a new identity.

The cost, once per file: BLAKE3 (`sidecar.file_digest`: on every core where the file is over 16 MiB,
the next piece read meanwhile) — from the page cache, the embedded 98 MB model 0.03 s and a 9.9 GB
Qwen3-MoE Q4_K_M (128 experts, 25 layers) 2.40 s (4.1 GB/s), where SHA-256 took 0.07 s and 6.84 s
(1.4 GB/s: OpenSSL with SHA instructions); the best of 3 runs of `python benchmarks/file_digest.py
FILE`, 2 cores of an AMD EPYC, load average ~2.5, 2026-12-07 (README: "What names a GGUF's cache
entries"). A first start reads the whole file anyway to repack its blocks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import blake3

from chatcli.engine.weights.gguf_parts import SplitError, parts_of
from chatcli.engine.weights.sidecar import file_digest

INDEX = "identities.json"
RACY_S = 2.0
SAY_ABOVE = 64 << 20  # bytes: a file this large says that it is being hashed (a fraction of a second or more)

_seen: dict[str, str] = {}  # this process's hashes, by stat key (also those too fresh to write down)


def index_path() -> Path:
    from chatcli.paths import cache_dir

    return cache_dir() / INDEX


def stat_key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def known(path: Path) -> str | None:
    """The identity remembered for the file as it is now (its stat), or None: nothing is hashed (a split
    model's: where every part's is remembered)."""
    try:
        parts = parts_of(path)
    except SplitError:
        return None
    if len(parts) > 1:
        digests = [_known_one(part) for part in parts]
        return None if None in digests else _joined(digests)
    return _known_one(path)


def _known_one(path: Path) -> str | None:
    try:
        key = stat_key(path.stat())
    except OSError:
        return None
    if key in _seen:
        return _seen[key]
    record = _read().get(key)
    digest = record.get("blake3") if isinstance(record, dict) else None  # an older record's "sha256": not used
    return digest if isinstance(digest, str) else None


def identity(path: Path, status: Callable[[str], None] | None = None) -> str:
    """The BLAKE3 (hex) of the file's bytes (`sidecar.file_digest`): remembered, or computed now and
    remembered; a split model's first part: its parts' together (SplitError where a part is missing or
    `path` is a later one)."""
    parts = parts_of(path)
    if len(parts) > 1:
        return _joined([_identity_one(part, status) for part in parts])
    return _identity_one(path, status)


def _joined(digests: list[str]) -> str:
    """A split model's identity: the BLAKE3 of its parts' identities, in order."""
    return blake3.blake3(("split:" + ",".join(digests)).encode()).hexdigest()


def _identity_one(path: Path, status: Callable[[str], None] | None) -> str:
    digest = _known_one(path)
    if digest is not None:
        return digest
    before = path.stat()
    started = time.time()
    if status is not None and before.st_size > SAY_ABOVE:
        status(f"Identifying {path.name} by its contents ({before.st_size / 2**20:,.0f} MiB, first start only)")
    digest = file_digest(path)
    after = path.stat()
    key = stat_key(after)
    if stat_key(before) == key:
        _seen[key] = digest
        if started - after.st_mtime > RACY_S:
            _remember(path, key, digest)
    return digest


def _read() -> dict:
    try:
        found = json.loads(index_path().read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _remember(path: Path, key: str, digest: str) -> None:
    """Add the record, drop those whose file changed or is gone (and an older chatcli's, which hold no
    "blake3"), and write the index atomically (a write lost to another process's at the same moment
    costs a hash at a later start, nothing more)."""
    from chatcli.paths import temp_file

    records = {key: {"blake3": digest, "path": str(path.resolve())}}
    for other, record in _read().items():
        try:
            if other != key and "blake3" in record and stat_key(Path(record["path"]).stat()) == other:
                records[other] = record
        except (OSError, KeyError, TypeError):
            continue  # its file is gone or changed: its identity is no longer known
    target = index_path()
    try:
        fd, tmp = temp_file(target)
    except OSError:
        return  # an unwritable cache: hashed again next time
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(records, f)
        os.replace(tmp, target)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
