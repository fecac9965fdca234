"""Reasoning streams into a folded block above the answer; F8 (or a click) shows it."""

from textual.widgets import Collapsible

from chatcli.ui.widgets.chat_pane import ReplyBox
from tests.ui.conftest import make_app, ready, send
from tests.ui.fake import FakeEngine

THOUGHT = "<think>\nThe user wants the capital of France. That is Paris.\n</think>\n\nThe capital is **Paris**."


async def test_reasoning_is_folded_and_shown_on_a_key():
    app = make_app(FakeEngine(script=lambda _t: THOUGHT, tok_s=400))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "Capital of France?")
        box = screen.pane.query(ReplyBox).last()
        assert box.has_reasoning and box.fold.collapsed
        assert box.markdown.source == "The capital is **Paris**."
        assert box.thinking.source == "The user wants the capital of France. That is Paris."
        assert box.fold.title.startswith("Thought for 10 words")
        assert screen.conversation.messages[-1].content == THOUGHT  # stored whole: the template decides
        await pilot.press("f8")
        assert not box.fold.collapsed
        await pilot.press("f8")
        assert box.fold.collapsed


async def test_a_reply_without_reasoning_has_no_fold():
    app = make_app(FakeEngine())
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "hello")
        box = screen.pane.query(ReplyBox).last()
        assert not box.has_reasoning and box.fold is None and not box.query(Collapsible)
        await pilot.press("f8")
        assert "No reply with reasoning" in screen.pane.children[-1].render().plain


async def test_a_prompt_that_opens_the_reasoning_streams_into_the_fold():
    """DeepSeek-R1 style: the template ends the prompt with <think>; the reply has only </think>."""
    engine = FakeEngine(script=lambda _t: "Weighing it up.\n</think>\n\nYes.", tok_s=400)
    engine.tokenizer.render = lambda messages: "<｜Assistant｜><think>\n"
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "Is it?")
        box = screen.pane.query(ReplyBox).last()
        assert box.has_reasoning and box.thinking.source == "Weighing it up." and box.markdown.source == "Yes."
