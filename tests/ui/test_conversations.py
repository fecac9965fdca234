"""Many conversations in the TUI: saved as they happen, each with its own session in the pool."""

import json
import sqlite3

from chatcli.chat.conversation import Conversation
from chatcli.chat.store import Store
from chatcli.engine.sample.sampling import SamplingParams
from chatcli.options import StartOptions
from chatcli.ui.format import human_bytes
from chatcli.ui.screens.confirm import Confirm
from chatcli.ui.widgets.chat_pane import ReplyBox, UserMessage
from tests.ui.conftest import command, make_app, ready, send, wait_for
from tests.ui.fake import FakeEngine


def stored(conversation_id):
    store = Store()
    try:
        return store.load(conversation_id)
    finally:
        store.close()


def row_number(screen, conversation_id) -> int:
    ids = [r.id for r in screen.chats.rows()]
    return ids.index(conversation_id) + 1


def notifications(app) -> list[str]:
    return [n.message for n in app._notifications]


async def test_every_message_is_saved_with_its_stats_and_sampling():
    app = make_app(start=StartOptions(params=SamplingParams(temperature=0.25, seed=7)))
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "first")
        await send(pilot, "second")
        cid = screen.conversation.id
        saved = stored(cid)
        assert [(m.role, m.content) for m in saved.messages] == [
            (m.role, m.content) for m in screen.conversation.messages
        ]
        assert saved.messages[-1].stats == screen.conversation.messages[-1].stats
        assert saved.messages[-1].finish_reason == "stop"
        db = sqlite3.connect(Store().path)
        rows = db.execute("SELECT role, sampling FROM messages WHERE conversation_id=? ORDER BY id", (cid,)).fetchall()
        assert [r[0] for r in rows] == ["user", "assistant"] * 2
        assert (
            rows[0][1] is None and json.loads(rows[1][1])["temperature"] == 0.25 and json.loads(rows[3][1])["seed"] == 7
        )
        assert Store().summaries()[0].model == "fake-model"


async def test_a_stopped_reply_is_saved_as_cancelled():
    engine = FakeEngine(script=lambda _t: "one two three four", hold_at=2)
    app = make_app(engine)
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "go", wait=False)
        await wait_for(pilot, lambda: screen.live.tokens == 2)
        assert [m.role for m in stored(screen.conversation.id).messages] == ["user"]  # the prompt, at once
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.turns_done == 1)
        last = stored(screen.conversation.id).messages[-1]
        assert (last.role, last.content, last.finish_reason) == ("assistant", "one two", "cancelled")


async def test_undo_retry_and_system_update_the_store():
    replies = iter(["a1", "a2", "a3", "a4"])
    app = make_app(FakeEngine(script=lambda _t: next(replies)))
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "q1")
        await send(pilot, "q2")
        cid = screen.conversation.id
        await command(pilot, "/undo")
        assert [m.content for m in stored(cid).messages] == ["q1", "a1"]
        await command(pilot, "/retry")
        await wait_for(pilot, lambda: not screen.busy and screen.turns_done == 3)
        await pilot.pause()
        assert [m.content for m in stored(cid).messages] == ["q1", "a3"]
        await command(pilot, "/system Be terse.")
        assert stored(cid).system == "Be terse."


async def test_new_and_switch_back_reuse_that_conversations_cache():
    engine = FakeEngine()
    app = make_app(engine)
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "alpha")
        first, first_session = screen.conversation, screen.session
        resident = len(first_session.cache)
        await pilot.press("ctrl+n")
        assert screen.conversation is not first and screen.conversation.messages == []
        assert not screen.pane.query(UserMessage)
        await send(pilot, "beta")
        assert engine.calls[-1]["cached"] == 0 and screen.session is not first_session
        note = await command(pilot, f"/switch {row_number(screen, first.id)}")
        assert note.text == "conversation 2: alpha" and screen.conversation is first
        assert [u.text for u in screen.pane.query(UserMessage)] == ["alpha"]
        assert [b.markdown.source for b in screen.pane.query(ReplyBox)] == ["You said: **alpha**"]
        assert screen.session is first_session
        await send(pilot, "gamma")
        assert engine.calls[-1]["cached"] == resident  # only the new turn was prefilled
        assert screen.last_stats.cached_tokens == resident
        assert len(engine.calls[-1]["messages"]) == 3
        assert screen.panels.values["resident"] == "2 conversations"
        assert (await command(pilot, "/switch 9")).text == "no conversation 9: there are 2 (F3 shows them)"


