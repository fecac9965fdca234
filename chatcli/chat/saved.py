"""Saved conversations as every front end reopens them: which one `-c` / `--conversation ID`
means, and where its KV cache lives beside the database.

Pure policy over a `Store` and a `ChatEngine` (no UI, no command line): the one-shot and the
TUI call the same functions and show their errors in their own way.
"""

from __future__ import annotations

from pathlib import Path

from chatcli.chat.conversation import Conversation
from chatcli.errors import one_line


class NoSuchConversation(LookupError):
    """Nothing to reopen; the message is one line for the user."""


def kv_path(store, conversation_id: str) -> Path:
    """The file a conversation's KV cache is kept in, beside the store's database."""
    return store.path.parent / "kv" / f"{conversation_id}.safetensors"


def open_saved(store, continue_last: bool, wanted: str | None, system: str | None = None) -> Conversation:
    """The saved conversation to continue: `wanted` (an id or a unique prefix) or, with
    `continue_last`, the most recent one. A `system` prompt given replaces the saved one, in
    the store too. Raises `NoSuchConversation`; the store's own errors pass through."""
    found = store.latest_id() if continue_last and not wanted else store.find(wanted)
    conversation = store.load(found) if found else None
    if conversation is None:
        if wanted:
            raise NoSuchConversation(not_found(store, wanted))
        raise NoSuchConversation("no saved conversation to continue")
    if system is not None:
        conversation.system = system
        store.set_system(conversation.id, system)
    return conversation


def not_found(store, wanted: str) -> str:
    """Why `wanted` names no one conversation: none has it, or it starts several ids."""
    several = store.matching(wanted)
    if len(several) > 1:
        shown = ", ".join(several[:3]) + (" …" if len(several) > 3 else "")
        return f"{wanted!r} starts {len(several)} conversation ids ({shown}): give more of it"
    return f"no conversation {wanted!r} (see 'chatcli history')"


def save_kv(engine, session, path: Path) -> str | None:
    """Keep the session's KV cache for the next start. None when done (or when there was nothing
    worth keeping); else why not, in one line: a full disk costs the next start a prefill."""
    try:
        engine.save_session(session, path)
    except OSError as exc:
        return one_line(exc)
    return None
