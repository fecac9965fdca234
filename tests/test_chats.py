"""`Chats`, the TUI's conversations apart from any widget: store writes, the list, opening, deleting, files."""

from __future__ import annotations

import json

import pytest

from chatcli.chat.conversation import Conversation
from chatcli.chat.manager import Chats, ChatsError
from chatcli.chat.store import Store
from chatcli.engine.sample.sampling import SamplingParams
from tests.ui.fake import FakeEngine


@pytest.fixture
def chats(tmp_path):
    failures = []
    c = Chats(Store(tmp_path / "chat.db"), budget=1 << 20, on_store_failed=failures.append)
    c.failures = failures
    c.start_pool(FakeEngine())
    yield c
    if c.store is not None:
        c.store.close()


def talk(chats, conv, text="hello"):
    chats.opening(None, conv)
    chats.save_user(conv, conv.add_user(text))
    chats.save_reply(conv, conv.add_reply("hi", "stop", {"completion_tokens": 1}), SamplingParams())


def test_a_conversation_is_created_at_its_first_message_and_listed_newest_first(chats):
    a, b, empty = Conversation(), Conversation(), Conversation()
    talk(chats, a, "first")
    talk(chats, b, "second")
    chats.opening(None, empty)
    rows = chats.rows()
    assert [r.title for r in rows] == ["New conversation", "second", "first"]
    assert rows[0].updated is None and rows[1].model == "fake-model" and rows[1].messages == 2
    assert chats.store.load(a.id).messages[-1].stats == {"completion_tokens": 1}
    assert chats.numbered(3) is a
    with pytest.raises(ChatsError, match="no conversation 4: there are 3"):
        chats.numbered(4)


def test_leaving_an_empty_unsaved_conversation_forgets_it(chats):
    empty, other = Conversation(), Conversation()
    chats.opening(None, empty)
    chats.session_for(empty)
    chats.opening(empty, other)
    assert empty.id not in chats.opened and empty.id not in chats.pool


def test_a_conversation_not_open_is_read_from_the_store(chats, tmp_path):
    saved = Conversation()
    saved.add_user("kept")
    chats.store.create(saved, "m")
    conv = chats.numbered(1)
    assert conv.id == saved.id and conv is not saved and conv.messages[0].content == "kept"


def test_delete_removes_messages_kv_file_and_session(chats):
    conv = Conversation()
    talk(chats, conv)
    chats.session_for(conv)
    path = chats.kv_path(conv)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"kv")
    chats.delete(conv)
    assert not path.exists() and conv.id not in chats.pool and chats.store.load(conv.id) is None
    assert conv.id not in [r.id for r in chats.rows()]


def test_a_failing_store_is_reported_once_and_saving_stops(chats):
    conv = Conversation()
    talk(chats, conv)
    chats.store.db.close()
    chats.save_user(conv, conv.add_user("lost"))
    chats.rename(conv, "still renamed in memory")
    assert len(chats.failures) == 1 and chats.store is None and conv.title == "still renamed in memory"
    assert [r.title for r in chats.rows()] == ["still renamed in memory"]


def test_export_and_import_round_trip_with_one_line_errors(chats, tmp_path):
    conv = Conversation(system="terse")
    talk(chats, conv, "question")
    path = chats.export(conv, str(tmp_path / "c.json"))
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["messages"][0]["content"] == "question" and data["model"] == "fake-model"
    saved = chats.store.export(conv.id)  # /save writes the times `chatcli export` does
    assert (data["created"], data["updated"]) == (saved["created"], saved["updated"]) and data["created"] > 1e9
    assert chats.export(conv, str(tmp_path / "c.md")).read_text(encoding="utf-8").startswith("# question")
    copy = chats.import_file(str(path))
    assert copy.id != conv.id and [m.content for m in copy.messages] == ["question", "hi"]
    assert copy.id in chats.stored
    (tmp_path / "bad.json").write_text("{nope", encoding="utf-8")
    for name, message in [
        (tmp_path / "missing.json", "cannot read"),
        (tmp_path / "bad.json", "bad.json is not a chatcli JSON export .line 1: Expecting property name"),
    ]:
        with pytest.raises(ChatsError, match=message):
            chats.import_file(str(name))
    with pytest.raises(ChatsError, match="cannot write"):
        chats.export(conv, str(tmp_path / "no" / "such" / "dir.json"))


def test_reopen_without_a_database_says_so():
    with pytest.raises(ChatsError, match="no conversation database"):
        Chats(None).reopen(True, None, None)
