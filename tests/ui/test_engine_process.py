"""The TUI on its own engine, a generation process (`ProcessEngine`, as `chatcli` starts it; issue 50), over
the tiny model: a reply is the in-process engine's, the panels show its cache, /undo crops the cache
there, the token inspector names the turn's tokens (control tokens framed), the header the chat
template, an /edit branch forks the cache there (Esc's cancel over the pipe: tests/test_process_engine.py);
Esc stops a streaming reply there, and the process ends with its model (/model) and with the app."""

from __future__ import annotations

import os

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
        assert screen.engine.template == here.template  # the header names the chat template
        await send(pilot, "Hello")
        assert screen.conversation.messages[-1].content == expected.reply
        assert screen.panels.values["context"] == f"{expected.stats.context_tokens} / {here.context_limit}"

        await command(pilot, "/tokens")  # the inspector: the turn's ids named by the process's tokenizer
        pieces = screen.tokens.pieces
        reply_ids = [p.token_id for p in pieces if p.kind == "reply"]
        assert [p.text for p in pieces if p.kind == "reply"] == [
            here.tokenizer.decode([i], skip_special_tokens=False) for i in reply_ids
        ]
        printed = [here.tokenizer.decode([p.token_id], skip_special_tokens=True) for p in pieces]
        assert [p.control for p in pieces] == [bool(p.text and not t) for p, t in zip(pieces, printed, strict=True)]
        assert any(p.control for p in pieces)  # the template's markers, framed as control tokens
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


@pytest.fixture
def slow_steps(tmp_path, monkeypatch):
    """Generation processes started from now on take 20 ms a decode step (their sampler wrapped by a
    sitecustomize on their PYTHONPATH): the tiny model's reply streams long enough to stop in its middle."""
    hook = tmp_path / "slow-steps"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import time\n"
        "import chatcli.engine.decode as loop\n"
        "_pick = loop.pick\n"
        "def pick(*args, **kwargs):\n"
        "    time.sleep(0.02)\n"
        "    return _pick(*args, **kwargs)\n"
        "loop.pick = pick\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p))


def switching_app(tiny_model_dir, isolated_dirs, params: SamplingParams) -> ChatApp:
    """The app on a generation process of the tiny model; /model NAME starts another of it."""

    def start(status=None):
        return ProcessEngine.start(str(tiny_model_dir), LoadOptions(device="cpu"), status=status)

    return ChatApp(
        StartOptions(params=params),
        engine_factory=start,
        model_factory=lambda _name, status: start(status),
        history=PromptHistory(isolated_dirs / "history.jsonl"),
        remember=False,
    )


async def test_esc_stops_the_process_s_reply_and_no_process_outlives_its_model_or_the_app(
    tiny_model_dir, isolated_dirs, slow_steps
):
    app = switching_app(tiny_model_dir, isolated_dirs, SamplingParams(temperature=0, max_tokens=80))
    async with app.run_test(size=(120, 40)) as pilot:
        # the first load of the session may build the kernel (the session's cache dir) before it answers
        await wait_for(pilot, lambda: app.chat_screen is not None and app.chat_screen.engine is not None, 300)
        screen = app.chat_screen
        first = screen.engine._process
        await send(pilot, "Hello", wait=False)
        await wait_for(pilot, lambda: screen.live.tokens >= 3)  # the reply streams, drawn as it comes
        assert screen.busy
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.turns_done == 1 and not screen.busy)
        last = screen.conversation.messages[-1]
        assert last.finish_reason == "cancelled" and last.content
        assert last.stats["completion_tokens"] < 40  # stopped there within a step or two, not run to its end

        await command(pilot, "/model another")  # the model replaced: its generation process ends
        await wait_for(pilot, lambda: screen.engine._process is not first)
        await wait_for(pilot, lambda: first.poll() is not None)
        second = screen.engine._process
        assert second.poll() is None
    assert second.poll() is not None  # the app has exited: no generation process is left


async def test_a_dead_generation_process_is_said_and_model_loads_it_again(tiny_model_dir, isolated_dirs):
    app = switching_app(tiny_model_dir, isolated_dirs, GREEDY)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.chat_screen is not None and app.chat_screen.engine is not None, 300)
        screen = app.chat_screen
        first = screen.engine._process
        first.kill()
        first.wait()
        await send(pilot, "Hello", wait=False)
        await wait_for(pilot, lambda: screen.prompt.text == "Hello" and not screen.busy)  # the text kept
        said = screen.pane.notes()[-1].text
        assert "Error: the generation process ended (signal 9); /model NAME loads a model again" in said
        screen.prompt.load_text("")
        await command(pilot, f"/model {tiny_model_dir}")  # the same model: loaded again, not "answering now"
        await wait_for(pilot, lambda: screen.engine._process is not first and not screen.switching)
        await send(pilot, "Hello")
        assert screen.conversation.messages[-1].role == "assistant" and screen.conversation.messages[-1].content
        assert "generation process ended" not in screen.conversation.messages[-1].content
