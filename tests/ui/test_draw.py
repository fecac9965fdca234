"""What drawing a streaming reply costs (issue 50): the screen is woken in batches, not once a token; the
reply's finished blocks are laid out once and only the last one is drawn again as tokens come; a code
block that names no language is not guessed; the panels update on their own tick, without the chat
pane or a layout of the screen, while the reply's first text is drawn as it comes; no full garbage
collection walks the UI's objects while a reply streams; and at the end the Markdown is the reply's text."""

from __future__ import annotations

import gc
import time
import weakref

from textual.widget import Widget

from chatcli.engine import Finished, SamplingParams
from chatcli.options import StartOptions
from chatcli.ui import live
from chatcli.ui.messages import EventsWaiting, TurnEvent
from chatcli.ui.screens.chat import ChatScreen
from chatcli.ui.widgets.chat_pane import ReplyBox, ReplyFence
from tests.ui.conftest import make_app, ready, send, wait_for
from tests.ui.fake import FakeEngine, split_tokens

BLOCKS = (
    "The first paragraph says what follows.\n\n"
    "```python\ndef twice(x):\n    return 2 * x\n```\n\n"
    "A second paragraph, between the two blocks of code.\n\n"
    "```\nprint(twice(21))\n```\n\n"
)
LAST = "The last paragraph goes on " + "and on " * 30 + "to its end."
REPLY = BLOCKS + LAST
HELD = len(split_tokens(BLOCKS)) + 4  # the stream waits inside the last paragraph


def counting_renders(monkeypatch) -> weakref.WeakKeyDictionary:
    """Every widget's `render_line` calls from now on (each one a line laid out anew, not from its cache)."""
    counts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    render_line = Widget.render_line

    def counted(self, y):
        counts[self] = counts.get(self, 0) + 1
        return render_line(self, y)

    monkeypatch.setattr(Widget, "render_line", counted)
    return counts


def rendered(counts, block) -> int:
    return sum(counts.get(w, 0) for w in (block, *block.walk_children()))


async def test_finished_blocks_are_laid_out_once_and_the_markdown_is_the_reply(monkeypatch):
    counts = counting_renders(monkeypatch)
    engine = FakeEngine(script=lambda _t: REPLY, hold_at=HELD)
    app = make_app(engine, start=StartOptions(params=SamplingParams(max_tokens=500)))
    async with app.run_test(size=(120, 60)) as pilot:  # room for the whole reply: nothing scrolls
        screen = await ready(pilot)
        await send(pilot, "go", wait=False)
        box = screen.pane.query(ReplyBox).last()
        await wait_for(pilot, lambda: "The last" in box.markdown.source)  # the last block is drawn
        await pilot.pause(0.3)
        earlier = list(box.markdown.children)[:-1]
        assert len(earlier) == 4 and all(rendered(counts, b) for b in earlier)  # on screen, laid out
        before = [rendered(counts, b) for b in earlier]
        last_before = rendered(counts, list(box.markdown.children)[-1])
        engine.release.set()
        await wait_for(pilot, lambda: screen.turns_done == 1)
        await pilot.pause(0.3)
        assert list(box.markdown.children)[:-1] == earlier  # the same widgets
        assert [rendered(counts, b) for b in earlier] == before  # not one line of them laid out again
        assert rendered(counts, list(box.markdown.children)[-1]) > last_before  # the last block was
        assert box.markdown.source == REPLY == screen.conversation.messages[-1].content


async def test_the_screen_is_woken_in_batches_not_once_a_token(monkeypatch):
    posted: list[str] = []
    post = ChatScreen.post_message

    def counted(self, message):
        if isinstance(message, TurnEvent | EventsWaiting):
            posted.append(type(message).__name__)
        return post(self, message)

    monkeypatch.setattr(ChatScreen, "post_message", counted)
    words = " ".join(f"w{i}" for i in range(600))
    app = make_app(FakeEngine(script=lambda _t: words), start=StartOptions(params=SamplingParams(max_tokens=1000)))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "go")
        assert screen.conversation.messages[-1].content == words
        assert len(posted) <= 2  # its start and its end; the tokens are taken at the draw ticks


async def test_a_code_block_without_a_language_is_plain_text_not_guessed(monkeypatch):
    import textual.highlight

    guessed: list[str] = []
    monkeypatch.setattr(textual.highlight, "guess_language", lambda code, path=None: guessed.append(code) or "text")
    app = make_app(FakeEngine(script=lambda _t: "Run it:\n\n```\nfor i in range(3):\n    print(i)\n```"))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "go")
        fence = screen.pane.query(ReplyBox).last().markdown.query_one(ReplyFence)
        assert "for i in range(3):" in str(fence._highlighted_code)
        assert guessed == []  # pygments' guess: every lexer's analysis, at each draw of the block


