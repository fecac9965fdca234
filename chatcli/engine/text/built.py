"""tokenizer.json files this process has just built and written (a GGUF's first start: `weights.gguf_meta`), kept as
objects by the file's (inode, size, mtime), so that the start that follows reads no JSON back (~0.7 s for a
150K-token vocabulary): `FolderTokenizer` takes one once."""

from __future__ import annotations

from pathlib import Path

_BUILT: dict[tuple[int, int, int], object] = {}


def _identity(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def keep_built(path: Path, tokenizer) -> None:
    """`tokenizer`, just saved at `path`, for the next reader of that file."""
    _BUILT[_identity(path)] = tokenizer


def take_built(path: Path):
    """The tokenizer `keep_built` kept for `path` as it is now (once), else None."""
    return _BUILT.pop(_identity(path), None)
