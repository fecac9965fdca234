"""The fp16 KV cache (`--kv-dtype float16`, llama.cpp's default cache) on the native runner.

On tiny random models: a Qwen3 and a Gemma 3 (sliding layers on a strip that slides, shrunk as in
test_sliding). Over a conversation of prompts, replies and edits the logits stay within `TOLERANCE` of the
largest fp32-cache logit, closer than the bf16 cache's; the keys it holds are the fp32 cache's rounded to
the nearest half; a prefill, a draft and single steps give the same bits on every build this CPU runs;
forks, crops and a save to disk and back keep the bits; a bf16 state (the same bytes) is refused, never
misread; it holds the bytes bf16 holds; and the loader runs it on the kernel.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from chatcli.engine.kv import memory as kv_memory
from chatcli.engine.kv.persist import fingerprint, read_cache, save_cache
from chatcli.engine.load.hf import build_engine
from tests.conftest import require_kernel
from tests.test_kernel_builds import build  # noqa: F401 - the fixture: each build this CPU runs
from tests.tiny import build_family, build_tokenizer, lean_weights

TOLERANCE = 2e-3  # of the largest fp32-cache logit, over the whole conversation (measured: 6e-4; bf16: 4.2e-3)
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
    """A family's fp32 panels."""
    require_kernel()
    model = build_family(request.param, len(tokenizer))
    return lean_weights(model, "float32-panels", tmp_path_factory.mktemp(request.param), tokenizer)


def runner(weights, kv_dtype: str, threads: int | None = None):
    from chatcli.engine.runners.native import NativeRunner

    return NativeRunner(weights, kv_dtype=kv_dtype, threads=threads)


def conversation(weights, kv_dtype: str) -> tuple[float, int, int, bool]:
    """Turns of a prompt and a reply fed a token at a time, each turn after an edit of the last few
    positions (a crop where the strip still reaches, else the cache starts over, on both): the worst
    difference of the logits from the fp32 cache's (of its largest), greedy picks alike, compared, slid."""
    fp32, other = runner(weights, "float32"), runner(weights, kv_dtype)
    vocab = weights.config.vocab
    ours, ref = other.new_cache(), fp32.new_cache()
    rng = random.Random(5)
    worst, same, compared, slid = 0.0, 0, 0, False
    for _turn in range(5):
        keep = ours.reachable(max(0, len(ours) - rng.randrange(1, 6)))
        ours.crop(keep), ref.crop(keep)
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(5, 14))]
        for ids in [prompt, *([rng.randrange(3, vocab)] for _ in range(8))]:
            a, b = fp32.forward(ids, ref), other.forward(ids, ours)
            worst = max(worst, float(np.abs(a - b).max() / np.abs(a).max()))
            same += int(a.argmax() == b.argmax())
            compared += 1
            slid |= ours.strip is not None and ours.strip.base > 0
        assert ours.ids == ref.ids
    return worst, same, compared, slid or ours.strip is None


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
    f16 = runner(weights, "float16", threads)
    prompt, draft = list(range(3, 40)), [9, 17, 250, 4, 4, 31, 99]
    one, together = f16.new_cache(), f16.new_cache()
    stepwise = [f16.forward([t], one) for t in prompt]
    assert np.array_equal(f16.forward(prompt, together), stepwise[-1])
    assert np.array_equal(f16.verify(draft, together), np.stack([f16.forward([t], one) for t in draft]))
    a, b = one.state(), together.state()
    assert a.keys() == b.keys() and all(np.array_equal(a[n][1], b[n][1]) for n in a)


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
    f16 = runner(weights, "float16")
    cache = f16.new_cache()
    for start in range(3, 80, 7):
        f16.forward(list(range(start, start + 7)), cache)
    follow = [17, 23, 31]
    want = f16.forward(follow, cache.clone(len(cache)))
    path, fp = tmp_path / "cache.safetensors", fingerprint(f16, "tiny")
    assert save_cache(cache, path, fp)
    restored, note = read_cache(f16, path, fp)
    assert note == "" and restored is not None and restored.ids == cache.ids
    assert np.array_equal(f16.forward(follow, restored), want)
    near = cache.clone(len(cache) - 4)  # a fork within the strip's reach, and the cache cropped there
    cache.crop(len(cache) - 4)
    assert np.array_equal(f16.forward(follow, near), f16.forward(follow, cache))


def test_a_bf16_cache_is_refused_not_misread(weights, tmp_path):
    """Both hold 2 bytes an element: a state of the one into the other is refused, by the file's
    fingerprint and, where the fingerprint says otherwise, by the arrays' code."""
    bf16, f16 = runner(weights, "bfloat16"), runner(weights, "float16")
    for saver, reader in ((bf16, f16), (f16, bf16)):
        cache = saver.new_cache()
        saver.forward(list(range(3, 40)), cache)
        assert not reader.new_cache().restore(list(cache.ids), cache.state())
        path = tmp_path / f"{saver.kv_dtype}.safetensors"
        assert save_cache(cache, path, fingerprint(saver, "tiny"))
        assert fingerprint(saver, "tiny") != fingerprint(reader, "tiny")
        assert read_cache(reader, path, fingerprint(reader, "tiny")) == (None, "")
        assert save_cache(cache, path, fingerprint(reader, "tiny"))  # a file that claims the reader's dtype
        assert read_cache(reader, path, fingerprint(reader, "tiny")) == (None, "")


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
