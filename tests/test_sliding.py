"""Sliding-window layers keep a strip of the cache, not the whole context (kv_memory.Strip).

Mistral, Phi-3, Qwen2 (where `use_sliding_window`) and Gemma 2/3's local layers attend to the last
`window` positions only; their keys and values live in a strip of `window + keep_back + room`
positions that slides on as the conversation grows. The tests shrink the strip (`KEEP_BACK`,
`STRIP_ROOM`) so that tiny models slide it many times, and check on both lean runners: the logits
are transformers' over prefills longer than the strip's room, decode steps and crops (a crop the strip
cannot serve starts the cache over, and says so through `reachable`); the kernel gives the very bits
of a whole-context cache, drafts included; forks and saved states carry the strip; memory stops
growing at the strip's size; and the engine's greedy replies over a conversation with an edit are
transformers'.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from chatcli.engine.engine import Finished
from chatcli.engine.kv import memory as kv_memory
from chatcli.engine.load.hf import LoadedModel, build_engine
from chatcli.engine.runners.lean import LeanRunner
from chatcli.engine.sample.sampling import SamplingParams
from tests.conftest import require_kernel
from tests.test_families import family_case
from tests.test_lean import close
from tests.tiny import build_tokenizer

SLIDING = ["mistral", "qwen2", "phi3", "gemma2", "gemma3_text"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
KEEP_BACK = ROOM = 8  # a strip of 48 positions (window, keep_back, room, a block) in the tiny models' 128


@pytest.fixture(autouse=True)
def small_strip(monkeypatch):
    monkeypatch.setattr(kv_memory, "KEEP_BACK", KEEP_BACK)
    monkeypatch.setattr(kv_memory, "STRIP_ROOM", ROOM)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module", params=SLIDING)
def family(request, tokenizer, tmp_path_factory):
    return family_case(request.param, tokenizer, tmp_path_factory, ("float32-dense", "float32-panels"))


def runner_of(files, kind: str):
    if kind == "native":
        require_kernel()
        from chatcli.engine.runners.native import NativeRunner

        return NativeRunner(files["float32-panels"])
    return LeanRunner(files["float32-dense"])


def test_the_strip_slides_and_says_how_far_back_it_reaches():
    strip = kv_memory.Strip(8, keep_back=8, room=8)
    assert strip.size == 48  # 8 + 8 + 8 and a block's slack, in whole blocks
    assert strip.slide(0, 8) == 0 and strip.slide(40, 48) == 0 and strip.base == 0
    # position 48 reads from 41 on and 8 more are kept behind: the strip drops the blocks before 32
    assert strip.slide(48, 56) == 32 and strip.base == 32 and strip.written == 48
    assert strip.reaches(56, 56) and strip.reaches(39, 56)  # position 39 reads 32..
    assert not strip.reaches(38, 56) and not strip.reaches(0, 56)  # 38 would read 31..: dropped
    with pytest.raises(ValueError, match="room"):
        strip.slide(56, 65)
    assert kv_memory.strip_for(8, (True, False), 128).size == 48
    assert kv_memory.strip_for(8, (True, False), 48) is None  # no smaller than the context: none
    assert kv_memory.strip_for(0, (), 128) is None


def drive(ref, ours, vocab: int, seed: int, steps: int, limit: int, rel: float) -> dict:
    """Random prefills (up to 3 strips' room), decode steps and crops on both runners, every step's logits
    compared; a crop goes where the strip can (`reachable`), on both. What happened, counted."""
    rng = random.Random(seed)
    cache_ref, cache_ours = ref.new_cache(), ours.new_cache()
    assert cache_ours.strip is not None and cache_ours.slid
    seen = {"compared": 0, "slid": 0, "kept": 0, "restarted": 0}
    for _ in range(steps):
        action = rng.choice(["prefill", "decode", "decode", "decode", "crop"])
        if action == "crop" and len(cache_ref):
            want = rng.randrange(max(0, len(cache_ref) - 24), len(cache_ref))
            keep = cache_ours.reachable(want)
            assert keep in (want, 0)
            if want:
                seen["kept" if keep else "restarted"] += 1
            cache_ref.crop(keep)
            cache_ours.crop(keep)
            assert cache_ours.ids == cache_ref.ids
            continue
        n = rng.randint(2, 3 * ROOM) if action == "prefill" else 1
        if len(cache_ref) + n > limit:
            cache_ref.crop(0)
            cache_ours.crop(0)
        ids = [rng.randrange(vocab) for _ in range(n)]
        a = ref.forward(ids, cache_ref)  # [V]
        b = ours.forward(ids, cache_ours)  # [V]
        assert close(b, a, rel), f"logits differ after {len(cache_ref)} positions ({action})"
        assert cache_ours.ids == cache_ref.ids
        seen["compared"] += 1
        seen["slid"] += cache_ours.strip.base > 0
    return seen


@pytest.mark.parametrize("kind", ["torch", "native"])
def test_a_slid_strip_gives_transformers_logits(family, tokenizer, kind):
    _, _, files, ref = family
    ours = runner_of(files, kind)
    seen = {"compared": 0, "slid": 0, "kept": 0, "restarted": 0}
    for seed in range(3):
        for key, count in drive(ref, ours, len(tokenizer), seed, 60, ref.context_limit, 1e-4).items():
            seen[key] += count
    assert seen["compared"] > 60 and seen["slid"] > 20, seen
    assert seen["kept"] and seen["restarted"], seen  # crops within the strip's reach and past it


def whole_context_cache(runner):
    """A cache of the runner's kind that keeps every layer for the whole context (no strip)."""
    from chatcli.engine.runners.lean_cache import LeanCache
    from chatcli.engine.runners.native import NativeCache

    c = runner.config
    if isinstance(runner, LeanRunner):
        return LeanCache(c.layers, c.kv_heads, c.head_dim, runner.context_limit, runner.kv_dtype, "cpu")
    return NativeCache(c.layers, c.kv_heads, c.head_dim, runner.context_limit, runner.kv_dtype)


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_the_kernel_on_a_strip_gives_the_bits_of_a_whole_cache(family, kv_dtype):
    require_kernel()
    from chatcli.engine.runners.native import NativeRunner

    _, _, files, _ = family
    native = NativeRunner(files["float32-panels"], kv_dtype=kv_dtype)
    strip, whole = native.new_cache(), whole_context_cache(native)
    assert strip.strip is not None and whole.strip is None
    rng = random.Random(7)
    while len(strip) < 110:
        ids = [rng.randrange(50, 200) for _ in range(rng.choice([1, 1, 5, 19]))]
        if rng.random() < 0.3:  # a draft checked in one pass, the rejected tail cropped
            a, b = native.verify(ids, strip), native.verify(ids, whole)
            keep = len(strip) - rng.randrange(len(ids))
            assert strip.reachable(keep) == keep  # a draft's own positions are always within reach
            strip.crop(keep), whole.crop(keep)
        else:
            a, b = native.forward(ids, strip), native.forward(ids, whole)
        assert np.array_equal(a, b), len(strip)
    assert strip.strip.base > 48
    # memory: the sliding layers hold the strip, the others every position
    per_position = 2 * native.config.kv_heads * native.config.head_dim * np.dtype(strip._np).itemsize
    written = whole.written  # positions written (a draft's rejected tail included)
    assert written >= 110 and strip.written == written
    assert strip.nbytes == per_position * (len(strip.full) * written + len(strip.slid) * strip.strip.size)
    assert whole.nbytes == per_position * native.config.layers * written > strip.nbytes


@pytest.mark.parametrize("kind", ["torch", "native"])
def test_forks_and_saved_states_carry_the_strip(family, kind):
    _, _, files, _ = family
    ours = runner_of(files, kind)
    rng = random.Random(3)
    cache = ours.new_cache()
    for _ in range(12):
        ours.forward([rng.randrange(50, 200) for _ in range(7)], cache)
    assert cache.strip.base > 0 and len(cache) == 84
    follow = [17, 23, 31]
    want = ours.forward(follow, cache.clone(len(cache)))

    state = cache.state()
    restored = ours.new_cache()
    assert restored.restore(list(cache.ids), state) and restored.strip.base == cache.strip.base
    got = ours.forward(follow, restored)
    assert np.array_equal(got, want) if kind == "native" else close(got, want, 1e-5)

    near = cache.clone(80)  # within reach: a fork that goes on from position 80
    assert len(near) == 80 and near.strip.base == cache.strip.base
    cache.crop(80)
    assert close(ours.forward(follow, near), ours.forward(follow, cache), 1e-6)
    far = cache.clone(10)  # its window's keys are gone: an empty fork
    assert len(far) == 0 and far.strip.base == 0

    whole = whole_context_cache(ours)  # the same model without a strip: another layout, refused
    assert not whole.restore(list(cache.ids), state)
    assert not restored.restore(list(cache.ids), {"k": state["k"], "v": state["v"]})


@pytest.mark.parametrize("kernel", [False, True])
def test_greedy_replies_over_a_slid_strip_match_transformers(family, tokenizer, tmp_path, kernel):
    if kernel:
        require_kernel()
    name, model, _, _ = family
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = LoadedModel(model, tokenizer, name, str(tmp_path), "cpu", "float32", folder=tmp_path)
    hf_engine = build_engine(loaded, runner="hf")
    lean_engine = build_engine(loaded, runner="lean", kv_dtype="float32", kernel=kernel)
    sessions = {e: e.new_session() for e in (hf_engine, lean_engine)}
    history: list[dict] = []
    slid = False
    texts = ["Hello, how are you? Tell me a story about a dog.", "What is the capital of France, and why?"]
    for i, text in enumerate([*texts, "def main(): print('hello, world')", "Thanks! That was good."]):
        history.append({"role": "user", "content": text})
        a, b = (
            [ev for ev in engine.generate(history, session, GREEDY) if isinstance(ev, Finished)][0]
            for engine, session in sessions.items()
        )
        assert b.reply == a.reply and b.stats.prompt_tokens == a.stats.prompt_tokens
        slid |= sessions[lean_engine].cache.strip.base > 0
        history.append({"role": "assistant", "content": a.reply})
        if i == 1:  # an edit of the first message: the lean cache goes back where the strip can
            history[0] = {"role": "user", "content": "Hi there!"}
    assert slid


@pytest.mark.parametrize("kind", ["torch", "native"])
def test_the_pool_forks_only_what_the_strip_still_holds(family, kind):
    from chatcli.engine.kv.pool import LeaseKind, SessionPool
    from chatcli.engine.kv.session import Session

    _, _, files, _ = family
    ours = runner_of(files, kind)
    pool = SessionPool(lambda: Session(ours.new_cache()), budget_bytes=1 << 30)
    rng = random.Random(5)
    ids = [rng.randrange(50, 200) for _ in range(100)]
    lease = pool.acquire(ids, key="a")
    ours.forward(ids, lease.session.cache)
    pool.release(lease)
    assert lease.session.cache.strip.base > 0
    near = pool.acquire([*ids[:96], 7, 8, 9], key="b")  # shares 96: within the strip's reach
    assert near.how == LeaseKind.FORK and near.cached_tokens == 96 and len(near.session.cache) == 96
    far = pool.acquire([*ids[:40], 7, 8, 9], key="c")  # shares 40, whose window is gone: nothing to fork
    assert far.how == LeaseKind.NEW and far.cached_tokens == 0


def test_a_saved_conversation_with_a_slid_strip_goes_on_where_it_was(family, tokenizer, tmp_path):
    name, model, _, _ = family
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = LoadedModel(model, tokenizer, name, str(tmp_path), "cpu", "float32", folder=tmp_path)
    engine = build_engine(loaded, runner="lean", kv_dtype="float32")
    session = engine.new_session()
    rng = random.Random(9)

    def finish(target, s):
        return [ev for ev in engine.complete(target, s, GREEDY) if isinstance(ev, Finished)][0]

    finish([rng.randrange(50, 200) for _ in range(60)], session)  # raw ids: no template to re-encode them
    assert session.cache.strip.base > 0
    assert engine.save_session(session, tmp_path / "kv.safetensors")
    restored = engine.new_session()
    assert engine.restore_session(restored, tmp_path / "kv.safetensors")
    assert restored.cache.ids == session.cache.ids and restored.cache.strip.base == session.cache.strip.base
    more = [*session.cache.ids, 7, 8, 9]
    a, b = finish(more, session), finish(list(more), restored)
    assert b.reply == a.reply and b.stats.cached_tokens == a.stats.cached_tokens == len(more) - 3
