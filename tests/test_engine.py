"""The engine on the tiny random Llama: cache reuse, crops, overflow, stop strings, cancel."""

from __future__ import annotations

import threading

import pytest
import torch

from chatcli.engine.engine import ContextOverflow, Finished, Prefilled, PromptCancelled, Token, common_prefix
from chatcli.engine.sample.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def run(engine, messages, session, params=GREEDY, cancel=None):
    events = list(engine.generate(messages, session, params, cancel))
    assert isinstance(events[0], Prefilled) and isinstance(events[-1], Finished)
    return events[-1]


def full_logits(engine, ids):
    """Next-token logits after `ids`, computed from an empty cache."""
    with torch.inference_mode():
        return engine.runner.forward(list(ids), engine.runner.new_cache())


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_cached_multi_turn_logits_equal_recompute(tiny_engine):
    session = tiny_engine.new_session()
    messages = []
    for turn, text in enumerate(["Hello there", "What is the capital of France?", "And café?"]):
        messages.append({"role": "user", "content": text})
        done = run(tiny_engine, messages, session)
        stats = done.stats
        assert stats.prompt_tokens == stats.cached_tokens + stats.prefill_tokens
        if turn > 0:
            assert stats.cached_tokens > 0
        # The cache now holds exactly the ids it reports; its next-token logits equal a full recompute.
        assert len(session.cache) == stats.context_tokens
        target = tiny_engine.tokenizer.encode_chat(messages)
        assert session.cache.ids[: len(target)] == target
        messages.append({"role": "assistant", "content": done.reply})
        probe = tiny_engine.tokenizer.encode_chat(messages + [{"role": "user", "content": "ok"}])
        keep = common_prefix(session.cache.ids, probe)
        session.cache.crop(keep)
        with torch.inference_mode():
            cached = tiny_engine.runner.forward(probe[keep:], session.cache)
        torch.testing.assert_close(cached, full_logits(tiny_engine, probe), atol=1e-4, rtol=1e-4)
        session.cache.crop(keep)


def test_crop_and_rollback(tiny_engine):
    ids = tiny_engine.tokenizer.encode_chat([{"role": "user", "content": "The quick brown fox jumps"}])
    cache = tiny_engine.runner.new_cache()
    with torch.inference_mode():
        tiny_engine.runner.forward(ids, cache)
        nbytes = cache.nbytes
        cache.crop(5)
        assert len(cache) == 5 and cache.ids == ids[:5] and cache.nbytes <= nbytes  # lean: allocation is kept
        again = tiny_engine.runner.forward(ids[5:], cache)
    torch.testing.assert_close(again, full_logits(tiny_engine, ids), atol=1e-4, rtol=1e-4)
    cache.crop(0)
    assert len(cache) == 0 and cache.ids == []
    with torch.inference_mode():
        fresh = tiny_engine.runner.forward(ids, cache)
    torch.testing.assert_close(fresh, full_logits(tiny_engine, ids), atol=1e-4, rtol=1e-4)


def test_reply_continues_cache_across_turns(tiny_engine):
    session = tiny_engine.new_session()
    messages = [{"role": "user", "content": "Hello"}]
    first = run(tiny_engine, messages, session)
    messages += [{"role": "assistant", "content": first.reply}, {"role": "user", "content": "More"}]
    second = run(tiny_engine, messages, session)
    assert second.stats.cached_tokens >= first.stats.prompt_tokens


def test_template_that_rewrites_earlier_turns(tiny_engine):
    """A template whose header changes every turn: only the true common prefix is reused."""
    tok = tiny_engine.tokenizer.tokenizer
    original = tok.chat_template
    tok.chat_template = "turns={{ messages|length }}\n" + original
    try:
        session = tiny_engine.new_session()
        messages = [{"role": "user", "content": "Hello there"}]
        first = run(tiny_engine, messages, session)
        messages += [{"role": "assistant", "content": first.reply}, {"role": "user", "content": "again"}]
        target = tiny_engine.tokenizer.encode_chat(messages)
        expected_keep = common_prefix(session.cache.ids, target)
        assert expected_keep < first.stats.prompt_tokens  # the rewrite really changed an early token
        second = run(tiny_engine, messages, session, SamplingParams(temperature=0, max_tokens=1))
        assert second.stats.cached_tokens == expected_keep
        assert session.cache.ids[: len(target)] == target
        fresh = run(tiny_engine, messages, tiny_engine.new_session(), SamplingParams(temperature=0, max_tokens=1))
        assert second.reply == fresh.reply
    finally:
        tok.chat_template = original


