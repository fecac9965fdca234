"""What a damaged conversation database still holds, copied into a new one (`chatcli history --recover`).

A damaged page costs the rows on it and nothing else: every conversation and every message is read
alone, by its rowid, so one that cannot be read is skipped and counted. A message whose
conversation's row was lost keeps its conversation (a row is made again, untitled). The copy is
written to `chatcli-recovered.db` beside the database and then put in its place; the damaged file
(with its WAL) is kept beside it as `chatcli.db.damaged`. Python's sqlite3 alone, so it works where
the `sqlite3` shell's `.recover` is missing or fails.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from chatcli.chat.store import Store, StoreError

CONVERSATION_COLUMNS = "id, title, model, system, created, updated, parent_id, fork_at"
MESSAGE_COLUMNS = "id, conversation_id, role, content, finish_reason, stats, sampling, created"


@dataclass
class Salvaged:
    conversations: int
    messages: int
    lost: int  # rows that could not be read (conversations and messages)
    kept_as: Path  # where the damaged file now is

    def line(self, path: Path) -> str:
        rows = "1 row" if self.lost == 1 else f"{self.lost} rows"
        lost = f"; {rows} on damaged pages could not be read" if self.lost else "; nothing was lost"
        return (
            f"recovered {self.conversations} conversations and {self.messages} messages into {path}{lost}; "
            f"the damaged file is kept as {self.kept_as}"
        )


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


def _rows(db: sqlite3.Connection, table: str, columns: str) -> tuple[list[tuple], int]:
    """Every readable row of `table`, one rowid at a time, and how many could not be read."""
    found, lost = [], 0
    for rowid in range(1, _last_rowid(db, table) + 1):
        try:
            row = db.execute(f"SELECT {columns} FROM {table} WHERE rowid=?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            lost += 1
            continue
        if row is not None:
            found.append(row)
    return found, lost


def salvage(path: Path) -> Salvaged:
    """Copy what `path` still holds into a new database and put it in `path`'s place."""
    if not path.exists():
        raise StoreError(f"there is no conversation database at {path}")
    source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        conversations, lost_c = _rows(source, "conversations", CONVERSATION_COLUMNS)
        messages, lost_m = _rows(source, "messages", MESSAGE_COLUMNS)
    except sqlite3.DatabaseError as exc:  # not even the schema can be read
        raise StoreError(f"nothing can be read from {path}: {exc}") from None
    finally:
        source.close()
    known = {row[0] for row in conversations}
    for message in messages:  # a message whose conversation's row was lost: an untitled one again
        if message[1] not in known:
            known.add(message[1])
            conversations.append((message[1], None, "", None, message[7], message[7], None, None))
    recovered = path.with_name(path.stem + "-recovered.db")
    for leftover in (recovered, Path(f"{recovered}-wal"), Path(f"{recovered}-shm")):
        leftover.unlink(missing_ok=True)
    store = Store(recovered)
    try:
        with store._tx() as db:
            db.executemany(
                f"INSERT INTO conversations ({CONVERSATION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)", conversations
            )
            db.executemany(f"INSERT INTO messages ({MESSAGE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)", messages)
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        store.close()
    kept = path.with_name(path.name + ".damaged")
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{path}{suffix}").exists():
            os.replace(f"{path}{suffix}", f"{kept}{suffix}")
    os.replace(recovered, path)
    return Salvaged(len(known), len(messages), lost_c + lost_m, kept)