async def test_no_switching_while_a_reply_streams():
    engine = FakeEngine(hold_at=1)
    app = make_app(engine)
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        other = screen.conversation
        await command(pilot, "/new")  # an empty conversation: it leaves no trace when left
        assert other.id not in [r.id for r in screen.chats.rows()] and other.id not in screen.chats.pool
        await send(pilot, "go", wait=False)
        await wait_for(pilot, lambda: screen.live.tokens == 1)
        current = screen.conversation
        for line in ("/new", "/switch 1", "/delete", "/load x.json"):
            note = await command(pilot, line)
            assert note.has_class("-error") and "press Esc" in note.text
        await pilot.press("ctrl+n")
        assert screen.conversation is current
        engine.release.set()
        await wait_for(pilot, lambda: screen.turns_done == 1)
        assert screen.conversation.messages[-1].role == "assistant"


async def test_sidebar_lists_switches_by_click_and_keys():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "first topic")
        first = screen.conversation
        await pilot.press("ctrl+n")
        await send(pilot, "second topic")
        second = screen.conversation
        await pilot.press("f3")
        assert screen.sidebar.is_open and screen.sidebar.display
        titles = [r.title for r in screen.sidebar.rows]
        assert titles == ["second topic", "first topic"]
        assert all(r.model == "fake-model" and r.messages == 2 for r in screen.sidebar.rows)
        assert screen.sidebar.list.has_focus
        await pilot.press("ctrl+n")  # from the sidebar: the prompt gets the focus back
        assert screen.prompt.has_focus and screen.sidebar.rows[0].title == "New conversation"
        await pilot.press("f3", "f3")
        assert screen.sidebar.list.has_focus and len(screen.sidebar.rows) == 3
        await pilot.press("down", "down", "enter")  # keys: the third row, from the new one on top
        assert screen.conversation is first and screen.prompt.has_focus
        assert [r.title for r in screen.sidebar.rows] == ["second topic", "first topic"]  # the empty one is gone
        await pilot.click("#conversations", offset=(5, 1))  # a click on the first row (below the border)
        await wait_for(pilot, lambda: screen.conversation is second)
        await pilot.press("f3")
        assert not screen.sidebar.display


async def test_rename_shows_in_the_sidebar_and_the_store():
    app = make_app()
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "a long first message")
        note = await command(pilot, "/rename Trip plans")
        assert note.text == "renamed: Trip plans"
        assert screen.sidebar.rows[0].title == "Trip plans"
        assert Store().summaries()[0].title == "Trip plans"


async def test_delete_asks_first_and_then_removes_everything():
    app = make_app()
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "keep me?")
        cid = screen.conversation.id
        await command(pilot, "/delete")
        assert isinstance(app.screen, Confirm) and "keep me?" in app.screen.question
        await pilot.press("enter")  # the focused button is Cancel
        await pilot.pause()
        assert not isinstance(app.screen, Confirm) and stored(cid) is not None
        assert screen.pane.notes()[-1].text == "kept the conversation"
        await command(pilot, "/delete")
        await pilot.press("y")
        await pilot.pause()
        assert stored(cid) is None and screen.conversation.id != cid
        assert cid not in screen.chats.pool and screen.conversation.messages == []
        assert screen.pane.notes()[-1].text == "deleted: keep me?"
        assert cid not in [r.id for r in screen.chats.rows()]


