"""What a damaged conversation database still holds, copied into a new one (`chatcli history --recover`).

A damaged page costs the rows on it and nothing else: every conversation and every message is read
alone, by its rowid, so one that cannot be read is skipped and counted. A message whose
conversation's row was lost keeps its conversation (a row is made again, untitled). The copy is
written to `chatcli-recovered.db` beside the database and then put in its place; the damaged file
(with its WAL) is kept beside it as `chatcli.db.damaged`, or `chatcli.db.damaged.2`, `.3` … when an
earlier recovery kept one: a kept file is never overwritten. Python's sqlite3 alone, so it works where
the `sqlite3` shell's `.recover` is missing or fails.

Crash-safe at every step: a kill (or a power cut) anywhere leaves a state the next start, or the next
`--recover`, finishes or undoes, and no conversation is lost. The steps, and what each one leaves:

1. the copy: `chatcli-recovered.db` written, switched out of WAL (one file), fsynced. Killed here:
   the database is untouched; the next `--recover` deletes the partial copy and starts again.
2. the plan: `chatcli.db.recovering` (JSON: the kept file's name, the counts), written to a temporary
   name, fsynced, renamed into place, the folder fsynced. This is the commit point: from here on a
   recovery is finished, not started again. Killed before the rename: as 1.
3. the damaged file aside: `chatcli.db-wal`, `-shm`, then `chatcli.db` renamed to the kept name
   (`.damaged…-wal`, `-shm`, `.damaged…`).
4. the copy in: `chatcli-recovered.db` renamed to `chatcli.db`, the folder fsynced.
5. the plan deleted.

`finish` (`recovery.py`, below the store) is steps 3 to 5 from wherever they stopped, each of them
skipped once done (a file already moved is not there to move): with the plan there and the copy not
yet in, it moves what is left of the damaged file aside and the copy in; with the copy in, it
deletes the plan; with the copy gone and no database (deleted by hand), it undoes: the kept file goes
back. Every `Store` runs it on opening (a start, which says so: `Store.recovered`), and `salvage`
before it begins, under the database's exclusive lock (`locks.py`); an open `Store` holds that lock
shared, so a recovery never moves the file from under a running chat: it says who holds it instead.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from chatcli.chat.locks import database_lock
from chatcli.chat.recovery import (
    SIDE_FILES,
    RecoveryError,
    Salvaged,
    exclusive,
    finish,
    fsync,
    in_use,
    kept_path,
    plan_path,
    recovered_path,
)
from chatcli.chat.store import Store, StoreError

# the columns copied, where the damaged file has them (an older schema lacks the later ones)
CONVERSATION_COLUMNS = ("id", "title", "model", "system", "created", "updated", "parent_id", "fork_at", "imported_from")
MESSAGE_COLUMNS = ("id", "conversation_id", "role", "content", "finish_reason", "stats", "sampling", "created", "tools")


def _last_rowid(db: sqlite3.Connection, table: str) -> int:
    """The highest rowid of `table`, from its b-tree's rightmost path or, if that is damaged,
    the AUTOINCREMENT counter."""
    for sql in (f"SELECT max(rowid) FROM {table}", "SELECT seq FROM sqlite_sequence WHERE name=?"):
        try:
            row = db.execute(sql, (table,) if "?" in sql else ()).fetchone()
        except sqlite3.DatabaseError:
            continue
        if row and row[0] is not None:
            return int(row[0])
    return 0


def _columns(db: sqlite3.Connection, table: str, wanted: tuple[str, ...]) -> tuple[str, ...]:
    """Those of `wanted` that `table` has."""
    have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    return tuple(c for c in wanted if c in have)


def _rows(db: sqlite3.Connection, table: str, columns: tuple[str, ...]) -> tuple[list[tuple], int]:
    """Every readable row of `table`, one rowid at a time, and how many could not be read."""
    found, lost = [], 0
    for rowid in range(1, _last_rowid(db, table) + 1):
        try:
            row = db.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE rowid=?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            lost += 1
            continue
        if row is not None:
            found.append(row)
    return found, lost


def salvage(path: Path) -> Salvaged:
    """Copy what `path` still holds into a new database and put it in `path`'s place (the steps above)."""
    try:
        lock = exclusive(path)
        if lock is None:
            raise in_use(path)
        try:
            return finish(path) or _salvage(path)
        finally:
            lock.close()
    except RecoveryError as exc:
        raise StoreError(str(exc)) from None


def _salvage(path: Path) -> Salvaged:
    if not path.exists():
        raise StoreError(f"there is no conversation database at {path}")
    source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        conversation_columns = _columns(source, "conversations", CONVERSATION_COLUMNS)
        message_columns = _columns(source, "messages", MESSAGE_COLUMNS)
        conversations, lost_c = _rows(source, "conversations", conversation_columns)
        messages, lost_m = _rows(source, "messages", message_columns)
    except sqlite3.DatabaseError as exc:  # not even the schema can be read
        raise StoreError(f"nothing can be read from {path}: {exc}") from None
    finally:
        source.close()
    known = {row[0] for row in conversations}
    for message in messages:  # a message whose conversation's row was lost: an untitled one again
        of, created = message[1], message[message_columns.index("created")]
        if of not in known:
            known.add(of)
            again = {"id": of, "model": "", "created": created, "updated": created}
            conversations.append(tuple(again.get(column) for column in conversation_columns))
    recovered = recovered_path(path)
    for leftover in (recovered, *(Path(f"{recovered}{s}") for s in SIDE_FILES), plan_path(path, temporary=True)):
        leftover.unlink(missing_ok=True)  # a copy killed before its plan was written
    _copy(recovered, conversation_columns, conversations, message_columns, messages)  # 1
    kept = kept_path(path)
    done = Salvaged(len(known), len(messages), lost_c + lost_m, kept)
    _write_plan(
        path, {"kept": kept.name, "conversations": done.conversations, "messages": done.messages, "lost": done.lost}
    )  # 2
    finish(path)  # 3 to 5
    return done


def _copy(recovered: Path, conversation_columns, conversations, message_columns, messages) -> None:
    """Step 1: the rows into a new database at `recovered`, one file (no WAL), on the disk."""
    store = Store(recovered)
    try:
        with store._tx() as db:
            for table, columns, rows in (
                ("conversations", conversation_columns, conversations),
                ("messages", message_columns, messages),
            ):
                marks = ",".join("?" * len(columns))
                db.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)
        store.db.execute("PRAGMA journal_mode=DELETE")  # the WAL folded in and gone: the file is all of it
    finally:
        store.close()
    database_lock(recovered).unlink(missing_ok=True)  # the copy's own: no one else opens it
    fsync(recovered)
    fsync(recovered.parent)


def _write_plan(path: Path, plan: dict) -> None:
    """Step 2: the plan on the disk, whole or not at all (a temporary name, fsynced, renamed)."""
    temporary = plan_path(path, temporary=True)
    temporary.write_text(json.dumps(plan), encoding="utf-8")
    fsync(temporary)
    os.rename(temporary, plan_path(path))
    fsync(path.parent)