async def test_the_panels_update_on_their_own_tick_without_laying_out_the_screen(monkeypatch):
    from textual.screen import Screen

    monkeypatch.setattr(live.DrawPace, "due", lambda self: False)  # drawing the reply never comes due
    layouts = []
    refresh_layout = Screen._refresh_layout
    monkeypatch.setattr(
        Screen, "_refresh_layout", lambda self, *a, **k: layouts.append(1) or refresh_layout(self, *a, **k)
    )
    words = " ".join(f"w{i}" for i in range(40))
    app = make_app(FakeEngine(script=lambda _t: words, tok_s=25))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "go", wait=False)
        tokens = lambda: int(screen.panels.values["tokens"]) if screen.panels.values["tokens"] != "–" else 0  # noqa: E731
        await wait_for(pilot, lambda: tokens() >= 5)  # the panels go on
        box = screen.pane.query(ReplyBox).last()
        first = box.markdown.source
        assert box.markdown.appends == 1 and words.startswith(first) and first  # the first text: drawn at once
        before = len(layouts)
        await wait_for(pilot, lambda: tokens() >= 25)  # a few of their ticks later, each with new figures
        assert box.markdown.appends == 1 and box.markdown.source == first  # the chat pane was not touched again
        assert len(layouts) == before  # nor the screen laid out (the status bar's line is its container's size)
        await wait_for(pilot, lambda: screen.turns_done == 1)
        assert box.markdown.source == words  # the end writes it all


async def test_a_turn_s_end_taken_in_at_the_draw_tick_ends_the_turn(monkeypatch):
    """On a busy machine the draw tick may take the turn's `Finished` in before the wake-up that came with
    it: the turn ends all the same (ending it stops the tick, which must not cancel the end's own work)."""
    app = make_app(FakeEngine(script=lambda _t: "one two three"))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        put = screen.inbox.put
        monkeypatch.setattr(
            screen.inbox, "put", lambda item, wake=False: put(item)
        )  # never a wake-up: the tick takes all
        await send(pilot, "count")
        assert screen.conversation.messages[-1].content == "one two three"
        assert "stopped" not in str(screen.pane.query(ReplyBox).last().note.render())
        await send(pilot, "again")  # and the next turn runs
        assert screen.turns_done == 2


async def test_no_full_garbage_collection_walks_the_ui_while_a_reply_streams():
    words = " ".join(f"w{i}" for i in range(30))
    app = make_app(FakeEngine(script=lambda _t: words, tok_s=60))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        assert gc.get_freeze_count() == 0
        await send(pilot, "go", wait=False)
        await wait_for(pilot, lambda: screen.live.tokens >= 3)
        assert gc.get_freeze_count() > 10_000  # what was alive at the turn's start: left out of collections
        await wait_for(pilot, lambda: screen.turns_done == 1)
        assert gc.get_freeze_count() == 0  # and given back to the collector at its end


async def three_tokens_made(pilot) -> ChatScreen:
    """The chat screen once a turn asked for has made three tokens (taken in, or waiting for the tick)."""
    screen = await ready(pilot)
    await send(pilot, "count", wait=False)
    await wait_for(pilot, lambda: len(screen.inbox._items) + screen.live.tokens >= 3)
    return screen


async def test_esc_draws_what_came_before_it_at_once_not_at_the_next_tick(monkeypatch):
    from chatcli.ui.screens import chat

    monkeypatch.setattr(chat, "TICK_S", 30.0)  # no draw tick comes during the test
    engine = FakeEngine(script=lambda _t: "one two three four five six", hold_at=3, tok_s=20)
    generate = engine.generate

    def slow_to_end(*args, **kwargs):  # the turn's end comes a second after the cancel: it draws nothing here
        for event in generate(*args, **kwargs):
            if isinstance(event, Finished):
                time.sleep(1.0)
            yield event

    engine.generate = slow_to_end
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await three_tokens_made(pilot)
        box = screen.pane.query(ReplyBox).last()
        drawn = box.markdown.source  # the first token, drawn as it came; the others wait for the tick
        assert drawn and drawn != "one two three" and "one two three".startswith(drawn)
        await pilot.press("escape")
        await wait_for(pilot, lambda: box.markdown.source == "one two three")
        assert screen.busy and screen.turns_done == 0  # before the turn's end
        await wait_for(pilot, lambda: screen.turns_done == 1)


async def test_tokens_the_model_made_after_esc_are_drawn_as_they_come_not_at_the_next_tick(monkeypatch):
    """The cancel reaches the model a step or two late (the generation process reads it between steps): the
    tokens it made meanwhile wake the screen and are drawn as they come, so the reply stops growing on screen
    within a step of the model's stop, not up to a tick (100 ms) later."""
    import threading

    from chatcli.engine import Token
    from chatcli.ui.screens import chat

    monkeypatch.setattr(chat, "TICK_S", 30.0)  # no draw tick comes during the test
    engine = FakeEngine(script=lambda _t: "one two three four five six seven eight nine ten", tok_s=20)
    generate = engine.generate
    made: list[str] = []  # what the model wrote
    reached = threading.Event()  # the cancel, as the model sees it: three tokens after Esc

    def late(messages, session, params=None, cancel=None):
        after = 0
        for event in generate(messages, session, params, reached):
            if isinstance(event, Finished):
                time.sleep(1.0)  # the turn's end (which draws everything) comes a second later
            if isinstance(event, Token):
                made.append(event.text)
            yield event
            if isinstance(event, Token) and cancel.is_set():
                after += 1
                if after == 3:
                    reached.set()

    engine.generate = late
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await three_tokens_made(pilot)
        await pilot.press("escape")
        box = screen.pane.query(ReplyBox).last()
        await wait_for(pilot, lambda: reached.is_set() and box.markdown.source == "".join(made))
        assert screen.busy and screen.turns_done == 0  # drawn before the turn's end, with no tick
        await wait_for(pilot, lambda: screen.turns_done == 1)
        assert screen.conversation.messages[-1].content == "".join(made)
