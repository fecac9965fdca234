"""MCP tools in the TUI: the tiny MCP server (tests/mcp_server.py) and the scripted engine that calls its
tools (tests/mcp_fake.py), driven with Pilot: allow once, always, no, Esc; /tools; a server that fails; a Harmony
(gpt-oss) model's reasoning and call."""

from __future__ import annotations

import sys
from pathlib import Path

from chatcli.chat.mcp import Server
from chatcli.engine.text.toolcalls import call_text
from chatcli.options import StartOptions
from chatcli.ui.screens.allow_tool import AllowTool
from chatcli.ui.widgets.chat_pane import ReplyBox
from chatcli.ui.widgets.tool_call import ToolCallBox
from tests.mcp_fake import ToolEngine
from tests.ui.conftest import command, make_app, ready, wait_for

SERVER = str(Path(__file__).parent.parent / "mcp_server.py")
ADD = 'call add {"a": 2, "b": 3}'


def tiny(**changes) -> StartOptions:
    start = StartOptions(mcp=[Server("tiny", sys.executable, (SERVER,), timeout=2)])
    for key, value in changes.items():
        setattr(start, key, value)
    return start


async def with_tools(pilot):
    screen = await ready(pilot)
    await wait_for(pilot, lambda: screen.toolbox is not None, timeout=60)  # a server starts in ~1 s, on a busy CPU more
    return screen


async def ask(pilot, text: str):
    """Send `text`; the call's question, once it is up."""
    screen = pilot.app.chat_screen
    screen.prompt.load_text(text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, AllowTool))
    return pilot.app.screen


async def done(pilot, turns: int) -> None:
    screen = pilot.app.chat_screen
    await wait_for(pilot, lambda: screen.turns_done >= turns and not screen.busy)
    await pilot.pause()


def roles(screen) -> list[str]:
    return [m.role for m in screen.conversation.messages]


async def test_an_allowed_call_runs_its_result_folds_under_it_and_the_model_goes_on():
    engine = ToolEngine()
    app = make_app(engine, start=tiny())
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await with_tools(pilot)
        question = await ask(pilot, ADD)
        assert (question.tool, question.server, question.arguments) == ("add", "tiny", '{"a": 2, "b": 3}')
        box = screen.pane.query(ToolCallBox).last()
        assert "waiting for you" in str(box.state.render())
        await pilot.press("y")
        await done(pilot, 2)
        assert roles(screen) == ["user", "assistant", "tool", "assistant"]
        call = screen.conversation.messages[1].tool_calls[0]
        assert (call["name"], call["arguments"]) == ("add", '{"a": 2, "b": 3}')
        assert screen.conversation.messages[1].content == "Calling."
        assert screen.conversation.messages[2].content == "5"
        assert str(box.state.render()) == "5" and box.fold.collapsed  # folded: a click shows it
        assert not box.fold.display  # "5" is all of it: no "click to show" under a line that shows it
        assert "add" in str(box.head.render()) and '"a": 2' in str(box.head.render())
        replies = screen.pane.query(ReplyBox)
        assert [r.markdown.source for r in replies] == ["Calling.", "The tool said: 5"]  # no <tool_call> text
        assert engine.calls[0]["params"].tools is not None and engine.calls[1]["params"].tools is not None
        # the round trip prefilled the result alone: the cache kept the prompt and the call
        first = (
            len(engine.tokenizer.encode_chat(engine.calls[0]["messages"]))
            + len("Calling.\n")
            + len('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>')
        )
        assert engine.calls[1]["cached"] == first


async def test_a_harmony_models_call_runs_and_its_reasoning_folds_as_any_other():
    """gpt-oss's reply (its analysis, then a `commentary` message to a function): the call is a tool box, its
    reasoning the reply's fold, and no Harmony markup reaches the chat pane or the stored reply."""
    engine = ToolEngine(harmony=True)
    app = make_app(engine, start=tiny())
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await with_tools(pilot)
        question = await ask(pilot, ADD)
        assert (question.tool, question.arguments) == ("add", '{"a": 2, "b": 3}')
        await pilot.press("y")
        await done(pilot, 2)
        assert roles(screen) == ["user", "assistant", "tool", "assistant"]
        asked = screen.conversation.messages[1]
        assert (asked.tool_calls[0]["name"], asked.tool_calls[0]["arguments"]) == ("add", '{"a": 2, "b": 3}')
        assert asked.content == "<think>The user wants the tool.</think>"
        assert screen.conversation.messages[2].content == "5"
        first, last = screen.pane.query(ReplyBox)
        assert first.has_reasoning and last.has_reasoning
        assert [r.markdown.source for r in (first, last)] == ["", "The tool said: 5"]
        sent = engine.calls[1]["messages"]
        assert sent[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}


async def test_no_tells_the_model_and_always_stops_asking_for_that_tool():
    app = make_app(ToolEngine(), start=tiny())
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await with_tools(pilot)
        await ask(pilot, ADD)
        await pilot.press("n")
        await done(pilot, 2)
        assert screen.conversation.messages[2].tool_call["status"] == "denied"
        assert screen.conversation.messages[-1].content.startswith("The tool said: The user did not allow")
        assert str(screen.pane.query(ToolCallBox).last().state.render()) == "not run"
        note = await command(pilot, "/tools")
        assert "add (tiny, asks first): Add two whole numbers." in note.text
        await ask(pilot, 'call shout {"text": "hey"}')
        await pilot.press("a")
        await done(pilot, 4)
        assert screen.conversation.messages[-1].content == "The tool said: HEY"
        screen.prompt.load_text('call shout {"text": "again"}')  # always: no question this time
        await pilot.press("enter")
        await done(pilot, 6)
        assert not isinstance(app.screen, AllowTool)
        assert screen.conversation.messages[-1].content == "The tool said: AGAIN"
        note = await command(pilot, "/tools")
        assert "shout (tiny, runs without asking)" in note.text and "add (tiny, asks first)" in note.text


