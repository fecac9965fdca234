"""The TUI on the real engine (the tiny random Llama): retry and undo keep the KV cache right."""

import pytest

from chatcli.engine.engine import common_prefix
from chatcli.engine.sample.sampling import SamplingParams
from chatcli.options import StartOptions
from chatcli.ui.widgets.chat_pane import ReplyBox
from tests.ui.conftest import command, make_app, ready, send


def start():
    return StartOptions(params=SamplingParams(temperature=0, max_tokens=6))


async def test_turns_retry_and_undo_on_the_tiny_engine(tiny_engine):
    app = make_app(tiny_engine, start=start())
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "Hello")
        first = screen.last_stats
        assert first.cached_tokens == 0 and first.completion_tokens >= 1
        assert len(screen.session.cache) == first.context_tokens
        reply = screen.conversation.messages[-1].content

        await command(pilot, "/retry")
        await pilot.pause()
        while screen.busy:
            await pilot.pause(0.02)
        again = screen.last_stats
        assert again.cached_tokens == again.prompt_tokens - 1  # the whole prompt came from the cache
        assert screen.conversation.messages[-1].content == reply  # greedy: the same reply
        assert len(screen.conversation.messages) == 2

        await send(pilot, "And then?")
        ids_before = list(screen.session.cache.ids)
        await command(pilot, "/undo")
        assert len(screen.conversation.messages) == 2
        target = tiny_engine.tokenizer.encode_chat(screen.conversation.for_template())
        kept = len(screen.session.cache)
        assert kept == common_prefix(ids_before, target) and 0 < kept < len(ids_before)
        assert screen.session.cache.ids == ids_before[:kept]

        await send(pilot, "Something else")
        assert screen.last_stats.cached_tokens == kept  # the next turn starts from the cropped cache


@pytest.mark.real_model
async def test_a_turn_on_the_embedded_model(real_engine):
    app = make_app(real_engine, start=StartOptions(params=SamplingParams(temperature=0, max_tokens=8)))
    async with app.run_test(size=(110, 30)) as pilot:
        screen = await ready(pilot)
        assert "cpu" in str(screen.info.render()) and "SmolLM2" in str(screen.info.render())
        await send(pilot, "What is the capital of France?")
        reply = screen.conversation.messages[-1]
        assert reply.content.strip() and reply.stats["completion_tokens"] >= 1
        assert screen.panels.values["tokens"] == str(reply.stats["completion_tokens"])
        assert screen.panels.values["context"] == f"{len(screen.session.cache)} / {real_engine.context_limit}"


async def test_a_reopened_conversation_restores_its_kv_cache_from_disk(tiny_engine):
    from chatcli.chat.saved import kv_path
    from chatcli.chat.store import Store

    params = SamplingParams(temperature=0, max_tokens=4)
    app = make_app(tiny_engine, start=StartOptions(params=params))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "Hello")
        cid, kept = screen.conversation.id, list(screen.session.cache.ids)
        first = screen.last_stats
    path = kv_path(Store(), cid)
    assert path.is_file()

    async def reopen():
        app = make_app(tiny_engine, start=StartOptions(params=params, continue_last=True))
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await ready(pilot)
            assert screen.conversation.id == cid
            restored = list(screen.session.cache.ids)
            await send(pilot, "More")
            said = (str(screen.pane.query(ReplyBox).last().note.render()), screen.panels.values["prompt"])
            await send(pilot, "And more")  # the next turn's cache is the one in memory
            said += (str(screen.pane.query(ReplyBox).last().note.render()), screen.panels.values["prompt"])
            return restored, screen.conversation.messages[-3].stats, said

    restored, stats, said = await reopen()
    assert restored == kept  # the session starts from the file, not empty
    assert stats["cached_tokens"] >= first.prompt_tokens  # the history was not prefilled again
    # the first turn says where its cache came from, and how long reading it took (not part of its TTFT)
    assert f"cache restored from disk: {len(kept)} tokens in " in said[0] and said[1].endswith(" new")
    assert said[1].startswith(f"{stats['cached_tokens']} restored · ")
    assert "restored" not in said[2] and "restored" not in said[3]
    path.write_bytes(b"not a safetensors file")  # a damaged file is ignored, never trusted
    restored, stats, said = await reopen()
    assert restored == [] and stats["cached_tokens"] == 0 and "restored" not in said[0] + said[1]


async def test_an_evicted_conversation_is_prefilled_again_even_with_a_kv_file(tiny_engine):
    params = SamplingParams(temperature=0, max_tokens=4)
    app = make_app(tiny_engine, start=StartOptions(params=params, cache_budget_bytes=1))  # nothing stays resident
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "Hello")
        first = screen.conversation.id
        await command(pilot, "/new")
        await send(pilot, "Other")
        ids = [r.id for r in screen.chats.rows()]
        await command(pilot, f"/switch {ids.index(first) + 1}")
        assert len(screen.session.cache) == 0
        await send(pilot, "Again")
        assert screen.last_stats.cached_tokens == 0 and screen.chats.pool.evictions >= 2
