"""A 2,000-token reply at 1,000 tok/s: the Markdown is re-rendered a bounded number of times
(the UI tick batches tokens), and a keypress during the stream is handled while it streams."""

import asyncio

from markdown_it import MarkdownIt

from chatcli.engine.sample.sampling import SamplingParams
from chatcli.options import StartOptions
from chatcli.ui.widgets.chat_pane import ReplyBox
from tests.ui.conftest import make_app, press_now, ready, wait_for
from tests.ui.fake import FakeEngine

TOKENS = 2000


def long_reply(_text: str) -> str:
    words = [f"w{i}" for i in range(TOKENS)]
    # paragraphs and a code block, so the Markdown has several blocks to extend
    return "".join(("\n\n" if i % 100 == 99 else " ") + w for i, w in enumerate(words)).strip()


async def test_a_fast_long_stream_is_batched_and_keys_stay_responsive(monkeypatch):
    made = []  # the Markdown parsers built while the reply streams (each is 0.4 ms of set-up)
    init = MarkdownIt.__init__
    monkeypatch.setattr(MarkdownIt, "__init__", lambda self, *a, **k: (made.append(1), init(self, *a, **k))[1])
    engine = FakeEngine(script=long_reply, tok_s=1000)
    app = make_app(engine, start=StartOptions(params=SamplingParams(max_tokens=4 * TOKENS)))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        screen.prompt.load_text("go")
        press_now(app, "enter")
        await wait_for(pilot, lambda: 300 <= screen.live.tokens)
        box = screen.pane.query(ReplyBox).last()
        # A key from the terminal (pilot.press would wait for an idle loop, i.e. the stream's end).
        frames_before = box.markdown.appends
        press_now(app, "x", "x")
        while screen.prompt.text != "x":
            await asyncio.sleep(0.002)
        frames = box.markdown.appends - frames_before
        assert screen.busy and screen.live.tokens < TOKENS  # handled mid-stream
        assert frames <= 2  # within a frame or two of the UI tick
        await wait_for(pilot, lambda: screen.turns_done == 1, timeout=60)
        assert box.markdown.source == long_reply("")
        assert screen.conversation.messages[-1].stats["completion_tokens"] == TOKENS
        # one append per UI tick at most (10 Hz over ~2 s, plus the final flush), never one per token
        assert 1 <= box.markdown.appends <= TOKENS // 10
        assert len(made) <= 1 < box.markdown.appends  # one parser for all the appends, not one each


async def test_the_prefill_starts_after_the_frame_that_shows_the_question(monkeypatch):
    """The turn's generation begins once the screen has laid out the question and the reply's box, so that their
    layout does not take a core from the prefill: the box has its place when the turn's worker is started."""
    from chatcli.ui.screens.chat import ChatScreen

    seen = []
    start = ChatScreen._generate

    def generate(self, *args, **kwargs):
        seen.append(self.pane.query(ReplyBox).last().region.height)
        return start(self, *args, **kwargs)

    monkeypatch.setattr(ChatScreen, "_generate", generate)
    app = make_app(FakeEngine(script=lambda _text: "Hello there.", tok_s=1000))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        screen.prompt.load_text("hi")
        press_now(app, "enter")
        await wait_for(pilot, lambda: screen.turns_done == 1, timeout=30)
        assert len(seen) == 1 and seen[0] > 0
        assert screen.pane.query(ReplyBox).last().markdown.source == "Hello there."
