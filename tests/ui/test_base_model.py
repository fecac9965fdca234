"""A GGUF without a chat template in the TUI: it answers with a built-in template, named in the header;
with `--raw` each message continues the whole transcript (what was typed and what the model wrote)."""

from __future__ import annotations

import pytest

from chatcli.engine import LoadOptions, SamplingParams
from chatcli.engine.load.build import load_engine
from chatcli.options import StartOptions
from tests.gguf_models import base_model_gguf
from tests.ui.conftest import make_app, ready, send


@pytest.fixture(scope="module")
def base_file(tmp_path_factory):
    return base_model_gguf("llama", tmp_path_factory.mktemp("base") / "llama-base.gguf")


async def test_a_file_without_a_template_answers_and_the_header_names_its_template(base_file):
    engine = load_engine(str(base_file))  # before: "the tokenizer has no chat template"
    app = make_app(engine)
    async with app.run_test(size=(160, 30)) as pilot:
        screen = await ready(pilot)
        assert "llama-base.gguf · cpu · gguf F32 · template built-in chatml" in str(screen.info.render())
        assert "has no chat template: the built-in chatml template" in screen.pane.notes()[-1].text
        await send(pilot, "Hello there")
        assert screen.conversation.messages[-1].role == "assistant" and screen.last_stats.completion_tokens
        want = engine.tokenizer.encode_chat(screen.conversation.for_template()[:-1])
        assert screen.last_stats.prompt_tokens == len(want)


async def test_raw_continues_the_whole_transcript(base_file):
    engine = load_engine(str(base_file), LoadOptions(raw=True))
    app = make_app(engine, start=StartOptions(params=SamplingParams(temperature=0, max_tokens=8)))  # fits the context
    async with app.run_test(size=(160, 30)) as pilot:
        screen = await ready(pilot)
        assert "template raw" in str(screen.info.render())
        await send(pilot, "Once upon a time")
        first = screen.conversation.messages[-1].content
        await send(pilot, "The end.")
        transcript = "Once upon a time" + first + "The end."
        ids, cached = screen._prompt_ids  # the cache's ids where they spell the same text (`realigned`)
        assert engine.tokenizer.decode(ids, skip_special_tokens=False) == transcript and cached > 0
        assert not screen.last_stats.truncated_turns
