"""No escape sequence a model, a tool or a saved message wrote reaches the terminal through the TUI: the
chat pane, a tool call's box and its question show the text with its control characters written out
(`errors.shown`), and no segment Textual renders holds a control character (Textual passes ESC and the
C1 controls through, where they would act on the terminal); the conversation keeps the text exact."""

from __future__ import annotations

import json

from chatcli.errors import shown
from chatcli.ui.screens.allow_tool import AllowTool
from chatcli.ui.widgets.tool_call import ToolCallBox
from tests.mcp_fake import ToolEngine
from tests.test_escapes import EVIL, SHOWN
from tests.ui.conftest import make_app, ready, send, wait_for
from tests.ui.fake import FakeEngine
from tests.ui.test_mcp_tools import tiny, with_tools


def screen_text(app) -> str:
    """Every character of every segment the screen renders now: what Textual writes to the terminal,
    its own styling and cursor moves aside."""
    update = app.screen._compositor.render_full_update()
    return "".join(segment.text for strip in update.strips for segment in strip)


def assert_no_control(text: str) -> None:
    bad = sorted({c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0})
    assert not bad, bad


async def test_a_reply_a_prompt_and_a_saved_reply_show_their_escapes_written_out():
    app = make_app(FakeEngine(script=lambda text: f"{EVIL} and **bold**"))
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await ready(pilot)
        await send(pilot, f"say {EVIL}")
        await pilot.pause()
        screen.pane.add_saved_reply(f"<think>{EVIL}</think>{EVIL}", f"note {EVIL}", 3)
        await pilot.pause()
        text = screen_text(app)
        assert_no_control(text)
        assert text.count(SHOWN[:24]) >= 4  # the prompt, the streamed reply, the saved one and its note
        assert [m.content for m in screen.conversation.messages] == [f"say {EVIL}", f"{EVIL} and **bold**"]


async def test_a_tool_calls_name_arguments_question_and_result_show_their_escapes_written_out():
    engine = ToolEngine()
    app = make_app(engine, start=tiny())
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await with_tools(pilot)
        screen.prompt.load_text(f"call shout {json.dumps({'text': EVIL})}")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, AllowTool))
        question = screen_text(app)
        assert_no_control(question)
        assert json.dumps(EVIL)[1:25] in question  # the arguments as JSON (`\\u001b`), the C1 one written out
        assert r"\x9b31mD" in question
        await pilot.press("y")
        await wait_for(pilot, lambda: screen.turns_done >= 2 and not screen.busy)
        box = screen.pane.query(ToolCallBox).last()
        box.fold.collapsed = False  # the result, unfolded
        await pilot.pause()
        text = screen_text(app)
        assert_no_control(text)
        assert shown(EVIL.upper())[:24] in text  # the result, in its box and in its status line
        assert screen.conversation.messages[2].content == EVIL.upper()
