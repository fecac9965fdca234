"""Conversations saved as they happen: SQLite in the user data dir, WAL mode.

Each message is written in its own transaction when it completes — a user message
when it is sent, a reply when it finishes (a stopped, partial reply too) — so a crash
or `kill -9` mid-reply loses at most that reply, and the database stays readable.

The schema version lives in `PRAGMA user_version`. An older database is migrated; a
newer one (from a later chatcli) is refused with a clear message, never a traceback.
Version 2 adds a full-text index of every message (SQLite FTS5, kept by triggers) for
`search`: ranked by BM25, with a snippet around the words found; version 3 each
conversation's parent and fork point, for branches (`/edit`); version 4 the tool calls of a reply
and the call a tool result answers (MCP tools); version 5 where an import (`/load`) came from.

A search shows a message once, its copies in branches and imports folded under it (`hits.py`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from chatcli.chat.conversation import Conversation, Message
from chatcli.chat.export import from_export, to_export
from chatcli.chat.hits import Hit, fold
from chatcli.chat.recovery import RecoveryError, opened
from chatcli.chat.schema import SCHEMA_V1, SCHEMA_VERSION, UPGRADES
from chatcli.errors import UserError
from chatcli.paths import data_dir

DB_NAME = "chatcli.db"


def database_path() -> Path:
    """Where the conversations are kept: `chatcli.db` in the user data dir."""
    return data_dir() / DB_NAME


SEARCH_ROWS = 8  # rows read for each hit a search returns: the copies of a message fold into it
# a conversation's first user message (its title until /rename), for the conversation `of`
FIRST_USER_MESSAGE = "SELECT content FROM messages WHERE conversation_id={of} AND role='user' ORDER BY id LIMIT 1"


class StoreError(UserError):
    """The database cannot be used; the message says why and what to do."""


class StoreDamaged(StoreError):
    """A read met a damaged page: that read failed, the rest of the database may still work."""


CORRUPT = (11,)  # SQLITE_CORRUPT ("database disk image is malformed"; not a database at all: NOTADB, 26)


def damaged(path: Path, exc: sqlite3.Error) -> str | None:
    """The line for a database with a damaged page (None: `exc` is another error): what still
    works, and how to recover what can be read (`salvage.py`)."""
    if getattr(exc, "sqlite_errorcode", None) not in CORRUPT:
        return None
    return (
        f"the conversation database {path} is damaged ({exc}); conversations on its intact pages still open "
        "with chatcli --conversation ID. 'chatcli history --recover' copies what can be read into a new database "
        "(the damaged file is kept beside it)"
    )


@dataclass
class Summary:
    id: str
    title: str
    model: str
    created: float
    updated: float
    messages: int
    parent_id: str | None = None  # a branch's parent
    fork_at: int | None = None  # a branch's: how many messages it shares with its parent
    damaged: bool = False  # its messages could not be read (a damaged page): `messages` is 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class Store:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or database_path()
        self.damage: str | None = None  # set when a read went around a damaged page (the line to show)
        # held shared while open (a `--recover` waits for no chat), once a recovery cut short is finished
        try:
            self.lock, finished = opened(self.path)
        except RecoveryError as exc:
            raise StoreError(str(exc)) from None
        self.recovered: str | None = finished.line(self.path) if finished else None  # that recovery's line
        try:
            self._open()
        except BaseException:
            self.lock.close()
            raise

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                damaged(self.path, exc) or f"cannot open the conversation database {self.path}: {exc}"
            ) from None
        except OSError as exc:
            raise StoreError(f"cannot create {self.path.parent}: {exc}") from None

    def _migrate(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer chatcli (schema {version}, this one knows {SCHEMA_VERSION}); "
                "upgrade chatcli, or move the file away to start a new history"
            )
        if version == 0:  # a new file: create the schema and stamp its version in one transaction
            script = SCHEMA_V1 + "".join(UPGRADES[v] for v in sorted(UPGRADES))
            self.db.executescript(f"BEGIN IMMEDIATE; {script} PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
        while 0 < version < SCHEMA_VERSION:  # what an earlier chatcli wrote, one version a transaction
            self.db.executescript(f"BEGIN IMMEDIATE; {UPGRADES[version]} PRAGMA user_version={version + 1}; COMMIT;")
            version += 1

    def _tx(self):
        return _Transaction(self)

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        """The rows of a query; a damaged page or another database error is a StoreError."""
        try:
            return self.db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            line = damaged(self.path, exc)
            raise (
                StoreDamaged(line) if line else StoreError(f"cannot read the conversation database: {exc}")
            ) from None

    def close(self) -> None:
        self.db.close()
        self.lock.close()

    # -- writes: one transaction each ---------------------------------------------

    def create(self, conversation: Conversation, model: str = "", messages: bool = True) -> None:
        """A row for `conversation`, with its messages (`messages`: False for none: they follow)."""
        now = time.time()
        with self._tx():
            self.db.execute(
                "INSERT INTO conversations"
                " (id, title, model, system, created, updated, parent_id, fork_at, imported_from)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation.id,
                    conversation.name,
                    model,
                    conversation.system,
                    now,
                    now,
                    conversation.parent_id,
                    conversation.fork_at,
                    conversation.imported_from,
                ),
            )
            for message in conversation.messages if messages else ():
                self._insert(conversation.id, message, None, now)

    def add_message(self, conversation_id: str, message: Message, sampling: dict | None = None) -> None:
        now = time.time()
        with self._tx():
            self._insert(conversation_id, message, sampling, now)
            self.db.execute("UPDATE conversations SET updated=? WHERE id=?", (now, conversation_id))

    def _insert(self, conversation_id: str, message: Message, sampling: dict | None, now: float) -> None:
        self.db.execute(
            "INSERT INTO messages (conversation_id, role, content, finish_reason, stats, sampling, created, tools)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                conversation_id,
                message.role,
                message.content,
                message.finish_reason,
                json.dumps(message.stats) if message.stats is not None else None,
                json.dumps(sampling) if sampling is not None else None,
                now,
                _tools_json(message),
            ),
        )

    def remove_last(self, conversation_id: str, count: int) -> None:
        """Drop the newest `count` messages (for /undo and /retry)."""
        with self._tx():
            self.db.execute(
                "DELETE FROM messages WHERE id IN"
                " (SELECT id FROM messages WHERE conversation_id=? ORDER BY id DESC LIMIT ?)",
                (conversation_id, count),
            )

    def set_system(self, conversation_id: str, system: str | None) -> None:
        with self._tx():
            self.db.execute("UPDATE conversations SET system=? WHERE id=?", (system, conversation_id))

    def set_model(self, conversation_id: str, model: str) -> None:
        with self._tx():
            self.db.execute("UPDATE conversations SET model=? WHERE id=?", (model, conversation_id))

    def rename(self, conversation_id: str, title: str) -> None:
        with self._tx():
            self.db.execute("UPDATE conversations SET title=? WHERE id=?", (title, conversation_id))

    def delete(self, conversation_id: str) -> None:
        with self._tx():
            self.db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    # -- reads ---------------------------------------------------------------------

    def model_of(self, conversation_id: str) -> str | None:
        rows = self._read("SELECT model FROM conversations WHERE id=?", (conversation_id,))
        return rows[0][0] if rows else None

    def latest_id(self) -> str | None:
        rows = self._read("SELECT id FROM conversations ORDER BY updated DESC, rowid DESC LIMIT 1")
        return rows[0][0] if rows else None

    def find(self, prefix: str) -> str | None:
        """A conversation id from its full id or a unique prefix of it."""
        found = self.matching(prefix)
        return found[0] if len(found) == 1 else None

    def matching(self, prefix: str) -> list[str]:
        """The ids that start with `prefix`."""
        return [
            r[0] for r in self._read("SELECT id FROM conversations WHERE substr(id, 1, length(?1)) = ?1", (prefix,))
        ]

    def load(self, conversation_id: str) -> Conversation | None:
        rows = self._read(
            "SELECT title, system, parent_id, fork_at, imported_from FROM conversations WHERE id=?", (conversation_id,)
        )
        if not rows:
            return None
        title, system, parent_id, fork_at, imported_from = rows[0]
        conversation = Conversation(
            system=system,
            id=conversation_id,
            name=title,
            parent_id=parent_id,
            fork_at=fork_at,
            imported_from=imported_from,
        )
        for role, content, finish, stats, tools in self._read(
            "SELECT role, content, finish_reason, stats, tools FROM messages WHERE conversation_id=? ORDER BY id",
            (conversation_id,),
        ):
            message = Message(role, content, finish, json.loads(stats) if stats else None)
            if tools:
                found = json.loads(tools)
                message.tool_calls, message.tool_call = (found, None) if isinstance(found, list) else (None, found)
            conversation.messages.append(message)
        return conversation

    def summaries(self) -> list[Summary]:
        """Every conversation, the latest first. Around a damaged page, one conversation at a time:
        those whose messages cannot be read are marked `damaged`, and `self.damage` says so."""
        try:
            rows = self._read(
                "SELECT c.id, c.title, c.model, c.created, c.updated, COUNT(m.id),"
                f" ({FIRST_USER_MESSAGE.format(of='c.id')}), c.parent_id, c.fork_at"
                " FROM conversations c LEFT JOIN messages m ON m.conversation_id=c.id"
                " GROUP BY c.id ORDER BY c.updated DESC, c.rowid DESC"
            )
        except StoreDamaged as exc:
            return self._summaries_around(str(exc))
        return [
            Summary(id_, _shown_title(title, first), model, created, updated, n, parent, fork_at)
            for id_, title, model, created, updated, n, first, parent, fork_at in rows
        ]

    def _summaries_around(self, damage: str) -> list[Summary]:
        self.damage = damage
        found = []
        for id_, title, model, created, updated, parent, fork_at in self._read(
            "SELECT c.id, c.title, c.model, c.created, c.updated, c.parent_id, c.fork_at FROM conversations c"
            " ORDER BY c.updated DESC, c.rowid DESC"
        ):
            try:
                n, first, _size = self.db.execute(  # the rows themselves, not only the index: length()
                    f"SELECT COUNT(*), ({FIRST_USER_MESSAGE.format(of='?1')}), SUM(length(content))"
                    " FROM messages WHERE conversation_id=?1",
                    (id_,),
                ).fetchone()
                bad = False
            except sqlite3.DatabaseError:
                n, first, bad = 0, None, True
            found.append(Summary(id_, _shown_title(title, first), model, created, updated, n, parent, fork_at, bad))
        return found

    def family(self, conversation_id: str) -> list[tuple[str, str | None, int | None]]:
        """Every branch of the tree `conversation_id` belongs to, as (id, parent id, fork point),
        the root first, then in creation order."""
        root = conversation_id
        for _ in range(1000):  # up the parents (a cycle cannot be written, but a bound costs nothing)
            rows = self._read("SELECT parent_id FROM conversations WHERE id=?", (root,))
            if not rows or rows[0][0] is None:
                break
            root = rows[0][0]
        return self._read(
            "WITH RECURSIVE tree(id) AS"
            " (SELECT ? UNION SELECT c.id FROM conversations c JOIN tree ON c.parent_id = tree.id)"
            " SELECT c.id, c.parent_id, c.fork_at FROM conversations c JOIN tree ON c.id = tree.id"
            " ORDER BY c.parent_id IS NOT NULL, c.created, c.rowid",
            (root,),
        )

    def search(self, text: str, limit: int = 20) -> list[Hit]:
        """Messages holding every word of `text` (any order, case and accents folded by FTS5's
        unicode61), best first. Words are matched as written: no query syntax to get wrong. A message
        is one hit, its copies in branches and imports folded under it (`hits.fold`: the same text
        ranks the same, so they come together); SEARCH_ROWS rows are read for each hit."""
        words = text.split()
        if not words:
            return []
        query = " ".join('"' + w.replace('"', '""') + '"' for w in words)
        rows = self._read(
            "SELECT m.conversation_id, c.title, m.role, snippet(messages_fts, 0, '[', ']', '…', 12), f.rank,"
            f" ({FIRST_USER_MESSAGE.format(of='c.id')}),"
            " (SELECT COUNT(*) FROM messages WHERE conversation_id=m.conversation_id AND id<m.id),"
            " m.content, CASE WHEN c.parent_id IS NOT NULL THEN 'branch'"
            " WHEN c.imported_from IS NOT NULL THEN 'import' ELSE '' END"
            " FROM messages_fts f JOIN messages m ON m.id = f.rowid JOIN conversations c ON c.id = m.conversation_id"
            " WHERE messages_fts MATCH ? ORDER BY f.rank, c.created, m.id LIMIT ?",
            (query, limit * SEARCH_ROWS),
        )
        found = [
            (Hit(conv_id, _shown_title(title, first), index, role, " ".join(snippet.split()), rank), content, kind)
            for conv_id, title, role, snippet, rank, first, index, content, kind in rows
        ]
        return fold(found, limit)

    def times(self, conversation_id: str) -> tuple[float, float] | None:
        """A saved conversation's (created, updated), as `export` writes them."""
        rows = self._read("SELECT created, updated FROM conversations WHERE id=?", (conversation_id,))
        return rows[0] if rows else None

    def export(self, conversation_id: str) -> dict | None:
        conversation = self.load(conversation_id)
        if conversation is None:
            return None
        ((model, created, updated),) = self._read(
            "SELECT model, created, updated FROM conversations WHERE id=?", (conversation_id,)
        )
        return to_export(conversation, model, created, updated)

    def import_export(self, data: dict) -> Conversation:
        """Add a JSON export as a new conversation (a fresh id); raises ValueError on a bad file."""
        conversation = from_export(data)
        self.create(conversation, str(data.get("model", "")))
        return conversation


def _tools_json(message: Message) -> str | None:
    """The `tools` column: a reply's calls (a list) or a tool result's call (an object)."""
    found = message.tool_calls or message.tool_call
    return json.dumps(found, ensure_ascii=False) if found else None


def _shown_title(title: str | None, first_user_message: str | None) -> str:
    """A conversation's title as lists show it: the /rename, else from its first user message."""
    return title or Conversation(messages=[Message("user", first_user_message or "")]).title


class _Transaction:
    def __init__(self, store: Store) -> None:
        self.db, self.path = store.db, store.path

    def _error(self, exc: sqlite3.Error) -> StoreError:
        return StoreError(damaged(self.path, exc) or f"cannot save to the conversation database: {exc}")

    def __enter__(self):
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:  # locked for too long, closed, read-only, disk full
            raise self._error(exc) from None
        return self.db

    def __exit__(self, kind, value, tb):
        try:
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")
        except sqlite3.Error as exc:
            if kind is None:
                raise self._error(exc) from None
        if kind is not None and issubclass(kind, sqlite3.Error):
            raise self._error(value) from None
        return False
