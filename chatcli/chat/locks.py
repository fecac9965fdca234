"""A turn's lock on a saved conversation: processes answering in one conversation take turns.

Held for a whole turn (the prompt saved, the reply generated and saved), so that one-shots continuing
one conversation at once each read it as the one before left it and every prompt lands with its own
reply, in order. `locks/ID.lock` beside the database: an advisory `flock` that the OS drops with a
process that dies holding it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from chatcli.chat.store import StoreError


@contextlib.contextmanager
def turn_lock(folder: Path, conversation_id: str):
    """Hold conversation `conversation_id`'s turn lock (in `folder`/locks) while the block runs."""
    import fcntl

    where = folder / "locks"
    try:
        where.mkdir(parents=True, exist_ok=True)
        handle = open(where / f"{conversation_id}.lock", "a+")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise StoreError(f"cannot lock the conversation in {where}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        handle.close()  # and with it the lock
