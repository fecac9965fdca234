"""A `history --recover` cut short, finished by the next start: the steps of a recovery after its commit
point (3 to 5 of `salvage.py`, where the whole is told), and the database's lock that keeps a
recovery and a chat apart (`locks.py`).

Below the store: every `Store` calls `opened` before it opens the database, and `salvage` calls
`finish` before it begins. A fault is a `RecoveryError`, one line (the store says it as a StoreError).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from chatcli.chat.locks import database_lock, flocked
from chatcli.errors import UserError

SIDE_FILES = ("-wal", "-shm")  # SQLite's own, named after the database file


class RecoveryError(UserError):
    """A recovery that cannot go on, or the lock it needs; the message says what to do."""


@dataclass
class Salvaged:
    conversations: int
    messages: int
    lost: int  # rows that could not be read (conversations and messages)
    kept_as: Path  # where the damaged file now is
    finished: bool = False  # a recovery cut short, finished now

    def line(self, path: Path) -> str:
        rows = "1 row" if self.lost == 1 else f"{self.lost} rows"
        lost = f"; {rows} on damaged pages could not be read" if self.lost else "; nothing was lost"
        return (
            ("a recovery cut short is finished: " if self.finished else "")
            + f"recovered {self.conversations} conversations and {self.messages} messages into {path}{lost}; "
            f"the damaged file is kept as {self.kept_as}"
        )


def recovered_path(path: Path) -> Path:
    return path.with_name(path.stem + "-recovered.db")


def plan_path(path: Path, temporary: bool = False) -> Path:
    return path.with_name(path.name + ".recovering" + (".tmp" if temporary else ""))


def kept_path(path: Path) -> Path:
    """The first `.damaged`, `.damaged.2` … name free with its side files: one kept before stays."""
    for n in itertools.count(1):
        kept = path.with_name(f"{path.name}.damaged" + (f".{n}" if n > 1 else ""))
        if not any(Path(f"{kept}{suffix}").exists() for suffix in ("", *SIDE_FILES)):
            return kept
    raise AssertionError("unreachable")


def fsync(path: Path) -> None:
    """`path`'s bytes (a folder: its names) on the disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _move(source: Path, target: Path) -> None:
    """Rename `source` to `target`, which must not exist (a kept file is never overwritten)."""
    if target.exists():
        raise RecoveryError(
            f"a recovery of the conversation database cannot go on: {target} is in the way of {source}; "
            "move one of them away and run 'chatcli history --recover' again"
        )
    os.rename(source, target)


WAIT_S = 30.0  # how long a start waits for another process to finish a recovery cut short


def exclusive(path: Path, wait_s: float = 0.0) -> IO | None:
    """The database's lock held exclusive (None: others held it for `wait_s`)."""
    deadline = time.monotonic() + wait_s
    try:
        while (lock := flocked(database_lock(path), wait=False)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
    except OSError as exc:
        raise RecoveryError(f"cannot lock the conversation database {path}: {exc.strerror or exc}") from None
    return lock


def in_use(path: Path) -> RecoveryError:
    return RecoveryError(
        f"the conversation database {path} is in use by another chatcli (a chat, a one-shot): "
        "close it, then run 'chatcli history --recover' again"
    )


def opened(path: Path) -> tuple[IO, Salvaged | None]:
    """For a `Store` opening `path`: the database's lock held shared (closing the file lets go), once a
    recovery cut short is finished; and that recovery's result, if one was."""
    finished = None
    if plan_path(path).exists():
        lock = exclusive(path, WAIT_S)
        if lock is None:
            raise in_use(path)
        try:
            finished = finish(path)
        finally:
            lock.close()
    try:
        return flocked(database_lock(path), shared=True), finished
    except OSError as exc:
        raise RecoveryError(f"cannot lock the conversation database {path}: {exc.strerror or exc}") from None


def finish(path: Path) -> Salvaged | None:
    """Steps 3 to 5 of a recovery that was cut short (its plan is there), from where it stopped; None
    when there is none. The caller holds the database's exclusive lock."""
    plan_file = plan_path(path)
    try:
        plan = json.loads(plan_file.read_text(encoding="utf-8"))
        kept = path.with_name(plan["kept"])
        done = Salvaged(plan["conversations"], plan["messages"], plan["lost"], kept, finished=True)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:  # written whole or not at all: only by hand
        raise RecoveryError(f"cannot read {plan_file} ({exc}); move it away to open the database as it is") from None
    recovered = recovered_path(path)
    if recovered.exists():  # 3 and 4: the damaged file aside, the copy in
        for suffix in (*SIDE_FILES, ""):
            if Path(f"{path}{suffix}").exists():
                _move(Path(f"{path}{suffix}"), Path(f"{kept}{suffix}"))
        _move(recovered, path)
    elif not path.exists() and kept.exists():  # the copy lost (by hand): undone, the damaged file back
        for suffix in ("", *SIDE_FILES):
            if Path(f"{kept}{suffix}").exists():
                _move(Path(f"{kept}{suffix}"), Path(f"{path}{suffix}"))
        done = None
    fsync(path.parent)
    plan_file.unlink()  # 5
    fsync(path.parent)
    return done
