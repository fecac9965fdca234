"""The conversations of one TUI run, apart from any widget: the store, the session pool, and
what the sidebar lists.

Pure (no Textual): the chat screen holds one `Chats` and asks it; the screen only draws.
Every conversation keeps its engine `Session` in a `SessionPool` keyed by the conversation
id, so switching back prefills only the new turn while that cache is resident; one evicted
starts a new session, or one restored from its KV file on disk when it is opened for the
first time in this run. Messages are written to the `Store` as they happen; a store that
fails is reported once (`on_store_failed`) and the run carries on without saving.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from chatcli.chat.commands import export_format
from chatcli.chat.conversation import Conversation, Message
from chatcli.chat.export import from_export, render_export, to_export
from chatcli.chat.saved import kv_path, open_saved
from chatcli.chat.store import StoreDamaged, StoreError
from chatcli.errors import one_line

STORE_ERRORS = (StoreError, sqlite3.Error, OSError)


class ChatsError(ValueError):
    """A request the conversations cannot carry out; the message is one line for the user."""


@dataclass
class Row:
    """One conversation as the sidebar lists it."""

    id: str
    title: str
    updated: float | None  # None: not saved yet
    model: str
    messages: int
    branch: bool = False  # branched from another conversation (/edit)
    fork_at: int | None = None  # a branch's: the messages it shares with its parent (its own start at #fork_at+1)


class Chats:
    def __init__(
        self,
        store,
        budget: int | None = None,
        on_store_failed: Callable[[BaseException], None] = print,
        on_store_damaged: Callable[[str], None] = print,
    ):
        self.store = store  # chatcli.chat.store.Store, or None: nothing is saved
        self.budget = budget  # bytes of KV cache the pool keeps; None: chatcli.engine.default_budget_bytes()
        self.on_store_failed = on_store_failed
        self.on_store_damaged = on_store_damaged  # told once that the list went around a damaged page
        self.damage_told = False
        self.engine = None
        self.pool = None  # SessionPool, once the engine is loaded
        self.opened: dict[str, Conversation] = {}  # conversations shown in this run, by id
        self.stored: set[str] = set()  # ids of conversations in the store
        self.had_session: set[str] = set()  # ids given a session in this run (the KV file is read before only)
        self.restored: dict[str, tuple[int, float]] = {}  # id -> (tokens, seconds) of a cache read from disk

    # -- the store -------------------------------------------------------------

    def _save(self, method: str, *args) -> bool:
        """Call `self.store.<method>(*args)`; False (and saving ends) when there is no store or it fails."""
        if self.store is None:
            return False
        try:
            getattr(self.store, method)(*args)
            return True
        except STORE_ERRORS as exc:
            self.store_failed(exc)
            return False

    def store_failed(self, exc: BaseException) -> None:
        self.store = None
        self.on_store_failed(exc)

    def save_user(self, conv: Conversation, message: Message) -> None:
        if conv.id in self.stored:
            self._save("add_message", conv.id, message)
        elif self._save("create", conv, self.model):
            self.stored.add(conv.id)  # created with its messages so far, this one included

    def save_reply(self, conv: Conversation, message: Message, params) -> None:
        if conv.id in self.stored:
            self._save("add_message", conv.id, message, asdict(params))

    def save_result(self, conv: Conversation, message: Message) -> None:
        """A tool's result (MCP), after the reply whose call it answers."""
        if conv.id in self.stored:
            self._save("add_message", conv.id, message)

    def forget_last(self, conv: Conversation, count: int) -> None:
        if count and conv.id in self.stored:
            self._save("remove_last", conv.id, count)

    def saved_model(self, conv: Conversation) -> str | None:
        """The model a saved conversation last answered with (None: not saved, or no store)."""
        if self.store is None or conv.id not in self.stored:
            return None
        try:
            return self.store.model_of(conv.id) or None
        except STORE_ERRORS as exc:
            self.store_failed(exc)
            return None

    def set_model(self, conv: Conversation) -> None:
        """The conversation answers with the current engine's model from now on (as the store says)."""
        if conv.id in self.stored:
            self._save("set_model", conv.id, self.model)

    def save_system(self, conv: Conversation) -> None:
        if conv.id in self.stored:
            self._save("set_system", conv.id, conv.system)

    def rename(self, conv: Conversation, title: str) -> None:
        conv.name = title
        if conv.id in self.stored:
            self._save("rename", conv.id, title)

    def kv_path(self, conv: Conversation) -> Path | None:
        """Where the conversation's KV cache is kept; None when it is not saved."""
        if self.store is None or conv.id not in self.stored:
            return None
        return kv_path(self.store, conv.id)

    @property
    def model(self) -> str:
        return getattr(self.engine, "name", "")

    # -- sessions --------------------------------------------------------------

    def start_pool(self, engine) -> None:
        from chatcli.engine import SessionPool, default_budget_bytes

        self.engine = engine
        budget = self.budget if self.budget is not None else default_budget_bytes()
        self.pool = SessionPool(engine.new_session, budget)

    def session_for(self, conv: Conversation):
        """The conversation's session: resident in the pool, else new. A saved conversation
        opened for the first time in this run starts from its KV file on disk, when it has a
        valid one; one evicted from the pool later is prefilled again (cached_tokens 0)."""
        session = self.pool.get(conv.id)
        if session is None:
            session = self.engine.new_session()
            path = self.kv_path(conv)
            if path is not None and conv.messages and conv.id not in self.had_session:
                self._restore(conv, session, path)
        self.had_session.add(conv.id)
        self.pool.put(conv.id, session)  # most recently used
        return session

    def _restore(self, conv: Conversation, session, path: Path) -> None:
        from chatcli.engine import release_cpu_threads

        start = time.perf_counter()
        try:
            if self.engine.restore_session(session, path):  # no usable file: the next turn prefills as usual
                self.restored[conv.id] = (len(session.cache), time.perf_counter() - start)
        finally:
            release_cpu_threads()  # restoring may run torch on the UI thread: see engine/runners/threads.py

    def take_restored(self, conv: Conversation) -> tuple[int, float] | None:
        """(tokens, seconds) where the conversation's cache was read from disk since its last turn, once:
        its next turn's stats say so."""
        return self.restored.pop(conv.id, None)

    def keep(self, conv: Conversation, session) -> None:
        """After a turn: put the session back at its new size (the pool may evict others)."""
        if self.pool is not None and session is not None:
            self.pool.put(conv.id, session)

    def resident(self) -> set[str]:
        return set(self.pool.keys()) if self.pool is not None else set()

    # -- the list ----------------------------------------------------------------

    def rows(self) -> list[Row]:
        """Every conversation, numbered as `/switch N` takes them: the unsaved ones of this run
        (newest first), then the store's, most recently updated first."""
        rows: list[Row] = []
        if self.store is not None:
            try:
                summaries = self.store.summaries()
            except STORE_ERRORS as exc:
                self.store_failed(exc)
                summaries = []
            if self.store is not None and self.store.damage and not self.damage_told:
                self.damage_told = True
                self.on_store_damaged(self.store.damage)
            for s in summaries:
                conv = self.opened.get(s.id)
                self.stored.add(s.id)
                title = conv.title if conv else s.title
                rows.append(Row(s.id, title, s.updated, s.model, s.messages, s.parent_id is not None, s.fork_at))
        known = {r.id for r in rows}
        unsaved = [
            Row(c.id, c.title, None, self.model, len(c.messages), c.parent_id is not None, c.fork_at)
            for c in self.opened.values()
            if c.id not in known
        ]
        return unsaved[::-1] + rows

    def numbered(self, number: int) -> Conversation:
        """Conversation `number` of `rows()`, read from the store if not open; raises `ChatsError`."""
        rows = self.rows()
        if not 1 <= number <= len(rows):
            raise ChatsError(f"no conversation {number}: there are {len(rows)} (F3 shows them)")
        try:
            return self.by_id(rows[number - 1].id)
        except ChatsError:
            raise ChatsError(f"conversation {number} could not be read") from None

    def branch(self, conv: Conversation, at: int) -> Conversation:
        """A branch of `conv` sharing its first `at` messages (`/edit`), saved with its first message.
        Its session starts as a copy of `conv`'s cache where that is resident, so the next turn
        prefills only what differs from the shared prefix (the engine crops the copy to it)."""
        from chatcli.engine import fork_session

        new = conv.branch(at)
        self.opened[new.id] = new
        parent = self.pool.get(conv.id) if self.pool is not None else None
        if parent is not None and len(parent.cache):
            fork = getattr(self.engine, "fork_session", fork_session)  # a generation process forks its own
            self.pool.put(new.id, fork(parent, len(parent.cache)))
        return new

    def family(self, conv: Conversation) -> list[Row]:
        """The rows of every branch of `conv`'s tree (it, its parents, their other branches)."""
        ids = [conv.id]
        if self.store is not None and conv.id in self.stored:
            try:
                ids = [row[0] for row in self.store.family(conv.id)]
            except STORE_ERRORS as exc:
                self.store_failed(exc)
        by_id = {r.id: r for r in self.rows()}
        return [by_id[i] for i in ids if i in by_id]

    def by_id(self, conversation_id: str) -> Conversation:
        """An open conversation, or a saved one read from the store; raises `ChatsError`."""
        conv = self.opened.get(conversation_id)
        if conv is None and self.store is not None:
            try:
                conv = self.store.load(conversation_id)
            except StoreDamaged as exc:  # this one's page: the others still open, and saving goes on
                raise ChatsError(str(exc)) from None
            except STORE_ERRORS as exc:
                self.store_failed(exc)
        if conv is None:
            raise ChatsError(f"conversation {conversation_id} could not be read")
        self.stored.add(conv.id)
        return conv

    # -- opening, leaving, deleting ------------------------------------------------

    def opening(self, old: Conversation | None, new: Conversation) -> None:
        """`new` becomes the one on screen; an empty `old` that was never saved leaves no trace."""
        if old is not None and old.id != new.id and not old.messages and old.id not in self.stored:
            self.opened.pop(old.id, None)
            if self.pool is not None:
                self.pool.drop(old.id)
        self.opened[new.id] = new

    def reopen(self, continue_last: bool, wanted: str | None, system: str | None) -> Conversation | None:
        """`-c` / `--conversation ID` (see `chat.saved.open_saved`). None when the store failed
        (reported); raises `NoSuchConversation`."""
        if self.store is None:
            raise ChatsError("no conversation database, so there is nothing to continue")
        try:
            conv = open_saved(self.store, continue_last, wanted, system)
        except STORE_ERRORS as exc:
            self.store_failed(exc)
            return None
        self.stored.add(conv.id)
        return conv

    def delete(self, conv: Conversation) -> None:
        """The conversation, its messages and its KV file, from the store, the pool and this run."""
        path = self.kv_path(conv)
        if conv.id in self.stored:
            self._save("delete", conv.id)
            self.stored.discard(conv.id)
        if path is not None:
            path.unlink(missing_ok=True)
        if self.pool is not None:
            self.pool.drop(conv.id)
        self.opened.pop(conv.id, None)
        conv.messages = []  # so leaving it does not keep it listed

    # -- files ---------------------------------------------------------------------

    def export(self, conv: Conversation, name: str) -> Path:
        """Write the conversation to `name` (.md or .json); raises `ChatsError`."""
        path = Path(name).expanduser()
        text = render_export(to_export(conv, self.model, *self._times(conv)), export_format(name))
        try:
            path.write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            raise ChatsError(f"cannot write {name}: {exc.strerror or exc}") from None
        return path

    def _times(self, conv: Conversation) -> tuple[float, float]:
        """(created, updated) as the store has them, as `chatcli export` writes them; an unsaved
        conversation's both now (it was 0.0, 1970, in every /save)."""
        if self.store is not None and conv.id in self.stored:
            try:
                saved = self.store.times(conv.id)  # its row only, not its messages
                if saved is not None:
                    return saved
            except STORE_ERRORS as exc:
                self.store_failed(exc)
        now = time.time()
        return now, now

    def import_file(self, name: str) -> Conversation:
        """A JSON export read as a new conversation (saved when the store works); raises `ChatsError`."""
        try:
            data = json.loads(Path(name).expanduser().read_text(encoding="utf-8"))
            conv = from_export(data)
        except OSError as exc:
            raise ChatsError(f"cannot read {name}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ChatsError(f"{name} is not a text file") from None
        except json.JSONDecodeError as exc:  # a Markdown export, say: /load reads the JSON one only
            raise ChatsError(
                f"{name} is not a chatcli JSON export (line {exc.lineno}: {exc.msg}); "
                "/save NAME.json or chatcli export --format json writes one"
            ) from None
        except ValueError as exc:
            raise ChatsError(f"{name}: {one_line(exc)}") from None
        if self._save("create", conv, str(data.get("model", ""))):
            self.stored.add(conv.id)
        return conv
