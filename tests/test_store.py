"""The conversation database: round trip, schema versions, -c in one-shot mode, kill -9 mid-reply."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from chatcli.chat.conversation import Conversation
from chatcli.chat.export import from_export, to_markdown
from chatcli.chat.schema import SCHEMA_VERSION
from chatcli.chat.store import Store, StoreError


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "chatcli.db")
    yield s
    s.close()


def test_round_trip(store):
    c = Conversation(system="Be brief.")
    store.create(c, "tiny")
    store.add_message(c.id, c.add_user("Hello 🙂"))
    store.add_message(c.id, c.add_reply("Hi!", "stop", {"completion_tokens": 2}), {"temperature": 0.0})
    store.add_message(c.id, c.add_user("More"))
    store.add_message(c.id, c.add_reply("Partial", "cancelled", {"completion_tokens": 1}))
    back = store.load(c.id)
    assert back.system == "Be brief." and back.messages == c.messages
    assert store.latest_id() == c.id
    [summary] = store.summaries()
    assert (summary.id, summary.title, summary.model, summary.messages) == (c.id, "Hello 🙂", "tiny", 4)
    sampling = store.db.execute("SELECT sampling FROM messages WHERE role='assistant' ORDER BY id LIMIT 1").fetchone()[
        0
    ]
    assert json.loads(sampling) == {"temperature": 0.0}


def test_rename_delete_and_latest(store):
    a, b = Conversation(), Conversation()
    for c in (a, b):
        store.create(c)
        store.add_message(c.id, c.add_user(f"from {c.id}"))
    store.add_message(a.id, a.add_user("newer"))
    assert store.latest_id() == a.id
    store.rename(b.id, "Renamed")
    assert store.load(b.id).title == "Renamed"
    store.delete(a.id)
    assert store.load(a.id) is None and store.latest_id() == b.id
    assert store.db.execute("SELECT COUNT(*) FROM messages WHERE conversation_id=?", (a.id,)).fetchone()[0] == 0


def test_remove_last_for_undo(store):
    c = Conversation()
    store.create(c)
    for text in ("one", "two", "three"):
        store.add_message(c.id, c.add_user(text))
    store.remove_last(c.id, 2)
    assert [m.content for m in store.load(c.id).messages] == ["one"]


def test_export_import_and_markdown(store):
    c = Conversation(system="sys")
    store.create(c, "tiny")
    store.add_message(c.id, c.add_user("Question"))
    store.add_message(c.id, c.add_reply("Answer", "cancelled"))
    store.add_message(c.id, c.add_user("More"))
    store.add_message(c.id, c.add_reply("Half", "error"))  # a remote stream cut mid-reply
    data = store.export(c.id)
    copy = store.import_export(json.loads(json.dumps(data)))
    assert copy.id != c.id and store.load(copy.id).messages == c.messages
    md = to_markdown(data)
    assert md.startswith("# Question") and "## Assistant *(stopped)*" in md and "Answer" in md
    assert "## Assistant *(cut off)*\n\nHalf" in md
    with pytest.raises(ValueError, match="message 1"):
        from_export({"messages": [{"role": "robot", "content": "x"}]})


def test_newer_schema_is_refused_clearly(tmp_path):
    path = tmp_path / "chatcli.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer chatcli"):
        Store(path)


def test_not_a_database_is_refused_clearly(tmp_path):
    path = tmp_path / "chatcli.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open the conversation database"):
        Store(path)


def test_wal_mode(store):
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.fixture
def cli(tiny_model_dir, tmp_path):
    env = {
        **os.environ,
        "CHATCLI_CONFIG": str(tmp_path / "none.toml"),
        "CHATCLI_DATA_DIR": str(tmp_path / "data"),
    }

    def run(*args, **kw):
        argv = [sys.executable, "-m", "chatcli", "--model", str(tiny_model_dir), "--device", "cpu", *args]
        return subprocess.run(argv, input=b"", capture_output=True, env=env, timeout=120, **kw)

    run.env, run.db, run.tiny = env, tmp_path / "data" / "chatcli.db", tiny_model_dir
    return run


def test_continue_carries_earlier_turns_in_oneshot(cli):
    first = json.loads(cli("-p", "Hello", "--json", "--max-tokens", "4", "--temperature", "0").stdout)
    again = json.loads(cli("-c", "-p", "Again", "--json", "--max-tokens", "4", "--temperature", "0").stdout)
    fresh = json.loads(cli("-p", "Again", "--json", "--max-tokens", "4", "--temperature", "0").stdout)
    assert again["conversation"] == first["conversation"] != fresh["conversation"]
    assert again["stats"]["prompt_tokens"] > first["stats"]["prompt_tokens"] + fresh["stats"]["prompt_tokens"] - 10
    # The first run left its KV cache beside the conversation: the second prefills only the new turn.
    assert again["stats"]["cached_tokens"] >= first["stats"]["prompt_tokens"]
    assert fresh["stats"]["cached_tokens"] == 0
    picked = json.loads(
        cli("--conversation", first["conversation"][:8], "-p", "Third", "--json", "--max-tokens", "2").stdout
    )
    assert picked["conversation"] == first["conversation"]
    history = json.loads(cli("history", "--json").stdout)
    assert [h["messages"] for h in history] == [6, 2]  # most recently updated first
    assert {"id", "title", "updated", "messages"} <= set(history[0])
    exported = json.loads(cli("export", first["conversation"], "--format", "json").stdout)
    assert [m["content"] for m in exported["messages"] if m["role"] == "user"] == ["Hello", "Again", "Third"]


def test_continue_with_no_history_is_one_line(cli):
    result = cli("-c", "-p", "hi")
    assert (
        result.returncode == 1 and result.stderr.decode().strip() == "chatcli: error: no saved conversation to continue"
    )


def test_sigkill_mid_reply_keeps_database_readable(cli, tmp_path):
    cli("-p", "First", "--max-tokens", "3")  # one completed exchange
    script = tmp_path / "slow.py"
    script.write_text(
        "import sys, time\n"
        "import chatcli.engine.decode as e\n"
        "orig = e.pick\n"
        "def slow(*args, **kwargs):\n"
        "    time.sleep(0.05)\n"
        "    return orig(*args, **kwargs)\n"
        "e.pick = slow\n"
        "from chatcli.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    argv = [
        sys.executable,
        str(script),
        "--model",
        str(cli.tiny),
        "--device",
        "cpu",
        "-c",
        "-p",
        "Second",
        "--max-tokens",
        "200",
        "--temperature",
        "1",
        "--top-k",
        "0",
        "--min-p",
        "0",
        "--seed",
        "1",
    ]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli.env)
    assert proc.stdout.read(1)  # the reply is streaming
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    store = Store(cli.db)
    [conversation_id] = [s.id for s in store.summaries()]
    messages = store.load(conversation_id).messages
    # The completed exchange and the sent user message survive; only the reply in flight is lost.
    assert [m.role for m in messages] == ["user", "assistant", "user"]
    assert messages[-1].content == "Second"
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    result = cli("-c", "-p", "Third", "--max-tokens", "2", "--json")  # the next start works
    assert result.returncode == 0, result.stderr


def test_find_takes_a_literal_prefix(store):
    c = Conversation()
    store.create(c)
    assert store.find(c.id[:4]) == c.id
    assert store.find("_") is None and store.find("%") is None  # no LIKE wildcards


def test_write_failure_is_a_store_error(store):
    c = Conversation()
    store.create(c)
    store.db.execute("PRAGMA query_only=ON")  # as good as a read-only disk
    with pytest.raises(StoreError, match="cannot save"):
        store.add_message(c.id, c.add_user("lost?"))


def test_an_id_prefix_of_several_says_so(store):
    from chatcli.chat.saved import NoSuchConversation, not_found, open_saved

    a, b = Conversation(id="ab12"), Conversation(id="ab34")
    for c in (a, b):
        store.create(c)
    assert store.find("ab") is None and store.matching("ab") == ["ab12", "ab34"]
    assert not_found(store, "ab") == "'ab' starts 2 conversation ids (ab12, ab34): give more of it"
    assert not_found(store, "zz") == "no conversation 'zz' (see 'chatcli history')"
    with pytest.raises(NoSuchConversation, match="starts 2 conversation ids"):
        open_saved(store, False, "ab")
    assert open_saved(store, False, "ab3").id == "ab34"