def test_greedy_is_deterministic_and_equals_recompute(tiny_engine):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    a = run(tiny_engine, messages, tiny_engine.new_session())
    b = run(tiny_engine, messages, tiny_engine.new_session())
    assert a.reply == b.reply and a.stats.completion_tokens == b.stats.completion_tokens


def test_seeded_sampling_repeats(tiny_engine):
    messages = [{"role": "user", "content": "Hello"}]
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7, max_tokens=20)
    a = run(tiny_engine, messages, tiny_engine.new_session(), params)
    b = run(tiny_engine, messages, tiny_engine.new_session(), params)
    c = run(tiny_engine, messages, tiny_engine.new_session(), params.with_(seed=8))
    assert a.reply == b.reply
    assert a.reply != c.reply


def test_max_tokens_gives_length(tiny_engine):
    done = run(tiny_engine, [{"role": "user", "content": "Hi"}], tiny_engine.new_session(), GREEDY.with_(max_tokens=3))
    assert done.finish_reason == "length" and done.stats.completion_tokens == 3


def test_stop_string_truncates_reply(tiny_engine):
    messages = [{"role": "user", "content": "The quick brown fox"}]
    free = run(tiny_engine, messages, tiny_engine.new_session(), GREEDY.with_(max_tokens=30))
    text = free.reply
    assert len(text) >= 6, "the tiny model should say something"
    stop = text[3:6]
    stopped = run(tiny_engine, messages, tiny_engine.new_session(), GREEDY.with_(max_tokens=30, stop=(stop,)))
    assert stopped.finish_reason == "stop"
    assert stopped.reply == text[: text.index(stop)]


def test_streamed_pieces_equal_reply(tiny_engine):
    events = list(
        tiny_engine.generate(
            [{"role": "user", "content": "🙂 café 中文"}], tiny_engine.new_session(), GREEDY.with_(max_tokens=40)
        )
    )
    pieces = "".join(e.text for e in events if isinstance(e, Token))
    done = events[-1]
    assert pieces == done.reply
    reply_ids = [e.token_id for e in events if isinstance(e, Token) and e.token_id >= 0]
    assert done.reply == tiny_engine.tokenizer.decode(reply_ids)


def long_conversation(n_turns: int, words: int = 12) -> list[dict]:
    messages = [{"role": "system", "content": "You are a test."}]
    for i in range(n_turns):
        messages.append({"role": "user", "content": f"turn {i} " + "lazy dog " * words})
        messages.append({"role": "assistant", "content": "the quick brown fox " * words})
    messages.append({"role": "user", "content": "last question"})
    return messages


def test_overflow_drops_oldest_turns_keeps_system(tiny_engine):
    messages = long_conversation(12)
    params = GREEDY.with_(max_tokens=8)
    ids, dropped = tiny_engine.fit_prompt(messages, params)
    assert dropped > 0 and len(ids) + 8 <= tiny_engine.context_limit
    text = tiny_engine.tokenizer.decode(ids)
    assert text.startswith("system\nYou are a test.") and "last question" in text and "turn 0 " not in text
    done = run(tiny_engine, messages, tiny_engine.new_session(), params)
    assert done.stats.truncated_turns == dropped
    assert done.stats.context_tokens <= tiny_engine.context_limit