async def test_save_and_load_round_trip(tmp_path):
    app = make_app()
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await command(pilot, "/system Speak plainly.")
        await send(pilot, "what is 2+2?")
        original = screen.conversation
        md, js = tmp_path / "chat.md", tmp_path / "chat.json"
        assert (await command(pilot, f"/save {md}")).text == f"saved 2 messages to {md}"
        await command(pilot, f"/save {js}")
        text = md.read_text()
        assert text.startswith("# what is 2+2?") and "## Assistant" in text and "You said: **what is 2+2?**" in text
        data = json.loads(js.read_text())
        assert data["system"] == "Speak plainly." and len(data["messages"]) == 2
        note = await command(pilot, f"/load {js}")
        assert note.text == f"loaded 2 messages from {js} as a new conversation"
        loaded = screen.conversation
        assert loaded.id != original.id and loaded.system == "Speak plainly."
        assert [(m.role, m.content) for m in loaded.messages] == [(m.role, m.content) for m in original.messages]
        assert [(m.role, m.content) for m in stored(loaded.id).messages] == [
            (m.role, m.content) for m in loaded.messages
        ]
        assert [u.text for u in screen.pane.query(UserMessage)] == ["what is 2+2?"]
        bad = tmp_path / "bad.json"
        bad.write_text('{"messages": [{"role": "robot", "content": "x"}]}')
        for arg, fragment in [
            (bad, "message 1 needs a role"),
            (md, "is not a chatcli JSON export (line 1: Expecting value); /save NAME.json"),
            (tmp_path / "none.json", "cannot read"),
        ]:
            note = await command(pilot, f"/load {arg}")
            assert note.has_class("-error") and fragment in note.text and "\n" not in note.text
        note = await command(pilot, f"/save {tmp_path / 'no' / 'dir' / 'x.md'}")
        assert note.has_class("-error") and "cannot write" in note.text
        assert screen.conversation is loaded


async def test_an_evicted_conversation_prefills_again():
    engine = FakeEngine()
    one_turn = len(engine.tokenizer.encode_chat([{"role": "user", "content": "aaaa"}])) + len("You said: **aaaa**")
    budget = int(one_turn * 2048 * 1.5)  # room for one conversation's cache, not two
    app = make_app(engine, start=StartOptions(cache_budget_bytes=budget))
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "aaaa")
        first = screen.conversation
        assert screen.chats.pool.budget_bytes == budget and first.id in screen.chats.pool
        await command(pilot, "/new")
        await send(pilot, "bbbb")
        assert first.id not in screen.chats.pool and screen.chats.pool.evictions == 1
        assert screen.panels.values["resident"] == "1 conversation"
        assert screen.panels.values["pool"] == f"{human_bytes(screen.chats.pool.nbytes)} / {human_bytes(budget)}"
        await command(pilot, f"/switch {row_number(screen, first.id)}")
        assert len(screen.session.cache) == 0
        await send(pilot, "cccc")
        assert engine.calls[-1]["cached"] == 0 and screen.last_stats.cached_tokens == 0
        assert screen.panels.values["prompt"].startswith("0 cached")
        assert len(engine.calls[-1]["messages"]) == 3  # the history was prefilled again


def saved_conversation(text="earlier question") -> Conversation:
    store = Store()
    conv = Conversation(system="Old system.")
    conv.add_user(text)
    conv.add_reply("earlier answer", "stop", {"completion_tokens": 2, "decode_tok_s": 10.0})
    store.create(conv, "fake-model")
    store.close()
    return conv


async def test_continue_reopens_the_latest_conversation():
    older = saved_conversation("older one")
    latest = saved_conversation()
    engine = FakeEngine()
    app = make_app(engine, start=StartOptions(continue_last=True))
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        assert screen.conversation.id == latest.id
        assert [u.text for u in screen.pane.query(UserMessage)] == ["earlier question"]
        assert "2 tokens · 10.0 tok/s" in str(screen.pane.query(ReplyBox).first().note.render())
        await send(pilot, "and now?")
        assert [m["content"] for m in engine.calls[-1]["messages"]] == [
            "Old system.",
            "earlier question",
            "earlier answer",
            "and now?",
        ]
        assert len(stored(latest.id).messages) == 4 and len(stored(older.id).messages) == 2


async def test_conversation_id_picks_one_and_a_wrong_one_says_so():
    older = saved_conversation("older one")
    saved_conversation()
    app = make_app(start=StartOptions(conversation=older.id[:6], system="New system.", system_given=True))
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        assert screen.conversation.id == older.id and screen.conversation.system == "New system."
        assert stored(older.id).system == "New system."
    app = make_app(start=StartOptions(conversation="nope"))
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        note = screen.pane.notes()[0]
        assert note.has_class("-error") and note.text == "no conversation 'nope' (see 'chatcli history')"
        assert screen.conversation.messages == []


