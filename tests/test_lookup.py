"""Prompt-lookup drafting: the n-gram index, draft acceptance, and replies unchanged by it."""

from __future__ import annotations

import numpy as np
import pytest

from chatcli.engine.engine import Finished
from chatcli.engine.load.hf import build_engine
from chatcli.engine.params import InvalidParameter
from chatcli.engine.sample.lookup import PromptLookup
from chatcli.engine.sample.sampling import SamplingParams, accept_draft, logits_to_probs, new_generator
from chatcli.engine.stats import TurnStats

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, lookup=0)


def test_draft_follows_the_newest_earlier_occurrence():
    lookup = PromptLookup([1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 1, 2])
    assert lookup.draft(3) == [3, 5, 6]  # "1 2" last continued with 3 5 6, not with 3 4 9
    lookup.append(3)
    assert lookup.draft(2) == [5, 6]  # now the trigram "1 2 3" matches


def test_longest_suffix_wins_over_a_newer_shorter_match():
    # "7 1 2" occurred once (followed by 8); "1 2" occurred again later (followed by 4)
    lookup = PromptLookup([7, 1, 2, 8, 0, 1, 2, 4, 0, 7, 1, 2])
    assert lookup.draft(1) == [8]


def test_no_draft_without_a_match_or_room():
    assert PromptLookup([1, 2, 3, 4]).draft(4) == []
    assert PromptLookup([1, 2]).draft(4) == []  # the suffix itself is not an earlier occurrence
    assert PromptLookup([1, 2, 3, 1, 2]).draft(0) == []
    assert PromptLookup([5, 5, 5, 5]).draft(8) == [5]  # a run: what followed, up to the end


def test_appending_one_by_one_builds_the_same_index():
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 1, 4]
    one = PromptLookup()
    for token in ids:
        one.append(token)
    assert one.index == PromptLookup(ids).index and one.draft(4) == [1, 5, 9, 2]


def test_accept_draft_keeps_the_sampling_distribution():
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0], dtype=np.float32)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    expected = logits_to_probs(logits, params)
    generator = new_generator(0)
    for draft in (0, 3):  # the most likely token and an unlikely one
        draws = 20000
        counts = np.zeros(5)
        for _ in range(draws):
            counts[accept_draft(logits, draft, params, generator)] += 1
        assert np.allclose(counts / draws, expected, atol=0.012), (draft, counts / draws, expected)


def test_accept_draft_never_keeps_a_token_the_filters_removed():
    logits = np.array([3.0, 2.9, -5.0, 1.0], dtype=np.float32)
    params = SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)
    generator = new_generator(1)
    picks = {accept_draft(logits, 2, params, generator) for _ in range(300)}
    assert picks == {0, 1}


def test_accept_draft_greedy_is_the_argmax():
    logits = np.array([0.1, 4.0, 0.3], dtype=np.float32)
    assert accept_draft(logits, 1, GREEDY) == 1 and accept_draft(logits, 2, GREEDY) == 1


def test_lookup_is_range_checked():
    with pytest.raises(InvalidParameter, match="lookup"):
        SamplingParams(lookup=-1)
    with pytest.raises(InvalidParameter, match="lookup"):
        SamplingParams(lookup=1000)


def turn(engine, session, messages, params):
    return [ev for ev in engine.generate(messages, session, params) if isinstance(ev, Finished)][0]


def test_verify_gives_each_positions_forward_logits(tiny_engine):
    runner = tiny_engine.runner
    ids = tiny_engine.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    one, all_ = runner.new_cache(), runner.new_cache()
    runner.forward(ids[:5], one)
    runner.forward(ids[:5], all_)
    stepwise = np.stack([runner.forward([token], one) for token in ids[5:9]])  # [4, V]
    together = runner.verify(ids[5:9], all_)  # [4, V]
    assert together.shape == stepwise.shape and all_.ids == one.ids
    assert np.allclose(together, stepwise, atol=1e-4, rtol=1e-4)


def test_greedy_replies_and_caches_are_unchanged_by_lookup(tiny_engine):
    """Over a conversation whose text repeats (so drafts are proposed, some kept, some cut)."""
    text = "def main():\n    print('hello world')\n    return 0\n"
    sessions = [tiny_engine.new_session(), tiny_engine.new_session()]
    history: list[dict] = []
    drafted = accepted = 0
    for message in (text * 3, "Hello, how are you today?", text):
        history.append({"role": "user", "content": message})
        plain = turn(tiny_engine, sessions[0], history, GREEDY)
        drafting = turn(tiny_engine, sessions[1], history, GREEDY.with_(lookup=4))
        assert drafting.reply == plain.reply and drafting.finish_reason == plain.finish_reason
        assert sessions[1].cache.ids == sessions[0].cache.ids  # the rejected drafts were cropped away
        assert drafting.stats.cached_tokens == plain.stats.cached_tokens
        assert plain.stats.draft_tokens == 0
        drafted += drafting.stats.draft_tokens
        accepted += drafting.stats.accepted_tokens
        history.append({"role": "assistant", "content": plain.reply})
    assert 0 < accepted < drafted  # both branches ran: drafts kept and drafts cut


def test_lookup_respects_max_tokens_and_stop_strings(tiny_engine):
    messages = [{"role": "user", "content": "The quick brown fox. " * 6}]
    for params in (GREEDY.with_(max_tokens=7), GREEDY.with_(max_tokens=30, stop=("fox",))):
        plain = turn(tiny_engine, tiny_engine.new_session(), messages, params)
        drafting = turn(tiny_engine, tiny_engine.new_session(), messages, params.with_(lookup=6))
        assert (drafting.reply, drafting.finish_reason, drafting.stats.completion_tokens) == (
            plain.reply,
            plain.finish_reason,
            plain.stats.completion_tokens,
        )
        assert drafting.stats.completion_tokens <= params.max_tokens


def test_int8_weights_draft_only_through_the_kernel(tiny_loaded, no_kernel):
    """torch's int8 kernels quantize the rows of a draft together: their logits are not the
    single-row ones, so drafting is off there (the compiled kernel scales each row alone)."""
    engine = build_engine(tiny_loaded, runner="lean", quantize="int8")
    assert not engine.runner.exact_verify
    done = turn(engine, engine.new_session(), [{"role": "user", "content": "a b a b a b a b"}], GREEDY.with_(lookup=4))
    assert done.stats.draft_tokens == 0 and done.stats.completion_tokens > 0


def test_the_drafts_row_says_off_none_or_how_many_were_kept():
    from chatcli.ui.format import drafts_text

    assert drafts_text(TurnStats(draft_tokens=116, accepted_tokens=73), 4) == "73 of 116 kept"
    assert drafts_text(TurnStats(), 4) == "none"
    assert drafts_text(TurnStats(), 0) == "off"


def test_engine_reports_no_drafting_where_verification_is_not_exact(tiny_loaded, no_kernel):
    params = SamplingParams(lookup=5)
    assert build_engine(tiny_loaded, runner="lean", kv_dtype="float32").lookup_for(params) == 5
    assert build_engine(tiny_loaded, runner="lean", quantize="int8").lookup_for(params) == 0


def test_hf_models_with_sliding_windows_do_not_draft(tiny_loaded, monkeypatch):
    """Their caches cannot be cropped back a few positions mid-turn, which a rejected draft needs."""
    engine = build_engine(tiny_loaded, runner="hf")
    assert engine.runner.exact_verify
    monkeypatch.setattr(tiny_loaded.model.config, "sliding_window", 16, raising=False)
    assert build_engine(tiny_loaded, runner="hf").lookup_for(SamplingParams(lookup=4)) == 0
