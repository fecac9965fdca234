"""Ctrl+C on the one-shot, as a user sends it (a real SIGINT to the process) while the reply streams: the
reply so far is printed (`--json`: one object with `finish_reason: "cancelled"`), `--stats` still
prints its line, the reply is saved as stopped, and the exit is 130. The scripted engine
(tests/mcp_fake.py) streams slowly here, so the signal lands mid-reply."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chatcli.chat.store import Store

ROOT = Path(__file__).parent.parent
LONG = " ".join(f"word{i}" for i in range(400))  # echoed back: 401 tokens, 20 s at 20 tok/s


def interrupted(tmp_path: Path, *args: str, module: str = "tests.mcp_fake", env: dict | None = None):
    """Run the one-shot, wait until its prompt is saved (the engine took it: the reply streams), then
    a little more, and send SIGINT: (exit code, stdout, stderr, the saved conversation)."""
    env = {
        **os.environ,
        "CHATCLI_CONFIG": str(tmp_path / "none.toml"),
        "CHATCLI_DATA_DIR": str(tmp_path),
        "CHATCLI_FAKE_TOK_S": "20",
        **(env or {}),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # an ignored SIGINT would be inherited
    )
    try:
        deadline = time.monotonic() + 120
        while not _saved(tmp_path):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the prompt was never taken"
            time.sleep(0.05)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    store = Store(tmp_path / "chatcli.db")
    [conversation] = [store.load(s.id) for s in store.summaries()]
    store.close()
    return proc.returncode, out.decode(), err.decode(), conversation


def _saved(folder: Path) -> bool:
    """Whether the one-shot has saved its prompt: read-only, never creating or migrating the database
    the process writes."""
    path = folder / "chatcli.db"
    if not path.exists():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            return db.execute("SELECT count(*) FROM messages").fetchone()[0] > 0
    except sqlite3.Error:  # not created yet
        return False


def test_ctrl_c_with_json_prints_the_cancelled_reply_and_stats(tmp_path):
    code, out, err, saved = interrupted(tmp_path, "-p", LONG, "--json", "--stats")
    assert code == 130, err
    assert "Traceback" not in err
    record = json.loads(out)
    assert record["finish_reason"] == "cancelled"
    assert f"You said: {LONG}".startswith(record["reply"]) and 0 < len(record["reply"]) < len(LONG)
    assert 0 < record["stats"]["completion_tokens"] < 401
    [line] = err.splitlines()
    assert line.startswith("ttft ") and f"· {record['stats']['completion_tokens']} tokens" in line
    reply = saved.messages[-1]
    assert (reply.role, reply.finish_reason, reply.content) == ("assistant", "cancelled", record["reply"])


def test_ctrl_c_prints_the_reply_so_far_and_the_stats_line(tmp_path):
    code, out, err, saved = interrupted(tmp_path, "-p", LONG, "--stats")
    assert code == 130, err
    assert out.endswith("\n") and f"You said: {LONG}".startswith(out.rstrip("\n"))
    [line] = err.splitlines()
    assert line.startswith("ttft ") and "tokens" in line
    assert saved.messages[-1].finish_reason == "cancelled" and saved.messages[-1].content == out.rstrip("\n")


@pytest.mark.real_model
def test_ctrl_c_with_json_on_the_embedded_model(tmp_path):
    args = ("-p", "Write a very long essay about rivers.", "--max-tokens", "3000", "--temperature", "0")
    code, out, err, saved = interrupted(tmp_path, *args, "--json", module="chatcli")
    assert code == 130 and "Traceback" not in err, err
    record = json.loads(out)
    assert record["finish_reason"] == "cancelled" and record["reply"]
    assert saved.messages[-1].content == record["reply"]
