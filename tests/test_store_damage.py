"""A conversation database with a damaged page: one line naming the file and how to recover it,
never a traceback, and the conversations on intact pages still listed, opened and saved to."""

from __future__ import annotations

import subprocess
import sys

import pytest

from chatcli.chat.conversation import Conversation
from chatcli.chat.manager import Chats, ChatsError
from chatcli.chat.salvage import salvage
from chatcli.chat.store import Store, StoreDamaged, StoreError

MARK = "damage-here"


def damaged_store(path, count: int = 12, hit: int = 5) -> tuple[list[str], str]:
    """A database of `count` conversations whose `hit`-th has the page of its reply overwritten;
    returns (every id, the damaged one's id)."""
    store = Store(path)
    ids = []
    for i in range(count):
        conv = Conversation()
        conv.add_user(f"question {i}")
        conv.add_reply((MARK if i == hit else f"answer {i} ") + "y" * 3000, "stop")
        store.create(conv, "m")
        ids.append(conv.id)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = store.db.execute("PRAGMA page_size").fetchone()[0]
    store.close()
    data = bytearray(path.read_bytes())
    at = data.index(MARK.encode()) // page * page  # the page that holds that reply
    data[at : at + 16] = b"\xff" * 16  # its b-tree header: not a page type SQLite knows
    path.write_bytes(bytes(data))
    return ids, ids[hit]


@pytest.fixture
def damaged(tmp_path):
    path = tmp_path / "chatcli.db"
    ids, bad = damaged_store(path)
    store = Store(path)
    yield store, ids, bad
    store.close()


def test_the_list_goes_around_the_damaged_page(damaged):
    store, ids, bad = damaged
    listed = store.summaries()
    assert sorted(s.id for s in listed) == sorted(ids)  # every conversation is still listed
    hurt = [s.id for s in listed if s.damaged]
    assert bad in hurt and len(hurt) <= 2  # the page may hold the next one's question too
    assert all(s.messages == 2 for s in listed if not s.damaged)
    assert str(store.path) in store.damage and "history --recover" in store.damage


def test_only_the_damaged_conversation_fails_to_open(damaged):
    store, ids, bad = damaged
    hurt = {s.id for s in store.summaries() if s.damaged}
    with pytest.raises(StoreDamaged, match="is damaged .*chatcli history --recover"):
        store.load(bad)
    for other in set(ids) - hurt:
        assert store.load(other).messages[1].content.startswith("answer")
    conv = Conversation()  # and saving goes on
    conv.add_user("after the damage")
    store.create(conv, "m")
    assert store.load(conv.id).messages[0].content == "after the damage"


def test_the_tui_list_keeps_its_store(damaged):
    store, ids, bad = damaged
    failed, told = [], []
    chats = Chats(store, on_store_failed=failed.append, on_store_damaged=told.append)
    assert sorted(r.id for r in chats.rows()) == sorted(ids)
    chats.rows()
    assert len(told) == 1 and "damaged" in told[0]  # said once
    with pytest.raises(ChatsError, match="damaged"):
        chats.by_id(bad)
    assert chats.store is store and not failed  # the others still open and are still saved
    assert chats.by_id(ids[0]).messages


def test_a_search_over_a_damaged_page_is_one_store_error(damaged):
    store, _ids, _bad = damaged
    with pytest.raises(StoreError, match="is damaged"):
        store.search("damage")  # the one match lies on the damaged page


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chatcli", *args], capture_output=True, text=True, timeout=120)


def test_the_commands_say_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATCLI_DATA_DIR", str(tmp_path))
    ids, bad = damaged_store(tmp_path / "chatcli.db")
    listed = cli("history")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("\n") == len(ids) and "damaged" in listed.stdout
    assert listed.stderr.startswith("warning: the conversation database") and "Traceback" not in listed.stderr
    for command in (("export", bad), ("--conversation", bad, "-p", "hi", "--max-tokens", "1")):
        done = cli(*command)
        assert done.returncode == 1
        assert done.stderr.count("\n") == 1 and "is damaged" in done.stderr and "Traceback" not in done.stderr
    kept = cli("export", ids[0])
    assert kept.returncode == 0 and "answer 0" in kept.stdout


def test_recover_keeps_every_readable_row(tmp_path):
    path = tmp_path / "chatcli.db"
    ids, bad = damaged_store(path)
    before = Store(path)
    hurt = {s.id for s in before.summaries() if s.damaged}
    readable = {i: before.load(i).messages for i in set(ids) - hurt}
    before.close()
    done = salvage(path)
    assert done.kept_as.exists() and done.lost >= 1 and done.conversations == len(ids)
    after = Store(path)
    listed = after.summaries()
    assert after.damage is None and not any(s.damaged for s in listed)
    assert sorted(s.id for s in listed) == sorted(ids)  # the damaged one keeps what is left of it
    for i, messages in readable.items():
        assert after.load(i).messages == messages
    assert after.load(bad).messages[0].content == "question 5"  # its reply was on the page
    assert [h.conversation_id for h in after.search("question 7")][:1] == [ids[7]]  # indexed again
    after.close()


def test_recover_from_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATCLI_DATA_DIR", str(tmp_path))
    ids, _bad = damaged_store(tmp_path / "chatcli.db")
    done = cli("history", "--recover")
    assert done.returncode == 0 and done.stdout.startswith(f"recovered {len(ids)} conversations"), done.stderr
    listed = cli("history")
    assert listed.stderr == "" and listed.stdout.count("\n") == len(ids)
