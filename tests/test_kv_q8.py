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

import numpy as np
import pytest

from chatcli.engine.load.hf import build_engine
from chatcli.engine.load.options import LoadError
from tests.conftest import require_kernel
from tests.kv_dtypes import (
    assert_forks_crops_and_saves_keep_the_bits,
    assert_refused_both_ways,
    assert_steps_keep_their_bits,
    conversation,
    runner,
)
from tests.test_kernel_builds import build  # noqa: F401 - the fixture: each build this CPU runs
from tests.test_sliding import small_strip, tokenizer  # noqa: F401 - the fixtures: a strip that slides often
from tests.tiny import build_family, lean_weights

TOLERANCE = 3e-2  # of the largest fp32-cache logit, over the whole conversation (measured: 1.6e-2)


@pytest.fixture(scope="module", params=["qwen3", "gemma3_text"])
def weights(request, tokenizer, tmp_path_factory):  # noqa: F811 - the imported fixture
    """A family's fp32 panels, with heads of 32 dimensions (Gemma 3's own query scale to match)."""
    require_kernel()
    overrides = {"head_dim": 32, "query_pre_attn_scalar": 32} if request.param == "gemma3_text" else {}
    model = build_family(request.param, len(tokenizer), **overrides)
    return lean_weights(model, "float32-panels", tmp_path_factory.mktemp(request.param), tokenizer)


def test_q8_logits_track_the_fp32_cache_over_a_conversation(weights):
    """Turns of a prompt and a reply fed a token at a time, each turn after an edit of the last few
    positions (a crop where the strip still reaches, else the cache starts over, on both)."""
    worst, same, compared, slid = conversation(weights, "q8_0")
    assert 0 < worst < TOLERANCE, worst  # quantized, and close
    assert same >= 0.9 * compared, (same, compared)
    assert slid  # Gemma 3's sliding layers moved their strip on


@pytest.mark.parametrize("threads", [1, 2])
def test_q8_prefill_draft_and_steps_give_the_same_bits(weights, build, threads):  # noqa: F811
    """On every build this CPU runs: a prefill, a draft checked in one call and the same tokens one at a
    time give the same logits and the same codes and scales."""
    assert_steps_keep_their_bits(runner(weights, "q8_0", threads))


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
    assert_forks_crops_and_saves_keep_the_bits(runner(weights, "q8_0"), tmp_path)


def test_a_cache_of_another_dtype_is_refused_not_misread(weights, tmp_path):
    """A bf16 state into a q8_0 cache and back: refused, by the file's fingerprint and, where the
    fingerprint says otherwise, by the arrays themselves; a q8_0 state without its scales, or with
    scales of another shape, too."""
    bf16, q8 = runner(weights, "bfloat16"), runner(weights, "q8_0")
    assert_refused_both_ways(bf16, q8, tmp_path)
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
