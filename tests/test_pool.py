"""The cache pool: longest-prefix lookup, forks that leave the original whole, LRU eviction under a budget."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatcli.engine.engine import Finished
from chatcli.engine.kv.pool import MIN_CLONE_TOKENS, MIN_FORK_TOKENS, SessionPool, clones_prefix, fork_session
from chatcli.engine.kv.prefix import common_prefix
from chatcli.engine.sample.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def naive_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@given(st.lists(st.integers(0, 3), max_size=700), st.lists(st.integers(0, 3), max_size=700))
def test_common_prefix_len_matches_a_plain_loop(a, b):
    assert common_prefix(a, b) == naive_prefix(a, b)


@given(st.lists(st.integers(0, 9), max_size=1200), st.integers(0, 1300), st.integers(10, 19))
def test_common_prefix_len_finds_a_late_mismatch(ids, cut, other):
    b = list(ids)
    if cut < len(b):
        b[cut] = other  # ids hold 0..9, so this always differs
    assert common_prefix(ids, b) == min(cut, len(ids))


def fill(engine, session, ids):
    engine.prefill(list(ids), session.cache, None)


def reply(engine, session, messages):
    events = list(engine.generate(messages, session, GREEDY))
    assert isinstance(events[-1], Finished)
    return events[-1].reply


@pytest.fixture
def ids(tiny_engine):
    """A templated prompt long enough to be worth forking (> MIN_FORK_TOKENS)."""
    text = "The quick brown fox jumps over the lazy dog. " * 4
    out = tiny_engine.tokenizer.encode_chat([{"role": "system", "content": text}, {"role": "user", "content": "Hello"}])
    assert len(out) > 40
    return out


def test_a_request_that_extends_a_session_uses_it_in_place(tiny_engine, ids):
    pool = SessionPool(tiny_engine.new_session, budget_bytes=1 << 30)
    first = pool.acquire(ids)
    assert (first.how, first.cached_tokens) == ("new", 0)
    fill(tiny_engine, first.session, ids)
    pool.release(first)
    longer = ids + tiny_engine.tokenizer.encode(" more words")
    second = pool.acquire(longer)
    assert second.how == "hit" and second.session is first.session
    assert second.cached_tokens == len(ids)
    pool.release(second)
    assert len(pool) == 1 and pool.hits == 1 and pool.misses == 1


def test_a_request_diverging_only_in_the_generated_reply_uses_the_session_in_place(tiny_engine):
    pool = SessionPool(tiny_engine.new_session, budget_bytes=1 << 30)
    prompt = tiny_engine.tokenizer.encode_chat([{"role": "user", "content": "Hello"}])
    lease = pool.acquire(prompt)
    fill(tiny_engine, lease.session, prompt + tiny_engine.tokenizer.encode(" the generated reply"))
    pool.release(lease)
    retokenised = prompt + tiny_engine.tokenizer.encode(" the generatedreply and more")
    again = pool.acquire(retokenised)
    assert again.how == "hit" and again.session is lease.session
    assert len(prompt) < again.cached_tokens < len(lease.session.cache)
    fill(tiny_engine, again.session, retokenised + tiny_engine.tokenizer.encode(" a second reply"))
    pool.release(again)
    retry = pool.acquire(retokenised)  # the same request again: only the last reply is dropped
    assert retry.how == "hit" and retry.session is lease.session
    assert retry.cached_tokens == len(retokenised) - 1
    pool.release(retry)


def test_a_diverging_request_forks_and_leaves_the_original_whole(tiny_engine, ids):
    pool = SessionPool(tiny_engine.new_session, budget_bytes=1 << 30)
    lease = pool.acquire(ids)
    fill(tiny_engine, lease.session, ids)
    pool.release(lease)
    original_ids = list(lease.session.cache.ids)

    other = ids[:-3] + tiny_engine.tokenizer.encode("xyz")  # shares all but the last 3 ids
    fork = pool.acquire(other)
    assert fork.how == "fork" and fork.session is not lease.session
    assert fork.cached_tokens == len(ids) - 3 == len(fork.session.cache.ids)
    assert lease.session.cache.ids == original_ids  # untouched
    # The fork copies only the shared prefix (the lean cache allocates in blocks, so it may tie).
    assert fork.session.cache.nbytes <= lease.session.cache.nbytes
    if type(fork.session.cache).__name__ == "HFCache":
        assert fork.session.cache.nbytes < lease.session.cache.nbytes
    pool.release(fork)
    assert len(pool) == 2 and pool.forks == 1


def test_a_forked_cache_continues_exactly_like_a_fresh_prefill(tiny_engine):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    target = tiny_engine.tokenizer.encode_chat(messages)
    base = tiny_engine.new_session()
    fill(tiny_engine, base, target + tiny_engine.tokenizer.encode(" Paris is nice"))
    before = list(base.cache.ids)
    fork = fork_session(base, len(target) - 1)
    assert fork.cache.ids == target[:-1]
    expected = reply(tiny_engine, tiny_engine.new_session(), messages)
    assert reply(tiny_engine, fork, messages) == expected
    assert base.cache.ids == before  # the fork shares no tensor the engine mutates
    other = tiny_engine.tokenizer.encode_chat([{"role": "user", "content": "Hello there"}])
    fresh = tiny_engine.new_session()
    fill(tiny_engine, fresh, other)
    fill(tiny_engine, base, other)  # the original still works after its fork ran
    a = tiny_engine.runner.forward(tiny_engine.tokenizer.encode(" ok"), fresh.cache)
    b = tiny_engine.runner.forward(tiny_engine.tokenizer.encode(" ok"), base.cache)
    assert np.allclose(a, b, atol=1e-4)


def test_a_short_shared_prefix_gets_a_new_session(tiny_engine):
    pool = SessionPool(tiny_engine.new_session, budget_bytes=1 << 30)
    a = tiny_engine.tokenizer.encode_chat([{"role": "user", "content": "Hello"}])
    b = tiny_engine.tokenizer.encode_chat([{"role": "user", "content": "Bonjour"}])
    lease = pool.acquire(a)
    fill(tiny_engine, lease.session, a)
    pool.release(lease)
    second = pool.acquire(b)
    assert second.how == "new" and second.cached_tokens == 0
    assert second.session is not lease.session


def test_a_shared_system_prompt_forks_where_the_cache_copies_only_the_prefix(tiny_engine):
    """Two clients with the same short system prompt: the second prefills only its own message where the
    cache clones just the shared ids (the kernel's, the lean one's), not where it is copied whole."""
    system = {"role": "system", "content": "You are terse."}
    a = tiny_engine.tokenizer.encode_chat([system, {"role": "user", "content": "Hello"}])
    b = tiny_engine.tokenizer.encode_chat([system, {"role": "user", "content": "Bonjour"}])
    shared = common_prefix(a, b)
    assert MIN_CLONE_TOKENS <= shared < MIN_FORK_TOKENS
    pool = SessionPool(tiny_engine.new_session, budget_bytes=1 << 30)
    lease = pool.acquire(a)
    fill(tiny_engine, lease.session, a)
    pool.release(lease)
    second = pool.acquire(b)
    if clones_prefix(lease.session.cache):
        assert (second.how, second.cached_tokens) == ("fork", shared)
        assert second.session.cache.ids == a[:shared]
    else:
        assert (second.how, second.cached_tokens) == ("new", 0)


def test_lru_eviction_keeps_the_pool_under_its_budget(tiny_engine, ids):
    probe = tiny_engine.new_session()
    fill(tiny_engine, probe, ids)
    one = probe.cache.nbytes
    pool = SessionPool(tiny_engine.new_session, budget_bytes=int(one * 2.5), min_fork_tokens=10**6)
    leases = []
    for word in ("alpha", "beta", "gamma"):
        prompt = tiny_engine.tokenizer.encode(word) + ids
        lease = pool.acquire(prompt)
        fill(tiny_engine, lease.session, prompt)
        pool.release(lease)
        leases.append(lease)
        assert pool.nbytes <= pool.budget_bytes
    assert pool.keys() == [leases[1].key, leases[2].key]  # the least recently used went first
    assert pool.evictions == 1
    again = pool.acquire(tiny_engine.tokenizer.encode("beta") + ids + [5])
    assert again.how == "hit" and again.session is leases[1].session
    pool.release(again)
    assert pool.keys() == [leases[2].key, leases[1].key]


def test_get_marks_a_keyed_session_most_recently_used(tiny_engine, ids):
    probe = tiny_engine.new_session()
    fill(tiny_engine, probe, ids)
    pool = SessionPool(tiny_engine.new_session, budget_bytes=int(probe.cache.nbytes * 2.5))
    sessions = {}
    for key in ("a", "b"):
        sessions[key] = tiny_engine.new_session()
        fill(tiny_engine, sessions[key], ids)
        pool.put(key, sessions[key])
    assert pool.get("a") is sessions["a"]  # now "b" is the least recently used
    pool.put("c", probe)
    assert pool.keys() == ["a", "c"] and pool.evictions == 1
    assert pool.get("missing") is None


def test_a_session_over_the_budget_alone_is_not_kept(tiny_engine, ids):
    pool = SessionPool(tiny_engine.new_session, budget_bytes=100)
    lease = pool.acquire(ids)
    fill(tiny_engine, lease.session, ids)
    pool.release(lease)
    assert len(pool) == 0 and pool.nbytes == 0


def test_a_failed_turn_drops_its_session(tiny_engine, ids):
    pool = SessionPool(tiny_engine.new_session, budget_bytes=1 << 30)
    lease = pool.acquire(ids)
    fill(tiny_engine, lease.session, ids)
    pool.release(lease, ok=False)
    assert len(pool) == 0
    assert pool.acquire(ids).how == "new"


def test_a_leased_session_is_never_handed_out_twice(tiny_engine, ids):
    pool = SessionPool(tiny_engine.new_session, budget_bytes=1 << 30)
    lease = pool.acquire(ids)
    fill(tiny_engine, lease.session, ids)
    pool.release(lease)
    first = pool.acquire(ids + [7])
    second = pool.acquire(ids + [7])
    assert first.session is not second.session
    assert second.how == "new"  # the only match is leased
    pool.release(first)
    pool.release(second)


def test_keyed_sessions_belong_to_their_conversation(tiny_engine, ids):
    pool = SessionPool(tiny_engine.new_session, budget_bytes=1 << 30)
    mine = pool.acquire(ids, key="conv-1")
    fill(tiny_engine, mine.session, ids)
    pool.release(mine)
    edited = ids[:10] + tiny_engine.tokenizer.encode("an edited history")
    again = pool.acquire(edited, key="conv-1")  # its own session, whatever the ids
    assert again.how == "hit" and again.session is mine.session and again.cached_tokens == 10
    pool.release(again)
    fill(tiny_engine, mine.session, ids)  # back to the full prompt
    theirs = pool.acquire(ids + [9], key="conv-2")  # shares conv-1's prefix: a fork, not a steal
    assert theirs.how == "fork" and theirs.session is not mine.session
    pool.release(theirs)
    assert pool.get("conv-1") is mine.session and pool.get("conv-2") is theirs.session
    assert pool.drop("conv-1") and pool.get("conv-1") is None


def test_anonymous_requests_never_take_over_a_keyed_session(tiny_engine, ids):
    pool = SessionPool(tiny_engine.new_session, budget_bytes=1 << 30)
    session = tiny_engine.new_session()
    fill(tiny_engine, session, ids)
    pool.put("conv-1", session)
    lease = pool.acquire(ids + [3, 4])
    assert lease.how == "fork" and lease.session is not session
    assert session.cache.ids == ids
    pool.release(lease)


def test_negative_budget_is_refused(tiny_engine):
    with pytest.raises(ValueError, match="budget"):
        SessionPool(tiny_engine.new_session, budget_bytes=-1)


def test_a_space_reuses_only_its_own_sessions(tiny_engine, ids):
    """A request is matched, used in place or forked only from sessions of its own space (the server's: an API
    key and cache_salt); the default space, "", is one shared space as before."""
    pool = SessionPool(tiny_engine.new_session, budget_bytes=1 << 30)
    first = pool.acquire(ids, space="alice")
    fill(tiny_engine, first.session, ids)
    pool.release(first)
    other = pool.acquire(ids, space="mallory")
    assert (other.how, other.cached_tokens) == ("new", 0) and other.session is not first.session
    pool.release(other)
    none = pool.acquire(ids)
    assert (none.how, none.cached_tokens) == ("new", 0)
    pool.release(none)
    again = pool.acquire(ids + [5], space="alice")
    assert again.how == "hit" and again.session is first.session and again.cached_tokens == len(ids)
    pool.release(again)
    fork = pool.acquire(ids[:-3] + [7, 7, 7], space="alice")
    assert fork.how == "fork" and fork.cached_tokens > 8
