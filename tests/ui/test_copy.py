"""/copy and F5 in the TUI: the text lands on the app's clipboard (OSC 52) with a notice."""

from tests.test_copying import REPLY
from tests.ui.conftest import command, make_app, ready, send
from tests.ui.fake import FakeEngine


async def test_copy_the_reply_a_code_block_and_a_message():
    app = make_app(FakeEngine(script=lambda _t: REPLY))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "How do I print?")
        await pilot.press("f5")
        assert app.clipboard == REPLY
        await command(pilot, "/copy code 2")
        assert app.clipboard == "echo two\n"
        await command(pilot, "/copy 1")
        assert app.clipboard == "How do I print?"
        await command(pilot, "/copy code 7")
        assert "/copy: the last reply has 2 code blocks, not 7" in screen.pane.children[-1].render().plain
        assert app.clipboard == "How do I print?"  # unchanged
