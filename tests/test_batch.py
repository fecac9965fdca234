"""Several sequences in one kernel call (`NativeRunner.forward_batch`, decode.cpp's `chatcli_decode_batch`).

Each row has its own KV cache and position, and every number of a row is computed from that row
alone: a sequence's logits in a batch are the bits it gets alone, whatever rows share the call (a
prompt chunk beside single decode rows, a draft beside a step, sequences at other positions), in
each weight kind, with an fp32 or bf16 cache and a model with sliding layers; its cache then holds
what it would hold alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from chatcli.engine.runners.native import NativeRunner
from chatcli.engine.weights.gguf_lean import convert_gguf_lean
from chatcli.engine.weights.lean_file import LeanWeights
from tests.gguf_models import Q4_K_M, tiny, write_gguf
from tests.tiny import lean_weights

PROMPTS = [[1, 5, 17, 200, 3, 99, 42], [7, 300, 11], [64, 2, 8, 9, 10, 12, 13, 14, 15, 16, 18]]


def alone(runner: NativeRunner, steps: list[list[tuple[list[int], bool]]]) -> list[list[np.ndarray]]:
    """Each sequence's calls run by themselves: per sequence, its logits call by call."""
    out = []
    for calls in steps:
        cache = runner.new_cache()
        out.append([runner.verify(ids, cache) if every else runner.forward(ids, cache) for ids, every in calls])
    return out


def batched(runner: NativeRunner, steps: list[list[tuple[list[int], bool]]]) -> tuple[list, list]:
    """The same calls, call i of every sequence in one batch (a sequence with no call i sits out)."""
    caches = [runner.new_cache() for _ in steps]
    out: list[list[np.ndarray]] = [[] for _ in steps]
    for i in range(max(map(len, steps))):
        live = [j for j, calls in enumerate(steps) if i < len(calls)]
        logits = runner.forward_batch([(steps[j][i][0], caches[j], steps[j][i][1]) for j in live])
        for j, rows in zip(live, logits, strict=True):
            out[j].append(rows)
    return out, caches


# per sequence, its calls: (ids, every); a prompt, then steps, a draft, more steps, at their own pace
STEPS = [
    [(PROMPTS[0], False), ([4], False), ([6], False), ([9, 10, 11], True), ([12], False)],
    [(PROMPTS[1], False), ([21, 22, 23, 24], True), ([25], False)],
    [([30], False), (PROMPTS[2], True), ([31], False), ([32], False), ([33], False), ([34], False)],
]


def same(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> bool:
    return all(np.array_equal(x, y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True))


@pytest.fixture(scope="module")
def lean_files(tiny_loaded, tmp_path_factory):
    folder = tmp_path_factory.mktemp("batch-lean")
    return {
        kind: lean_weights(tiny_loaded.model, kind, folder, tiny_loaded.tokenizer)
        for kind in ("float32-panels", "int8")
    }


@pytest.mark.parametrize("kind", ["float32-panels", "int8"])
@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
def test_a_sequence_in_a_batch_gets_the_bits_it_gets_alone(kernel, lean_files, kind, kv):
    runner = NativeRunner(lean_files[kind], kv_dtype=kv, threads=2)
    want = alone(runner, STEPS)
    got, caches = batched(runner, STEPS)
    assert same(got, want)
    for calls, cache in zip(STEPS, caches, strict=True):
        assert cache.ids == [t for ids, _every in calls for t in ids]


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_moe"])
def test_the_gguf_blocks_and_sliding_layers_batch_too(kernel, tmp_path, family):
    """K-quant parts, and Gemma 3's sliding layers (a window of 4: strips move on, some calls past it)."""
    path = write_gguf(tiny(family, True), tmp_path / "model.gguf", Q4_K_M)
    convert_gguf_lean(path, tmp_path / "gguf.safetensors", 128, "test")
    runner = NativeRunner(LeanWeights(tmp_path / "gguf.safetensors", "gguf", "test"), threads=2)
    assert same(batched(runner, STEPS)[0], alone(runner, STEPS))


def test_a_batch_of_one_is_a_forward(kernel, lean_files):
    runner = NativeRunner(lean_files["int8"], threads=2)
    a, b = runner.new_cache(), runner.new_cache()
    (batch,) = runner.forward_batch([(PROMPTS[0], a, False)])
    assert batch.shape == (runner.config.vocab,) and np.array_equal(batch, runner.forward(PROMPTS[0], b))


def test_a_bad_request_fails_the_call_and_writes_no_cache(kernel, lean_files):
    runner = NativeRunner(lean_files["int8"], threads=2)
    good, bad = runner.new_cache(), runner.new_cache()
    with pytest.raises(IndexError):
        runner.forward_batch([(PROMPTS[0], good, False), ([10**9], bad, False)])
    assert good.ids == [] and bad.ids == []
