"""The TUI on its own engine, a generation process (`ProcessEngine`, as `chatcli` starts it; issue 50), over
the tiny model: a reply is the in-process engine's, the panels show its cache, /undo crops the cache
there, the token inspector names the turn's tokens, an /edit branch forks the cache there (Esc's
cancel over the pipe: tests/test_process_engine.py)."""

from __future__ import annotations

import pytest

from chatcli.engine import LoadOptions, ProcessEngine, SamplingParams, load_engine
from chatcli.options import StartOptions
from chatcli.ui.app import ChatApp
from chatcli.ui.persist import PromptHistory
from tests.ui.conftest import command, ready, send, wait_for

GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture
def app_apart(tiny_model_dir, isolated_dirs):
    def factory(status=None):
        return ProcessEngine.start(str(tiny_model_dir), LoadOptions(device="cpu"), status=status)

    history = PromptHistory(isolated_dirs / "history.jsonl")
    return ChatApp(StartOptions(params=GREEDY), engine_factory=factory, history=history, remember=False)


async def test_the_tui_on_a_generation_process(app_apart, tiny_model_dir):
    here = load_engine(str(tiny_model_dir), LoadOptions(device="cpu"))
    expected = [e for e in here.generate([{"role": "user", "content": "Hello"}], here.new_session(), GREEDY)][-1]
    async with app_apart.run_test(size=(120, 40)) as pilot:
        screen = await ready(pilot)
        assert isinstance(screen.engine, ProcessEngine)
        await send(pilot, "Hello")
        assert screen.conversation.messages[-1].content == expected.reply
        assert screen.panels.values["context"] == f"{expected.stats.context_tokens} / {here.context_limit}"

        await command(pilot, "/tokens")  # the inspector: the turn's ids named by the process's tokenizer
        pieces = screen.tokens.pieces
        reply_ids = [p.token_id for p in pieces if p.kind == "reply"]
        assert [p.text for p in pieces if p.kind == "reply"] == [
            here.tokenizer.decode([i], skip_special_tokens=False) for i in reply_ids
        ]
        await command(pilot, "/tokens")

        await send(pilot, "Again")
        grown = len(screen.session.cache)
        await command(pilot, "/undo")  # the cache there is cropped to the conversation that is left
        assert 0 < len(screen.session.cache) < grown

        parent = screen.session
        await command(pilot, "/edit 1")
        screen.prompt.load_text("Hi there")
        await pilot.press("enter")  # a branch, its cache forked from the parent's in the process
        await wait_for(pilot, lambda: screen.turns_done == 3 and not screen.busy)
        assert screen.session is not parent
        assert screen.conversation.messages[-1].stats["cached_tokens"] > 0