async def test_esc_at_the_question_stops_the_turn_and_keeps_the_call_answered():
    engine = ToolEngine()
    app = make_app(engine, start=tiny())
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await with_tools(pilot)
        await ask(pilot, 'call add {"a": 1, "b": 1} ; call shout {"text": "x"}')
        await pilot.press("escape")
        await done(pilot, 1)
        assert len(engine.calls) == 1  # the model was not asked again
        assert roles(screen) == ["user", "assistant", "tool", "tool"]
        assert [m.tool_call["status"] for m in screen.conversation.messages[2:]] == ["stopped", "stopped"]
        assert "Stopped" in screen.pane.notes()[-1].text
        screen.prompt.load_text("hello")  # the chat goes on
        await pilot.press("enter")
        await done(pilot, 2)
        assert screen.conversation.messages[-1].content == "You said: hello"


async def test_a_failing_or_hanging_tool_is_a_result_and_a_notice():
    app = make_app(ToolEngine(), start=tiny(allow_tools=True))
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await with_tools(pilot)
        screen.prompt.load_text('call fail {} ; call sleep {"seconds": 30}')
        await pilot.press("enter")
        await done(pilot, 2)
        results = screen.conversation.messages[2:4]
        assert [m.tool_call["status"] for m in results] == ["error", "timeout"]
        said = [n.message for n in app._notifications]
        assert any("fail: Error executing tool fail" in m for m in said)
        assert any("sleep: Error: the tool sleep did not answer within 2 s" in m for m in said)
        assert screen.conversation.messages[-1].content.startswith("The tool said: Error")


async def test_a_server_that_does_not_start_is_a_notice_and_the_chat_works():
    start = StartOptions(mcp=[Server("gone", "no-such-mcp-server")])
    app = make_app(ToolEngine(), start=start)
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await ready(pilot)
        await wait_for(pilot, lambda: not screen.tools_starting)
        said = [(n.message, n.severity) for n in app._notifications]
        assert ("the MCP server 'gone' did not start: no such command: no-such-mcp-server", "error") in said
        note = await command(pilot, "/tools")
        assert note.text.startswith("No tools")
        screen.prompt.load_text(ADD)
        await pilot.press("enter")
        await done(pilot, 1)
        assert screen.conversation.messages[-1].tool_calls is None  # no tools offered: its text is a reply


async def test_a_resumed_conversation_shows_its_calls_and_results():
    app = make_app(ToolEngine(), start=tiny(allow_tools=True))
    async with app.run_test(size=(110, 36)) as pilot:
        await with_tools(pilot)
        app.chat_screen.prompt.load_text(ADD)
        await pilot.press("enter")
        await done(pilot, 2)
    engine = ToolEngine()
    app = make_app(engine, start=tiny(continue_last=True))
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await with_tools(pilot)
        assert roles(screen) == ["user", "assistant", "tool", "assistant"]
        (box,) = screen.pane.query(ToolCallBox)
        assert "add" in str(box.head.render()) and str(box.state.render()) == "5"
        assert str(box.output.render()) == "5"
        screen.prompt.load_text("thanks")
        await pilot.press("enter")
        await done(pilot, 1)
        sent = engine.calls[0]["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "user"]
        assert sent[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
        assert sent[2]["tool_call_id"] == sent[1]["tool_calls"][0]["id"] and sent[2]["name"] == "add"


async def test_esc_stops_a_running_call():
    start = StartOptions(mcp=[Server("tiny", sys.executable, (SERVER,), timeout=60)], allow_tools=True)
    engine = ToolEngine()
    app = make_app(engine, start=start)
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await with_tools(pilot)
        screen.prompt.load_text('call sleep {"seconds": 30}')
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.pane.query(ToolCallBox))
        box = screen.pane.query(ToolCallBox).last()
        await wait_for(pilot, lambda: "running" in str(box.state.render()))
        await pilot.press("escape")
        await done(pilot, 1)
        assert screen.conversation.messages[-1].tool_call["status"] == "stopped"
        assert len(engine.calls) == 1 and str(box.state.render()).startswith("stopped")


async def test_a_call_in_a_reply_stopped_by_esc_is_not_run():
    engine = ToolEngine(hold_at=10)  # its reply's whole call block, then it waits
    block = call_text("add", '{"a": 1, "b": 2}')
    engine.script = lambda _text: f"Calling.\n{block}\nand more words"
    app = make_app(engine, start=tiny(allow_tools=True))
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await with_tools(pilot)
        screen.prompt.load_text("add them")
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.live.tokens == 10)
        await pilot.press("escape")
        await done(pilot, 1)
        assert roles(screen) == ["user", "assistant"] and not screen.pane.query(ToolCallBox)
        assert screen.conversation.messages[-1].finish_reason == "cancelled"