def dropping_one_at_a_time(engine, messages, params):
    """What fit_prompt returned before it searched: the oldest exchange dropped, one at a time, until the rest fits."""
    room = min(params.max_tokens, max(1, engine.context_limit // 4))
    system, turns = messages[:1], messages[1:]
    dropped = 0
    while True:
        ids = engine.tokenizer.encode_chat(system + turns)
        starts = [i for i, m in enumerate(turns) if m["role"] == "user"]
        if len(ids) + room <= engine.context_limit or len(starts) < 2:
            return ids, dropped
        turns, dropped = turns[starts[1] :], dropped + 1


@pytest.mark.parametrize("n_turns", [0, 1, 2, 3, 5, 12, 40, 300])
def test_fit_prompt_keeps_what_dropping_one_exchange_at_a_time_kept(tiny_engine, n_turns):
    params = GREEDY.with_(max_tokens=8)
    messages = long_conversation(n_turns, words=3)
    assert tiny_engine.fit_prompt(messages, params) == dropping_one_at_a_time(tiny_engine, messages, params)


def test_fit_prompt_templates_a_bounded_share_of_a_huge_conversation(tiny_engine, monkeypatch):
    """20,000 one-word messages (a hostile request under serve's 1 MiB cap): what fits is found by templating a
    few hundred messages in all, where dropping one exchange at a time templated ~10^8 of them."""
    templated = []
    encode_chat = tiny_engine.tokenizer.encode_chat
    monkeypatch.setattr(
        tiny_engine.tokenizer,
        "encode_chat",
        lambda messages, tools=None, cancel=None: templated.append(len(messages)) or encode_chat(messages, tools),
    )
    messages = [{"role": "user", "content": "a"}] * 20_000
    ids, dropped = tiny_engine.fit_prompt(messages, GREEDY)
    assert len(ids) + GREEDY.max_tokens <= tiny_engine.context_limit
    assert 0 < 20_000 - dropped < tiny_engine.context_limit
    assert sum(templated) < 4 * tiny_engine.context_limit, templated


def test_fit_prompt_stops_when_cancelled(tiny_engine):
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(PromptCancelled):
        tiny_engine.fit_prompt([{"role": "user", "content": "a"}] * 2_000, GREEDY, cancel)


def test_single_message_longer_than_context_is_an_error(tiny_engine):
    huge = [{"role": "user", "content": "lazy dog " * 400}]
    with pytest.raises(ContextOverflow, match="context is 256"):
        list(tiny_engine.generate(huge, tiny_engine.new_session(), GREEDY))


@pytest.mark.parametrize("lookup", [0, 8])
def test_generation_stops_at_context_limit(tiny_engine, monkeypatch, lookup):
    monkeypatch.setattr(tiny_engine.tokenizer, "stop_ids", frozenset())  # no end-of-turn: only the limit ends it
    messages = [{"role": "user", "content": "lazy dog " * 25}]
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1, max_tokens=10_000, lookup=lookup)
    done = run(tiny_engine, messages, tiny_engine.new_session(), params)
    assert done.finish_reason == "length"
    assert done.stats.context_tokens == tiny_engine.context_limit
    assert done.stats.prompt_tokens + done.stats.completion_tokens - 1 == tiny_engine.context_limit


class SlowRunner:
    """Wraps a runner so each forward takes a moment: the cancel test can land mid-reply."""

    def __init__(self, runner, delay: float) -> None:
        self.runner, self.delay = runner, delay
        self.context_limit, self.device, self.dtype = runner.context_limit, runner.device, runner.dtype
        self.new_cache = runner.new_cache
        self.exact_verify = runner.exact_verify
        self.forwards = threading.Semaphore(0)

    def forward(self, ids, cache):
        import time

        time.sleep(self.delay)
        out = self.runner.forward(ids, cache)
        self.forwards.release()
        return out

    def verify(self, ids, cache):
        import time

        time.sleep(self.delay)
        out = self.runner.verify(ids, cache)
        self.forwards.release()
        return out


def test_cancel_from_another_thread_keeps_cache_consistent(tiny_engine):
    from chatcli.engine.engine import Engine

    slow = SlowRunner(tiny_engine.runner, 0.01)
    engine = Engine(slow, tiny_engine.tokenizer)
    session = engine.new_session()
    cancel = threading.Event()
    messages = [{"role": "user", "content": "Hello"}]
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, max_tokens=150)
    result = {}

    def drive():
        result["done"] = run(engine, messages, session, params, cancel)

    worker = threading.Thread(target=drive)
    worker.start()
    for _ in range(6):  # prefill, then five decode steps
        assert slow.forwards.acquire(timeout=10)
    cancel.set()
    worker.join(timeout=10)
    done = result["done"]
    assert done.finish_reason == "cancelled"
    assert 0 < done.stats.completion_tokens < 150
    assert len(session.cache) == done.stats.context_tokens
    # The partial reply becomes the assistant turn; the next turn reuses the cache and is exact.
    messages += [{"role": "assistant", "content": done.reply}, {"role": "user", "content": "go on"}]
    nxt = run(tiny_engine, messages, session, GREEDY.with_(max_tokens=1))
    assert nxt.stats.cached_tokens > done.stats.prompt_tokens
    probe = tiny_engine.tokenizer.encode_chat(messages)
    keep = common_prefix(session.cache.ids, probe)
    session.cache.crop(min(keep, len(probe) - 1))
    with torch.inference_mode():
        cached = tiny_engine.runner.forward(probe[len(session.cache) :], session.cache)
    torch.testing.assert_close(cached, full_logits(tiny_engine, probe), atol=1e-4, rtol=1e-4)


