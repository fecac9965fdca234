"""Locks between chatcli processes, as advisory `flock`s that the OS drops with a process that dies
holding one (`locks/` beside the database).

A turn's lock on a saved conversation: processes answering in one conversation take turns. Held for a
whole turn (the prompt saved, the reply generated and saved), so that one-shots continuing one
conversation at once each read it as the one before left it and every prompt lands with its own
reply, in order: `locks/ID.lock`.

The database's lock: every open `Store` holds it shared, `history --recover` exclusive (it moves the
file away: `salvage.py`), so a recovery never runs under a chat that has the database open:
`locks/chatcli.db.lock`.

Below the store (which holds the database's lock): a lock that cannot be taken is a UserError, one line.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import IO

from chatcli.errors import UserError


def flocked(path: Path, shared: bool = False, wait: bool = True) -> IO | None:
    """`path` opened (made if missing) and locked, shared or exclusive; None when `wait` is False and
    another process holds a lock that stands in the way. Closing the file lets go. OSError when the
    file cannot be made."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")  # noqa: SIM115 - the caller closes it, and with it the lock
    try:
        fcntl.flock(handle.fileno(), (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        handle.close()
        return None
    except BaseException:
        handle.close()
        raise
    return handle


def database_lock(database: Path) -> Path:
    """The file of `database`'s lock (shared by every open Store, exclusive for a recovery)."""
    return database.parent / "locks" / f"{database.name}.lock"


@contextlib.contextmanager
def turn_lock(folder: Path, conversation_id: str):
    """Hold conversation `conversation_id`'s turn lock (in `folder`/locks) while the block runs."""
    where = folder / "locks"
    try:
        handle = flocked(where / f"{conversation_id}.lock")
    except OSError as exc:
        raise UserError(f"cannot lock the conversation in {where}: {exc.strerror or exc}") from None
    try:
        yield
    finally:
        handle.close()  # and with it the lock
