"""A decode step's long rows split over the team (kernels/step.h: Unit, steps.h: attend_chunks, fold_chunk).

A row's softmax is folded a chunk of 1,024 keys at a time, in order, in every path: a prefill's tiles, a short
row, and a decode step whose rows read three chunks or more, where each of the team's tasks attends some of
the chunks and one folds them after. So the logits of a long conversation's steps are the bits of one
thread's, of the steps without barriers (with a thread stalled, its items taken over), of a draft checked in
one call and of the whole context prefilled at once, and they are the torch path's within float rounding.
Windows (a sliding layer's keys from its second chunk on), a q8 cache, and the AVX2 build too.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from chatcli.engine.runners.lean import LeanRunner
from chatcli.engine.runners.native import NativeRunner
from tests.test_lean import close
from tests.tiny import family_config, lean_weights

VOCAB = 403
CONTEXT = 3600  # positions before the steps: four chunks of 1024
STEPS = [7, 402, 0, 55]
DRAFT = [9, 17, 250, 4, 31]


def model_of(family: str, window: int = 0):
    import transformers as t

    torch.manual_seed(5)
    config = family_config(family, VOCAB, 4096)
    config.head_dim = 32  # a q8_0 cache's heads: a multiple of 32
    if window:
        config.sliding_window = window
    cls = t.LlamaForCausalLM if family == "llama" else t.MistralForCausalLM
    model = cls(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    return model.eval()


@pytest.fixture(scope="module", params=[("llama", 0), ("mistral", 2500)], ids=["full", "window-2500"])
def files(request, tmp_path_factory):
    family, window = request.param
    folder = tmp_path_factory.mktemp(f"split-{family}")
    model = model_of(family, window)
    return {kind: lean_weights(model, kind, folder) for kind in ("float32-dense", "float32-panels")}


@pytest.fixture
def lib(kernel):
    kernel.chatcli_tolerant(ctypes.c_int32(1), ctypes.c_int64(0))
    yield kernel
    kernel.chatcli_tolerant(ctypes.c_int32(1), ctypes.c_int64(0))


PROMPT = [(i * 37 + 11) % VOCAB for i in range(CONTEXT)]


def steps(runner: NativeRunner) -> tuple[list[np.ndarray], np.ndarray]:
    """The prompt prefilled, the steps one at a time, then a draft checked in one call: their logits."""
    cache = runner.new_cache()
    runner.forward(PROMPT, cache)
    stepwise = [runner.forward([t], cache) for t in STEPS]
    return stepwise, runner.verify(DRAFT, cache)


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16", "q8_0"])
def test_split_steps_give_one_threads_bits(files, lib, kv_dtype):
    one = NativeRunner(files["float32-panels"], kv_dtype=kv_dtype, threads=1)
    alone, alone_draft = steps(one)
    before = lib.chatcli_split_units()
    assert lib.chatcli_split_units() == before  # one thread: no unit is split
    team = NativeRunner(files["float32-panels"], kv_dtype=kv_dtype, threads=2)
    split, split_draft = steps(team)
    assert lib.chatcli_split_units() > before  # the team split the steps' rows
    assert all(np.array_equal(a, b) for a, b in zip(alone, split, strict=True))
    assert np.array_equal(alone_draft, split_draft)
    stepwise = NativeRunner(files["float32-panels"], kv_dtype=kv_dtype, threads=2)  # the draft's tokens one by one
    cache = stepwise.new_cache()
    stepwise.forward(PROMPT + STEPS, cache)
    assert np.array_equal(np.stack([stepwise.forward([t], cache) for t in DRAFT]), split_draft)


def test_the_whole_context_prefilled_gives_the_steps_bits(files, lib):
    team = NativeRunner(files["float32-panels"], threads=2)
    split, _ = steps(team)
    whole = team.forward(PROMPT + STEPS, team.new_cache())
    assert np.array_equal(whole, split[-1])


def test_steps_without_barriers_and_taken_over_give_the_same_bits(files, lib):
    barrier = steps(NativeRunner(files["float32-panels"], threads=2))
    lib.chatcli_tolerant(ctypes.c_int32(1), ctypes.c_int64(300))  # the last thread stalls: its items are taken over
    taken = lib.chatcli_taken_over()
    stalled = steps(NativeRunner(files["float32-panels"], threads=-2))
    assert lib.chatcli_taken_over() > taken
    assert all(np.array_equal(a, b) for a, b in zip(barrier[0], stalled[0], strict=True))
    assert np.array_equal(barrier[1], stalled[1])


def test_split_steps_track_the_torch_path(files, lib):
    reference = LeanRunner(files["float32-dense"], kv_dtype=torch.float32)
    ours = NativeRunner(files["float32-panels"], threads=2)
    caches = reference.new_cache(), ours.new_cache()
    reference.forward(PROMPT, caches[0]), ours.forward(PROMPT, caches[1])
    for token in STEPS:
        a, b = reference.forward([token], caches[0]), ours.forward([token], caches[1])
        assert close(b, a, 1e-4)


def test_every_build_this_cpu_runs_gives_one_threads_bits(files, build):
    """AVX-512's and AVX2's builds (each its own softmax_row): the split steps are one thread's bits there too."""
    alone, alone_draft = steps(NativeRunner(files["float32-panels"], threads=1))
    split, split_draft = steps(NativeRunner(files["float32-panels"], threads=2))
    assert all(np.array_equal(a, b) for a, b in zip(alone, split, strict=True))
    assert np.array_equal(alone_draft, split_draft)