async def test_a_database_from_a_newer_chatcli_is_an_error_and_the_app_keeps_working(isolated_dirs):
    path = isolated_dirs / "data" / "chatcli.db"
    path.parent.mkdir(parents=True)
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    app = make_app()
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        assert screen.chats.store is None
        assert any("newer chatcli" in m and "not saved" in m for m in notifications(app))
        await send(pilot, "still works")
        await pilot.press("ctrl+n")
        await send(pilot, "and again")
        assert [r.title for r in screen.chats.rows()] == ["and again", "still works"]
        assert (await command(pilot, "/switch 2")).text == "conversation 2: still works"


async def test_a_store_that_fails_mid_session_is_reported_once():
    app = make_app()
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "saved")
        screen.chats.store.db.close()  # the next write fails
        await send(pilot, "not saved")
        assert screen.chats.store is None
        assert sum("not saved from now on" in m for m in notifications(app)) == 1
        assert screen.conversation.messages[-1].content == "You said: **not saved**"


async def test_quitting_mid_reply_saves_what_was_streamed_as_stopped():
    engine = FakeEngine(script=lambda _t: "one two three four", hold_at=2)
    app = make_app(engine)
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "go", wait=False)
        await wait_for(pilot, lambda: screen.live.tokens == 2)
        cid = screen.conversation.id
        await pilot.press("ctrl+q")
        await pilot.pause()
    assert not app.is_running
    messages = stored(cid).messages
    assert [(m.role, m.content, m.finish_reason) for m in messages] == [
        ("user", "go", None),
        ("assistant", "one two", "cancelled"),
    ]


async def test_switching_while_the_model_loads_keeps_the_loading_line():
    import threading

    from chatcli.ui.app import ChatApp
    from chatcli.ui.widgets.chat_pane import LoadingLine

    saved_conversation()
    gate = threading.Event()
    engine = FakeEngine()

    def slow_factory(status=None):
        gate.wait(10)
        return engine

    app = ChatApp(StartOptions(), engine_factory=slow_factory)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chat_screen is not None and app.chat_screen.loading_line is not None)
        screen = app.chat_screen
        note = await command(pilot, "/switch 2")  # 1 is the new, empty one on screen
        assert note.text == "conversation 2: earlier question"
        assert screen.query(LoadingLine) and [u.text for u in screen.pane.query(UserMessage)] == ["earlier question"]
        gate.set()
        await wait_for(pilot, lambda: screen.engine is not None and not screen.query(LoadingLine))
        await send(pilot, "next")
        assert len(engine.calls[-1]["messages"]) == 4


async def test_sidebar_rows_fit_its_width_and_typing_goes_to_the_prompt():
    import time

    from chatcli.chat.manager import Row

    app = make_app()
    async with app.run_test(size=(100, 24)) as pilot:
        screen = await ready(pilot)
        await pilot.press("f3")
        title = "A fairly long conversation title about many things"
        rows = [Row(f"id{i}", title, time.time(), "SmolLM2-135M-Instruct.Q4_1.gguf", 12, i % 3 == 0) for i in range(30)]
        screen.sidebar.show_rows(rows, "id0", set())  # more than fit: a scrollbar
        await pilot.pause()
        await pilot.pause()
        listing = screen.sidebar.list
        width = listing.scrollable_content_region.width
        for i in range(len(rows)):
            lines = listing.get_option_at_index(i).prompt.split("\n")
            assert len(lines) == 2 and all(line.cell_len <= width for line in lines), (width, lines)
        assert listing.has_focus
        await pilot.press("h", "i")
        assert screen.prompt.has_focus and screen.prompt.text == "hi"  # nothing typed is lost


async def test_a_sentence_typed_fast_into_the_sidebar_goes_to_the_prompt_and_enter_sends_it():
    """Keys typed fast after F3 reach the list before the prompt has the focus: each character, the
    spaces too, goes to the prompt, and the Enter after them sends the message rather than opening the
    highlighted conversation."""
    from textual import events

    app = make_app()
    async with app.run_test(size=(100, 24)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "first topic")
        await pilot.press("f3")
        listing = screen.sidebar.list
        assert listing.has_focus
        opened = screen.conversation.id
        for key, char in [("x", "x"), ("space", " "), ("y", "y"), ("enter", None)]:
            listing.post_message(events.Key(key, char))  # all queued on the list, as a fast typist's are
        await wait_for(pilot, lambda: screen.conversation.messages[-1:] and screen.turns_done == 2)
        assert screen.conversation.id == opened
        assert [m.content for m in screen.conversation.messages if m.role == "user"][-1] == "x y"
