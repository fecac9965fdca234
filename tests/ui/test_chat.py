from chatcli.engine.sampling import SamplingParams
from chatcli.options import StartOptions
from chatcli.ui.widgets.chat_pane import ReplyBox, UserMessage
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
