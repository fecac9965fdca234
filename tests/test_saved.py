"""What sits below the front ends: one-line errors, reopening a saved conversation, the KV file policy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from chatcli.chat.conversation import Conversation
from chatcli.chat.saved import NoSuchConversation, kv_path, open_saved, save_kv
from chatcli.chat.store import Store
from chatcli.errors import UserError, one_line


def test_one_line_is_the_first_line_or_the_type():
    assert one_line(ValueError("first\nsecond")) == "first"
    assert one_line(ValueError("  \n padded \n")) == "padded"
    assert one_line(KeyError()) == "KeyError"
    assert UserError("x", 2).code == 2 and str(UserError("x")) == "x"


def test_the_cli_reexports_the_one_user_error():
    from chatcli import cli

    assert cli.UserError is UserError


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "chat.db")
    yield s
    s.close()


def test_open_saved_picks_the_latest_or_a_prefix_and_says_when_none(store):
    with pytest.raises(NoSuchConversation, match="no saved conversation to continue"):
        open_saved(store, True, None)
    a, b = Conversation(system="old"), Conversation()
    store.create(a)
    store.create(b)
    assert open_saved(store, True, None).id == b.id
    assert open_saved(store, False, a.id[:6]).id == a.id
    with pytest.raises(NoSuchConversation, match="no conversation 'zzz'"):
        open_saved(store, False, "zzz")


def test_a_given_system_prompt_replaces_the_saved_one_in_the_store_too(store):
    c = Conversation(system="old")
    store.create(c)
    assert open_saved(store, False, c.id).system == "old"
    assert open_saved(store, False, c.id, system="new").system == "new"
    assert store.load(c.id).system == "new"


def test_the_kv_file_lives_beside_the_database(store):
    assert kv_path(store, "abc") == store.path.parent / "kv" / "abc.safetensors"


class DiskFull:
    def save_session(self, session, path):
        raise OSError(28, "No space left on device")


class Saves:
    def save_session(self, session, path):
        return True


def test_save_kv_says_why_it_did_not_save_instead_of_hiding_it(tmp_path):
    assert save_kv(DiskFull(), None, tmp_path / "x") == "[Errno 28] No space left on device"
    assert save_kv(Saves(), None, tmp_path / "x") is None


@pytest.mark.parametrize(
    "module, unwanted",
    [
        ("chatcli.oneshot", "chatcli.cli"),
        ("chatcli.ui.screens.chat", "chatcli.oneshot"),
        ("chatcli.ui.screens.chat", "chatcli.cli"),
        ("chatcli.chat.manager", "textual"),
        ("chatcli.engine.events", "torch"),
        ("chatcli.ui.live", "textual"),
    ],
)
def test_no_module_imports_what_sits_above_or_beside_it(module, unwanted):
    code = f"import sys, {module}; sys.exit(int({unwanted!r} in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, f"{module} imports {unwanted}"
