"""`history --recover` killed at each of its steps loses nothing: the next start (opening the store)
finishes or undoes the recovery, `history` lists every conversation, and a `--recover` run again
recovers them all and never overwrites a damaged file kept before (`chatcli/chat/salvage.py`)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chatcli.chat.recovery import plan_path, recovered_path
from chatcli.chat.salvage import salvage
from chatcli.chat.store import Store, StoreError
from tests.test_store_damage import damaged_store

CONVERSATIONS = 40

# salvage() in a process that SIGKILLs itself at its k-th file-system step: a rename, a replace, an
# unlink or an fsync (what crash safety depends on), counted from 1; exit 0 if it had fewer steps
KILLED_AT_STEP = """
import os, signal, sys
from pathlib import Path
from chatcli.chat.recovery import plan_path, recovered_path
from chatcli.chat.salvage import salvage

at, count = int(sys.argv[2]), [0]

def step(real):
    def run(*args, **kwargs):
        count[0] += 1
        if count[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return run

for name in ("rename", "replace", "unlink", "fsync"):
    setattr(os, name, step(getattr(os, name)))
salvage(Path(sys.argv[1]))
"""


def recover_killed_at(path: Path, step: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", KILLED_AT_STEP, str(path), str(step)], capture_output=True, text=True, timeout=120
    )


def listed(path: Path) -> set[str]:
    """The conversations a start finds (opening the store, as `history` does)."""
    store = Store(path)
    try:
        return {s.id for s in store.summaries()}
    finally:
        store.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def kept(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("chatcli.db.damaged*") if not p.name.endswith(("-wal", "-shm")))


def test_a_recovery_killed_at_every_step_loses_no_conversation(tmp_path):
    path = tmp_path / "chatcli.db"
    steps = 0
    for step in range(1, 100):
        for leftover in tmp_path.iterdir():  # each step from the same damaged database
            if leftover.is_file():
                leftover.unlink()
        ids = set(damaged_store(path, count=CONVERSATIONS)[0])
        original = digest(path)
        assert listed(path) == ids
        killed = recover_killed_at(path, step)
        if killed.returncode == 0:  # fewer steps than `step`: the recovery ran to its end
            steps = step - 1
            break
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert listed(path) == ids, f"killed at step {step}: the next start lost conversations"
        done = salvage(path)  # and --recover again
        assert done.conversations == CONVERSATIONS
        assert listed(path) == ids, f"killed at step {step}: --recover again lost conversations"
        left = [p.name for p in tmp_path.iterdir() if "recover" in p.name]
        assert not left, f"killed at step {step}: a recovery's files were left behind: {left}"
        assert original in {digest(p) for p in kept(tmp_path)}, f"killed at step {step}: the damaged file is gone"
    assert steps >= 6  # the copy's fsync, the marker's, the renames: each was a place to be killed


def test_a_second_recovery_keeps_the_first_damaged_file(tmp_path):
    path = tmp_path / "chatcli.db"
    ids, _bad = damaged_store(path)
    first = salvage(path)
    assert first.kept_as.name == "chatcli.db.damaged"
    before = digest(first.kept_as)
    second = salvage(path)
    assert second.kept_as.name == "chatcli.db.damaged.2"
    assert digest(first.kept_as) == before  # never overwritten
    assert listed(path) == set(ids)


def test_a_recovery_waits_for_no_one_and_says_who_holds_the_database(tmp_path):
    path = tmp_path / "chatcli.db"
    damaged_store(path)
    store = Store(path)  # a chat that has it open
    with pytest.raises(StoreError, match="in use by another chatcli"):
        salvage(path)
    store.close()
    assert salvage(path).conversations == 12


def killed_half_way(path: Path) -> list[str]:
    """A database whose recovery was killed with the damaged file moved aside and the copy not yet in
    (no `chatcli.db` at all); its conversations' ids."""
    for step in range(1, 100):
        for leftover in path.parent.iterdir():
            if leftover.is_file():
                leftover.unlink()
        ids, _bad = damaged_store(path)
        killed = recover_killed_at(path, step)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        if plan_path(path).exists() and not path.exists():
            return ids
    raise AssertionError("no step left the recovery half done")


def test_a_recovery_whose_copy_was_deleted_by_hand_is_undone(tmp_path):
    path = tmp_path / "chatcli.db"
    ids = killed_half_way(path)
    recovered_path(path).unlink()
    assert listed(path) == set(ids)  # the damaged file back in its place, every conversation in it
    assert not plan_path(path).exists() and kept(tmp_path) == []


def test_history_after_a_killed_recovery_lists_every_conversation_and_says_it_finished(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATCLI_DATA_DIR", str(tmp_path))
    path = tmp_path / "chatcli.db"
    ids = killed_half_way(path)
    history = subprocess.run(
        [sys.executable, "-m", "chatcli", "history"], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert history.returncode == 0, history.stderr
    assert history.stdout.count("\n") == len(ids)
    assert history.stderr.startswith("note: a recovery cut short is finished: recovered 12 conversations")
    assert "Traceback" not in history.stderr


def test_a_recovery_keeps_a_replys_tool_calls(tmp_path):
    from chatcli.chat.conversation import Conversation

    path = tmp_path / "chatcli.db"
    store = Store(path)
    conv = Conversation()
    conv.add_user("the weather?")
    conv.add_reply("", "stop", tool_calls=[{"id": "c1", "name": "weather", "arguments": {"city": "Oslo"}}])
    store.create(conv, "m")
    store.close()
    salvage(path)
    store = Store(path)
    assert store.load(conv.id).messages == conv.messages  # schema 4's `tools` column is copied too
    store.close()
