"""Many conversations on the chat screen: the store, the session pool and the sidebar.

Mixed into `ChatScreen`. Every conversation keeps its engine `Session` in a
`SessionPool` keyed by the conversation id, so switching back prefills only the new
turn while that cache is resident; an evicted conversation starts a new session (or
one restored from its KV file on disk). Messages are written to the `Store` as they
happen; a store that fails is reported once and the app carries on without saving.
Nothing switches while a reply streams or prompts wait in the queue.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict
from pathlib import Path

from chatcli.chat.commands import export_format
from chatcli.chat.conversation import Conversation, Message
from chatcli.chat.store import StoreError, from_export, to_export, to_markdown
from chatcli.ui.format import human_bytes, reply_note
from chatcli.ui.widgets.chat_pane import LoadingLine
from chatcli.ui.widgets.sidebar import Row, Sidebar

BUSY_SWITCH = "a reply is streaming: press Esc to stop it before leaving this conversation"
QUEUED_SWITCH = "prompts are waiting to be sent: press Esc to drop them before leaving this conversation"


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class Conversations:
    def init_conversations(self, store, resume: tuple[bool, str | None], budget: int | None, system_given: bool) -> None:
        self.store = store  # chatcli.chat.store.Store, or None: nothing is saved
        self.resume = resume  # (-c, --conversation ID)
        self.system_given = system_given  # --system overrides a reopened conversation's
        self.budget = budget
        self.pool = None  # SessionPool, once the engine is loaded
        self.opened: dict[str, Conversation] = {self.conversation.id: self.conversation}
        self.stored: set[str] = set()  # ids of conversations in the store
        self.had_session: set[str] = set()  # ids given a session in this run (the KV file is only read before)
        self.sidebar = Sidebar()

    # -- the store -------------------------------------------------------------

    def _save(self, method: str, *args) -> bool:
        """Call `self.store.<method>(*args)`; False (and saving ends) when there is no store or it fails."""
        if self.store is None:
            return False
        try:
            getattr(self.store, method)(*args)
            return True
        except (StoreError, sqlite3.Error, OSError) as exc:
            self.store_failed(exc)
            return False

    def store_failed(self, exc: BaseException) -> None:
        self.store = None
        self.app.notify(f"{one_line(exc)}. Conversations are not saved from now on.", title="Not saved", severity="error", timeout=10)

    def save_user(self, message: Message) -> None:
        conv = self.conversation
        if conv.id in self.stored:
            self._save("add_message", conv.id, message)
        elif self._save("create", conv, getattr(self.engine, "name", "")):
            self.stored.add(conv.id)  # created with its messages so far, this one included
        if self.sidebar.is_open:
            self.refresh_sidebar()  # its title and count, before the reply comes

    def save_reply(self, message: Message, params) -> None:
        if self.conversation.id in self.stored:
            self._save("add_message", self.conversation.id, message, asdict(params))

    def forget_last(self, count: int) -> None:
        if count and self.conversation.id in self.stored:
            self._save("remove_last", self.conversation.id, count)

    def save_system(self) -> None:
        if self.conversation.id in self.stored:
            self._save("set_system", self.conversation.id, self.conversation.system)

    def kv_path(self, conv: Conversation) -> Path | None:
        if self.store is None or conv.id not in self.stored:
            return None
        from chatcli.oneshot import kv_file

        return kv_file(self.store, conv.id)

    # -- sessions --------------------------------------------------------------

    def start_pool(self, engine) -> None:
        from chatcli.engine.pool import SessionPool, default_budget_bytes

        budget = self.budget if self.budget is not None else default_budget_bytes()
        self.pool = SessionPool(engine.new_session, budget)

    def session_for(self, conv: Conversation):
        """The conversation's session: resident in the pool, else new. A saved conversation
        opened for the first time in this run starts from its KV file on disk, when it has a
        valid one; one evicted from the pool later is prefilled again (cached_tokens 0)."""
        session = self.pool.get(conv.id)
        if session is None:
            session = self.engine.new_session()
            restored = self._restore_kv(conv) if conv.messages and conv.id not in self.had_session else None
            if restored is not None:
                session.cache = restored
        self.had_session.add(conv.id)
        self.pool.put(conv.id, session)  # most recently used
        return session

    def _restore_kv(self, conv: Conversation):
        path = self.kv_path(conv)
        if path is None:
            return None
        from chatcli.engine.threads import release_cpu_threads

        try:
            from chatcli.engine.persist import fingerprint, load_cache

            return load_cache(self.engine.runner, path, fingerprint(self.engine.runner, self.engine.name))
        except Exception:  # noqa: BLE001 - no usable file: the next turn prefills as usual
            return None
        finally:
            release_cpu_threads()  # restoring ran torch on the UI thread: see engine/threads.py

    def keep_session(self) -> None:
        """After a turn: put the session back at its new size (the pool may evict others)."""
        if self.pool is not None and self.session is not None:
            self.pool.put(self.conversation.id, self.session)
        self.refresh_pool()

    def refresh_pool(self) -> None:
        if self.pool is None:
            return
        stats = self.pool.stats()
        n = stats["sessions"]
        self.panels.set_pool(
            f"{n} conversation{'s' if n != 1 else ''}",
            f"{human_bytes(stats['bytes'])} / {human_bytes(stats['budget_bytes'])}",
        )
        self.refresh_sidebar()

    # -- the sidebar -------------------------------------------------------------

    def conversation_rows(self) -> list[Row]:
        rows: list[Row] = []
        if self.store is not None:
            try:
                summaries = self.store.summaries()
            except (StoreError, sqlite3.Error) as exc:
                self.store_failed(exc)
                summaries = []
            for s in summaries:
                conv = self.opened.get(s.id)
                self.stored.add(s.id)
                rows.append(Row(s.id, conv.title if conv else s.title, s.updated, s.model, s.messages))
        known = {r.id for r in rows}
        model = getattr(self.engine, "name", "")
        unsaved = [Row(c.id, c.title, None, model, len(c.messages)) for c in self.opened.values() if c.id not in known]
        return unsaved[::-1] + rows

    def refresh_sidebar(self) -> None:
        resident = set(self.pool.keys()) if self.pool is not None else set()
        self.sidebar.show_rows(self.conversation_rows(), self.conversation.id, resident)

    def action_toggle_sidebar(self) -> None:
        self.sidebar.toggle_class("-open")
        if self.sidebar.is_open:
            self.refresh_sidebar()
            self.sidebar.list.focus()
        else:
            self.prompt.focus()

    async def on_sidebar_picked(self, message: Sidebar.Picked) -> None:
        await self.switch_to(message.index + 1)
        self.prompt.focus()

    # -- switching -------------------------------------------------------------

    def switch_refused(self) -> str | None:
        if self.busy:
            return BUSY_SWITCH
        if self.queue:
            return QUEUED_SWITCH
        return None

    async def show_conversation(self, conv: Conversation) -> None:
        """Make `conv` the current conversation: its messages on screen, its session ready."""
        old = self.conversation
        if old.id != conv.id and not old.messages and old.id not in self.stored:
            self.opened.pop(old.id, None)  # an empty new conversation leaves no trace
            if self.pool is not None:
                self.pool.drop(old.id)
        self.conversation = conv
        self.opened[conv.id] = conv
        self.session = self.session_for(conv) if self.pool is not None else None
        await self.pane.remove_children()
        if self._loading is not None:  # still loading: keep showing it
            self._loading = LoadingLine(self.load_status)
            self.pane.mount(self._loading)
        for m in conv.messages:
            if m.role == "user":
                self.pane.add_user(m.content).message = m
            else:
                self.pane.add_saved_reply(m.content, reply_note(m.finish_reason, m.stats)).message = m
        self.panels.reset()
        self.last_stats = next((m.stats for m in reversed(conv.messages) if m.stats), None)
        if self.engine is not None:
            self.panels.set_context(len(self.session.cache), self.engine.context_limit)
        self.refresh_pool()
        self.refresh_sidebar()
        self.pane.follow()
        self.prompt.focus()  # the next thing typed is the prompt, wherever the focus was

    async def switch_to(self, number: int) -> None:
        refused = self.switch_refused()
        if refused:
            self._note(refused, error=True)
            return
        rows = self.conversation_rows()
        if not 1 <= number <= len(rows):
            self._note(f"no conversation {number}: there are {len(rows)} (F3 shows them)", error=True)
            return
        row = rows[number - 1]
        if row.id == self.conversation.id:
            self._note(f"already in conversation {number}: {row.title}")
            return
        conv = self.opened.get(row.id)
        if conv is None:
            try:
                conv = self.store.load(row.id)
            except (StoreError, sqlite3.Error) as exc:
                self.store_failed(exc)
                conv = None
            if conv is None:
                self._note(f"conversation {number} could not be read", error=True)
                return
        await self.show_conversation(conv)
        self._note(f"conversation {number}: {conv.title}")

    async def new_conversation(self, system: str | None) -> bool:
        refused = self.switch_refused()
        if refused:
            self._note(refused, error=True)
            return False
        await self.show_conversation(Conversation(system=system))
        return True

    async def open_at_start(self) -> None:
        """`-c` / `--conversation ID`: reopen a saved conversation instead of a new one."""
        continue_last, wanted = self.resume
        if not (continue_last or wanted):
            self.refresh_sidebar()
            return
        if self.store is None:
            self._note("no conversation database, so there is nothing to continue", error=True)
            return
        try:
            found = self.store.latest_id() if continue_last and not wanted else self.store.find(wanted)
            conv = self.store.load(found) if found else None
        except (StoreError, sqlite3.Error) as exc:
            self.store_failed(exc)
            return
        if conv is None:
            self._note(f"no conversation {wanted!r} (see 'chatcli history')" if wanted else "no saved conversation to continue", error=True)
            self.refresh_sidebar()
            return
        self.stored.add(conv.id)
        if self.system_given:
            conv.system = self.conversation.system
        await self.show_conversation(conv)
        self.save_system()
        self._note(f"continuing: {conv.title} ({len(conv.messages)} messages)")

    # -- commands ----------------------------------------------------------------

    async def action_new_conversation(self) -> None:
        if await self.new_conversation(self.default_system):
            self._note("new conversation")

    async def cmd_new(self, _arg: str) -> None:
        await self.action_new_conversation()

    async def cmd_switch(self, arg: str) -> None:
        await self.switch_to(int(arg))

    async def cmd_rename(self, arg: str) -> None:
        self.conversation.name = arg
        if self.conversation.id in self.stored:
            self._save("rename", self.conversation.id, arg)
        self.refresh_sidebar()
        self._note(f"renamed: {arg}")

    async def cmd_delete(self, _arg: str) -> None:
        refused = self.switch_refused()
        if refused:
            self._note(refused, error=True)
            return
        from chatcli.ui.screens.confirm import Confirm

        conv = self.conversation
        question = f"Delete the conversation “{conv.title}” and its {len(conv.messages)} messages? This cannot be undone."

        async def answered(yes: bool | None) -> None:
            if not yes:
                self._note("kept the conversation")
                return
            await self.delete_current()

        self.app.push_screen(Confirm(question), answered)

    async def delete_current(self) -> None:
        conv = self.conversation
        title, path = conv.title, self.kv_path(conv)
        if conv.id in self.stored:
            self._save("delete", conv.id)
            self.stored.discard(conv.id)
        if path is not None:
            path.unlink(missing_ok=True)
        if self.pool is not None:
            self.pool.drop(conv.id)
        self.opened.pop(conv.id, None)
        conv.messages = []  # so switching away does not keep it listed
        await self.show_conversation(Conversation(system=self.default_system))
        self._note(f"deleted: {title}")

    async def cmd_save(self, arg: str) -> None:
        conv = self.conversation
        data = to_export(conv, getattr(self.engine, "name", ""))
        text = to_markdown(data) if export_format(arg) == "md" else json.dumps(data, indent=2, ensure_ascii=False)
        path = Path(arg).expanduser()
        try:
            path.write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            self._note(f"/save: cannot write {arg}: {exc.strerror or exc}", error=True)
            return
        self._note(f"saved {len(conv.messages)} messages to {path}")

    async def cmd_load(self, arg: str) -> None:
        refused = self.switch_refused()
        if refused:
            self._note(refused, error=True)
            return
        try:
            data = json.loads(Path(arg).expanduser().read_text(encoding="utf-8"))
            conv = from_export(data)
        except OSError as exc:
            self._note(f"/load: cannot read {arg}: {exc.strerror or exc}", error=True)
            return
        except UnicodeDecodeError:
            self._note(f"/load: {arg} is not a text file", error=True)
            return
        except ValueError as exc:  # json.JSONDecodeError is one
            self._note(f"/load: {arg}: {one_line(exc)}", error=True)
            return
        if self._save("create", conv, str(data.get("model", ""))):
            self.stored.add(conv.id)
        await self.show_conversation(conv)
        self._note(f"loaded {len(conv.messages)} messages from {arg} as a new conversation")
