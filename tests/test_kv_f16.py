"""The fp16 KV cache (`--kv-dtype float16`, llama.cpp's default cache) on the native runner.

On tiny random models: a Qwen3 and a Gemma 3 (sliding layers on a strip that slides, shrunk as in
test_sliding). Over a conversation of prompts, replies and edits the logits stay within `TOLERANCE` of the
largest fp32-cache logit, closer than the bf16 cache's; the keys it holds are the fp32 cache's rounded to
the nearest half; a prefill, a draft and single steps give the same bits on every build this CPU runs;
forks, crops and a save to disk and back keep the bits; a bf16 state (the same bytes) is refused, never
misread; it holds the bytes bf16 holds; and the loader runs it on the kernel.
"""

from __future__ import annotations

import numpy as np
import pytest

from chatcli.engine.load.hf import build_engine
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

TOLERANCE = 2e-3  # of the largest fp32-cache logit, over the whole conversation (measured: 6e-4; bf16: 4.2e-3)


@pytest.fixture(scope="module", params=["qwen3", "gemma3_text"])
def weights(request, tokenizer, tmp_path_factory):  # noqa: F811 - the imported fixture
    """A family's fp32 panels."""
    require_kernel()
    model = build_family(request.param, len(tokenizer))
    return lean_weights(model, "float32-panels", tmp_path_factory.mktemp(request.param), tokenizer)


def test_f16_logits_track_the_fp32_cache_closer_than_bf16(weights):
    worst, same, compared, slid = conversation(weights, "float16")
    assert 0 < worst < TOLERANCE, worst  # rounded, and close
    assert same >= 0.95 * compared, (same, compared)
    assert slid  # Gemma 3's sliding layers moved their strip on
    assert worst < conversation(weights, "bfloat16")[0]  # 11 bits of mantissa against 8


@pytest.mark.parametrize("threads", [1, 2])
def test_f16_prefill_draft_and_steps_give_the_same_bits(weights, build, threads):  # noqa: F811
    """On every build this CPU runs: a prefill, a draft checked in one call and the same tokens one at a
    time give the same logits and the same cache."""
    assert_steps_keep_their_bits(runner(weights, "float16", threads))


def test_f16_keys_are_the_fp32_keys_rounded(weights):
    """`keys(n)` and `state()`: halves, as rows; where the layer's inputs are the same (the first layer,
    where it attends to every position) the fp32 cache's keys and values rounded to nearest even."""
    fp32, f16 = runner(weights, "float32"), runner(weights, "float16")
    ours, ref = f16.new_cache(), fp32.new_cache()
    ids = list(range(3, 40))
    f16.forward(ids, ours), fp32.forward(ids, ref)
    n, state = len(ids), ours.state()
    assert state["k"][0] == state["v"][0] == "F16" and state["k"][1].dtype == np.float16
    assert np.array_equal(ours.keys(n), state["k"][1])
    if ours.full[0] == 0:
        assert np.array_equal(ours.keys(n)[0], ref.keys(n)[0].astype(np.float16))
        assert np.array_equal(state["v"][1][0], ref.state()["v"][1][0].astype(np.float16))


def test_f16_forks_crops_and_saves_keep_the_bits(weights, tmp_path):
    assert_forks_crops_and_saves_keep_the_bits(runner(weights, "float16"), tmp_path)


def test_a_bf16_cache_is_refused_not_misread(weights, tmp_path):
    """Both hold 2 bytes an element: a state of the one into the other is refused, by the file's
    fingerprint and, where the fingerprint says otherwise, by the arrays' code."""
    assert_refused_both_ways(runner(weights, "bfloat16"), runner(weights, "float16"), tmp_path)


def test_f16_holds_what_bf16_holds(weights):
    bf16, f16 = runner(weights, "bfloat16"), runner(weights, "float16")
    caches = bf16.new_cache(), f16.new_cache()
    for r, cache in zip((bf16, f16), caches, strict=True):
        for start in range(3, 90, 8):
            r.forward(list(range(start, start + 8)), cache)
    assert caches[1].nbytes == caches[0].nbytes > 0


def test_the_loader_runs_f16_on_the_kernel(tiny_loaded, kernel):
    """`--kv-dtype float16` on fp32 weights: the native runner, not the torch lean runner."""
    from chatcli.engine.runners.native import NativeRunner

    engine_runner = build_engine(tiny_loaded, runner="lean", kv_dtype="float16").runner
    assert isinstance(engine_runner, NativeRunner) and engine_runner.kv_dtype == "float16"