def test_cancel_before_start_gives_empty_cancelled_reply(tiny_engine):
    cancel = threading.Event()
    cancel.set()
    done = run(tiny_engine, [{"role": "user", "content": "Hi"}], tiny_engine.new_session(), GREEDY, cancel)
    assert done.finish_reason == "cancelled" and done.reply == "" and done.stats.completion_tokens == 0


def test_same_seed_repeats_on_one_session(tiny_engine):
    """Each seeded turn restarts the generator: a retry with the same seed gives the same reply."""
    session = tiny_engine.new_session()
    messages = [{"role": "user", "content": "Hello"}]
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=9, max_tokens=16)
    a = run(tiny_engine, messages, session, params)
    b = run(tiny_engine, messages, session, params)
    assert a.reply == b.reply


def test_the_engine_and_the_tests_fake_are_chat_engines(tiny_engine):
    from chatcli.engine.events import ChatEngine
    from tests.ui.fake import FakeEngine

    assert isinstance(tiny_engine, ChatEngine) and isinstance(FakeEngine(), ChatEngine)
    assert not isinstance(object(), ChatEngine)


def test_the_first_tokens_elapsed_time_is_the_turns_ttft(tiny_engine):
    """The live panel's TTFT (the first Token's elapsed_s) and the final one (stats.ttft_s) are one reading."""
    from chatcli.engine.events import FinishReason

    events = list(tiny_engine.generate([{"role": "user", "content": "Hi"}], tiny_engine.new_session(), GREEDY))
    tokens = [e for e in events if isinstance(e, Token)]
    done = events[-1]
    assert tokens and tokens[0].elapsed_s == done.stats.ttft_s > 0
    assert [t.elapsed_s for t in tokens] == sorted(t.elapsed_s for t in tokens)
    assert done.finish_reason in tuple(FinishReason) and isinstance(done.finish_reason, FinishReason)


def test_a_session_saved_and_restored_holds_the_same_ids(tiny_engine, tmp_path):
    session = tiny_engine.new_session()
    run(tiny_engine, [{"role": "user", "content": "Hello there"}], session)
    path = tmp_path / "kv" / "c.safetensors"
    path.parent.mkdir()
    assert tiny_engine.save_session(session, path) and path.is_file()
    other = tiny_engine.new_session()
    assert tiny_engine.restore_session(other, path) and other.cache.ids == session.cache.ids
    path.write_bytes(b"damaged")
    third = tiny_engine.new_session()
    assert not tiny_engine.restore_session(third, path) and third.cache.ids == []


def test_crop_session_keeps_what_the_shorter_conversation_shares(tiny_engine):
    session = tiny_engine.new_session()
    first = [{"role": "user", "content": "Hello there"}]
    done = run(tiny_engine, first, session)
    run(
        tiny_engine,
        first + [{"role": "assistant", "content": done.reply}, {"role": "user", "content": "More"}],
        session,
    )
    kept = tiny_engine.crop_session(session, first)
    assert kept == common_prefix(session.cache.ids, tiny_engine.tokenizer.encode_chat(first)) == len(session.cache)
    assert 0 < kept <= len(tiny_engine.tokenizer.encode_chat(first))
    assert tiny_engine.crop_session(session, []) == 0
