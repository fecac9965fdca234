"""Decode steps without barriers (kernels/tolerant.h, on a negative number of threads: pool.h's threads,
the caller's asleep): a call of fewer than 16 rows splits each stage's items over the team, and a thread
that has done its own range does the items of a thread that is not there. Every item is committed by
exactly one thread, from the finished stages' buffers, so the logits and the cache are the bits of the
barrier forward: whether the whole team is there, or its last thread sleeps before each of its commits
(`chatcli_tolerant(1, us)`) and the others take its items over.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from chatcli.engine.runners.native import NativeRunner
from tests.gguf_models import Q4_K_M, tiny
from tests.gguf_runs import direct_runner
from tests.test_batch import STEPS, batched, same
from tests.tiny import lean_weights

IDS = [int(i) for i in np.random.default_rng(7).integers(3, 400, size=44)]


@pytest.fixture
def lib(kernel):
    """The kernel, its tolerant steps on and no stall, put back after."""
    kernel.chatcli_tolerant(ctypes.c_int32(1), ctypes.c_int64(0))
    yield kernel
    kernel.chatcli_tolerant(ctypes.c_int32(1), ctypes.c_int64(0))


def calls(runner: NativeRunner) -> list[np.ndarray]:
    """A prompt of 6 rows, steps, a draft of 5, a chunk of 21 (barriers: 16 rows or more), more steps."""
    cache = runner.new_cache()
    out = [runner.verify(IDS[:6], cache)]
    out += [runner.verify([t], cache) for t in IDS[6:14]]
    out += [runner.verify(IDS[14:19], cache), runner.verify(IDS[19:40], cache)]
    out += [runner.verify([t], cache) for t in IDS[40:]]
    return out


def each_way(lib, run):
    """run() with barriers, without, and without with the last thread stalled 300 us before each commit;
    the items taken over in that last run."""
    lib.chatcli_tolerant(ctypes.c_int32(0), ctypes.c_int64(0))
    barrier = run()
    lib.chatcli_tolerant(ctypes.c_int32(1), ctypes.c_int64(0))
    tolerant = run()
    before = lib.chatcli_taken_over()
    lib.chatcli_tolerant(ctypes.c_int32(1), ctypes.c_int64(300))
    stalled = run()
    return barrier, tolerant, stalled, lib.chatcli_taken_over() - before


def equal(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    "family", ["llama", "qwen3", "gemma3_text", "qwen3_moe", "smollm3", "granite", "olmo2", "granitemoe"]
)
@pytest.mark.parametrize("threads", [2, 3])
def test_steps_without_barriers_give_the_barrier_forwards_bits(lib, tmp_path, family, threads):
    """K-quant parts (Q4_K_M's fused projections in two types), q/k norms, Gemma 3's sandwich norms and
    sliding layers, a mixture of experts (its experts' projections one stage), SmolLM3's unrotated layer,
    Granite's residual scale (GraniteMoE's on its experts' output too), OLMo 2's output norms; two and three
    threads, the last one stalled or not."""
    runner = direct_runner(tiny(family, True), Q4_K_M, tmp_path)
    runner.threads = -threads  # as many threads, decode steps without barriers
    barrier, tolerant, stalled, taken = each_way(lib, lambda: calls(runner))
    assert equal(tolerant, barrier)
    assert equal(stalled, barrier)
    assert taken > 0  # the stall made the others do its items


@pytest.mark.parametrize("kind", ["float32-panels", "int8"])
def test_lean_kinds_too(lib, tiny_loaded, tmp_path, kind):
    """fp32 panels (units of 64 outputs) and int8 rows."""
    runner = NativeRunner(lean_weights(tiny_loaded.model, kind, tmp_path, tiny_loaded.tokenizer), threads=-2)
    barrier, tolerant, stalled, taken = each_way(lib, lambda: calls(runner))
    assert equal(tolerant, barrier) and equal(stalled, barrier) and taken > 0


def test_a_batch_of_sequences_too(lib, tmp_path):
    """Several segments in a call (serve's batches): each with its own cache, the rows with logits gathered."""
    runner = direct_runner(tiny("llama", True), Q4_K_M, tmp_path)
    runner.threads = -2
    barrier, tolerant, stalled, taken = each_way(lib, lambda: batched(runner, STEPS))
    assert same(tolerant[0], barrier[0]) and same(stalled[0], barrier[0]) and taken > 0
    for caches in (tolerant[1], stalled[1]):
        for cache, want in zip(caches, barrier[1], strict=True):
            assert cache.ids == want.ids
            assert np.array_equal(cache.k, want.k) and np.array_equal(cache.v, want.v)


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_every_build_this_cpu_runs(build, tmp_path, family):
    """The AVX-512, AVX-VNNI and AVX2 builds alike (each with its own passes of rows)."""
    from chatcli.engine.runners import kernels

    lib = kernels.library()
    runner = direct_runner(tiny(family, True), Q4_K_M, tmp_path)
    runner.threads = -2
    try:
        barrier, tolerant, stalled, taken = each_way(lib, lambda: calls(runner))
    finally:
        lib.chatcli_tolerant(ctypes.c_int32(1), ctypes.c_int64(0))
    assert equal(tolerant, barrier) and equal(stalled, barrier) and taken > 0


def test_a_thread_that_fails_fails_the_call_and_the_next_one_runs(lib, tmp_path):
    """A worker that throws (a failed allocation, say) does not end the process: the call fails (an error
    the runner raises) and the next one runs, with the bits it would have had."""
    runner = direct_runner(tiny("llama", True), Q4_K_M, tmp_path)
    runner.threads = -2
    want = calls(runner)
    cache = runner.new_cache()
    runner.verify(IDS[:6], cache)
    lib.chatcli_fail_thread(ctypes.c_int32(1))
    try:
        with pytest.raises(ValueError, match="status 2"):
            runner.verify([IDS[6]], cache)
    finally:
        lib.chatcli_fail_thread(ctypes.c_int32(-1))
    assert equal(calls(runner), want)
