"""The q8_0 KV cache (`--kv-dtype q8_0`): GGUF's Q8_0 per 32 dimensions of a position, on the native runner.

On tiny random models whose heads take it (32 dimensions): a Qwen3 and a Gemma 3 (sliding layers on a
strip that slides, shrunk as in test_sliding). Over a conversation of prompts, replies and edits the
logits stay within `TOLERANCE` of the largest fp32-cache logit, greedy picks mostly the same; a prefill,
a draft and single steps give the same bits on every build this CPU runs; forks, crops and a save to
disk and back keep the bits; a cache of another dtype is refused, never misread; the cache holds 17
bytes where bf16 holds 32; and whatever cannot hold it (the torch lean runner, transformers', heads of
16) refuses it in one line.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from chatcli.engine.kv import memory as kv_memory
from chatcli.engine.kv.persist import fingerprint, read_cache, save_cache
from chatcli.engine.load.hf import build_engine
from chatcli.engine.load.options import LoadError
from tests.conftest import require_kernel
from tests.test_kernel_builds import build  # noqa: F401 - the fixture: each build this CPU runs
from tests.tiny import build_family, build_tokenizer, lean_weights

TOLERANCE = 3e-2  # of the largest fp32-cache logit, over the whole conversation (measured: 1.6e-2)
KEEP_BACK = ROOM = 8  # a strip of 48 positions in the tiny models' 128: it slides many times


@pytest.fixture(autouse=True)
def small_strip(monkeypatch):
    monkeypatch.setattr(kv_memory, "KEEP_BACK", KEEP_BACK)
    monkeypatch.setattr(kv_memory, "STRIP_ROOM", ROOM)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module", params=["qwen3", "gemma3_text"])
def weights(request, tokenizer, tmp_path_factory):
    """A family's fp32 panels, with heads of 32 dimensions (Gemma 3's own query scale to match)."""
    require_kernel()
    overrides = {"head_dim": 32, "query_pre_attn_scalar": 32} if request.param == "gemma3_text" else {}
    model = build_family(request.param, len(tokenizer), **overrides)
    return lean_weights(model, "float32-panels", tmp_path_factory.mktemp(request.param), tokenizer)


def runner(weights, kv_dtype: str, threads: int | None = None):
    from chatcli.engine.runners.native import NativeRunner

    return NativeRunner(weights, kv_dtype=kv_dtype, threads=threads)


def test_q8_logits_track_the_fp32_cache_over_a_conversation(weights):
    """Turns of a prompt and a reply fed a token at a time, each turn after an edit of the last few
    positions (a crop where the strip still reaches, else the cache starts over, on both)."""
    fp32, q8 = runner(weights, "float32"), runner(weights, "q8_0")
    vocab = weights.config.vocab
    ours, ref = q8.new_cache(), fp32.new_cache()
    rng = random.Random(5)
    worst, same, compared, slid = 0.0, 0, 0, False
    for _turn in range(5):
        keep = ours.reachable(max(0, len(ours) - rng.randrange(1, 6)))
        ours.crop(keep), ref.crop(keep)
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(5, 14))]
        for ids in [prompt, *([rng.randrange(3, vocab)] for _ in range(8))]:
            a, b = fp32.forward(ids, ref), q8.forward(ids, ours)
            worst = max(worst, float(np.abs(a - b).max() / np.abs(a).max()))
            same += int(a.argmax() == b.argmax())
            compared += 1
            slid |= ours.strip is not None and ours.strip.base > 0
        assert ours.ids == ref.ids
    assert 0 < worst < TOLERANCE, worst  # quantized, and close
    assert same >= 0.9 * compared, (same, compared)
    assert slid or ours.strip is None  # Gemma 3's sliding layers moved their strip on


@pytest.mark.parametrize("threads", [1, 2])
def test_q8_prefill_draft_and_steps_give_the_same_bits(weights, build, threads):  # noqa: F811
    """On every build this CPU runs: a prefill, a draft checked in one call and the same tokens one at a
    time give the same logits and the same codes and scales."""
    q8 = runner(weights, "q8_0", threads)
    prompt, draft = list(range(3, 40)), [9, 17, 250, 4, 4, 31, 99]
    one, together = q8.new_cache(), q8.new_cache()
    stepwise = [q8.forward([t], one) for t in prompt]
    assert np.array_equal(q8.forward(prompt, together), stepwise[-1])
    assert np.array_equal(q8.verify(draft, together), np.stack([q8.forward([t], one) for t in draft]))
    a, b = one.state(), together.state()
    assert a.keys() == b.keys() and all(np.array_equal(a[n][1], b[n][1]) for n in a)


def test_q8_keys_read_back_dequantized(weights):
    """`keys(n)`: codes times scales, as rows; within half a step of the fp32 cache's where the layer's
    inputs are the same (the first layer, where it attends to every position)."""
    fp32, q8 = runner(weights, "float32"), runner(weights, "q8_0")
    ours, ref = q8.new_cache(), fp32.new_cache()
    ids = list(range(3, 40))
    q8.forward(ids, ours), fp32.forward(ids, ref)
    n, state = len(ids), ours.state()
    assert state["k"][0] == "I8" and state["ks"][0] == "F16" and state["k"][1].dtype == np.int8
    scales = np.repeat(state["ks"][1].astype(np.float32), 32, axis=-1)
    assert np.array_equal(ours.keys(n), state["k"][1] * scales)
    if ours.full[0] == 0:
        step = np.repeat(np.abs(ref.keys(n)[0]).reshape(*ref.keys(n)[0].shape[:2], -1, 32).max(-1) / 127, 32, -1)
        assert np.all(np.abs(ours.keys(n)[0] - ref.keys(n)[0]) <= step * 0.51 + 1e-6)


def test_q8_forks_crops_and_saves_keep_the_bits(weights, tmp_path):
    q8 = runner(weights, "q8_0")
    cache = q8.new_cache()
    for start in range(3, 80, 7):
        q8.forward(list(range(start, start + 7)), cache)
    follow = [17, 23, 31]
    want = q8.forward(follow, cache.clone(len(cache)))
    path, fp = tmp_path / "cache.safetensors", fingerprint(q8, "tiny")
    assert save_cache(cache, path, fp)
    restored, note = read_cache(q8, path, fp)
    assert note == "" and restored is not None and restored.ids == cache.ids
    assert np.array_equal(q8.forward(follow, restored), want)
    near = cache.clone(len(cache) - 4)  # a fork within the strip's reach, and the cache cropped there
    cache.crop(len(cache) - 4)
    assert np.array_equal(q8.forward(follow, near), q8.forward(follow, cache))


def test_a_cache_of_another_dtype_is_refused_not_misread(weights, tmp_path):
    """A bf16 state into a q8_0 cache and back: refused, by the file's fingerprint and, where the
    fingerprint says otherwise, by the arrays themselves; a q8_0 state without its scales, or with
    scales of another shape, too."""
    bf16, q8 = runner(weights, "bfloat16"), runner(weights, "q8_0")
    for saver, reader in ((bf16, q8), (q8, bf16)):
        cache = saver.new_cache()
        saver.forward(list(range(3, 40)), cache)
        assert not reader.new_cache().restore(list(cache.ids), cache.state())
        path = tmp_path / f"{saver.kv_dtype}.safetensors"
        assert save_cache(cache, path, fingerprint(saver, "tiny"))
        assert fingerprint(saver, "tiny") != fingerprint(reader, "tiny")
        assert read_cache(reader, path, fingerprint(reader, "tiny")) == (None, "")
        assert save_cache(cache, path, fingerprint(reader, "tiny"))  # a file that claims the reader's dtype
        assert read_cache(reader, path, fingerprint(reader, "tiny")) == (None, "")
    cache = q8.new_cache()
    q8.forward(list(range(3, 40)), cache)
    state = cache.state()
    assert q8.new_cache().restore(list(cache.ids), state)
    for broken in (
        {n: v for n, v in state.items() if n != "ks"},
        {**state, "vs": ("F16", state["vs"][1][:, :, :-1])},
        {**state, "ks": ("BF16", state["ks"][1].view(np.uint16))},
    ):
        assert not q8.new_cache().restore(list(cache.ids), broken)


def test_q8_holds_17_bytes_where_bf16_holds_32(weights):
    """What the TUI's panel and --json show (`nbytes`): 0.53x the bf16 cache's, strips included."""
    bf16, q8 = runner(weights, "bfloat16"), runner(weights, "q8_0")
    caches = bf16.new_cache(), q8.new_cache()
    for r, cache in zip((bf16, q8), caches, strict=True):
        for start in range(3, 90, 8):
            r.forward(list(range(start, start + 8)), cache)
    assert caches[1].nbytes * 32 == caches[0].nbytes * 17 > 0
    c = weights.config
    held = len(caches[1].full) * caches[1].written + len(caches[1].slid) * min(
        caches[1].strip.written if caches[1].strip else 0, caches[1].strip.size if caches[1].strip else 0
    )
    assert caches[1].nbytes == held * 2 * c.kv_heads * c.head_dim * 17 // 16


def test_what_cannot_hold_q8_refuses_it_in_one_line(tiny_loaded, kernel):
    """The torch lean runner and transformers' keep no q8_0 cache; the kernel takes no heads of 16 with it."""
    with pytest.raises(LoadError, match="^--kv-dtype q8_0 needs the compiled kernel"):
        build_engine(tiny_loaded, runner="lean", kv_dtype="q8_0", kernel=False)
    with pytest.raises(LoadError, match="^--kv-dtype q8_0: the HF runner keeps its cache"):
        build_engine(tiny_loaded, runner="hf", kv_dtype="q8_0")
    with pytest.raises(LoadError, match="^--kv-dtype q8_0: a q8_0 KV cache takes heads of a multiple of 32"):
        build_engine(tiny_loaded, runner="lean", kv_dtype="q8_0")
