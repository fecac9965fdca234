"""What every KV cache dtype of the native runner must keep, checked alike for each (tests/test_kv_q8.py,
tests/test_kv_f16.py): its logits beside the fp32 cache's over a conversation with edits, the bits of
single steps in a prefill and a draft, forks, crops and saves, and a state of another dtype refused."""

from __future__ import annotations

import random

import numpy as np

from chatcli.engine.kv.persist import fingerprint, read_cache, save_cache


def runner(weights, kv_dtype: str, threads: int | None = None):
    from chatcli.engine.runners.native import NativeRunner

    return NativeRunner(weights, kv_dtype=kv_dtype, threads=threads)


def conversation(weights, kv_dtype: str) -> tuple[float, int, int, bool]:
    """Turns of a prompt and a reply fed a token at a time, each turn after an edit of the last few
    positions (a crop where the strip still reaches, else the cache starts over, on both): the worst
    difference of the logits from the fp32 cache's (of its largest), greedy picks alike, compared, and
    whether a strip slid (true where there is none)."""
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


def assert_steps_keep_their_bits(r) -> None:
    """A prefill, a draft checked in one call and the same tokens one at a time give the same logits and
    the same cache state (every array of it)."""
    prompt, draft = list(range(3, 40)), [9, 17, 250, 4, 4, 31, 99]
    one, together = r.new_cache(), r.new_cache()
    stepwise = [r.forward([t], one) for t in prompt]
    assert np.array_equal(r.forward(prompt, together), stepwise[-1])
    assert np.array_equal(r.verify(draft, together), np.stack([r.forward([t], one) for t in draft]))
    a, b = one.state(), together.state()
    assert a.keys() == b.keys() and all(np.array_equal(a[n][1], b[n][1]) for n in a)


def assert_forks_crops_and_saves_keep_the_bits(r, tmp_path) -> None:
    cache = r.new_cache()
    for start in range(3, 80, 7):
        r.forward(list(range(start, start + 7)), cache)
    follow = [17, 23, 31]
    want = r.forward(follow, cache.clone(len(cache)))
    path, fp = tmp_path / "cache.safetensors", fingerprint(r, "tiny")
    assert save_cache(cache, path, fp)
    restored, note = read_cache(r, path, fp)
    assert note == "" and restored is not None and restored.ids == cache.ids
    assert np.array_equal(r.forward(follow, restored), want)
    near = cache.clone(len(cache) - 4)  # a fork within the strip's reach, and the cache cropped there
    cache.crop(len(cache) - 4)
    assert np.array_equal(r.forward(follow, near), r.forward(follow, cache))


def assert_refused_both_ways(one, other, tmp_path) -> None:
    """A state of `one`'s dtype into `other`'s cache and back: refused, by the file's fingerprint and,
    where the fingerprint says otherwise, by the arrays themselves."""
    for saver, reader in ((one, other), (other, one)):
        cache = saver.new_cache()
        saver.forward(list(range(3, 40)), cache)
        assert not reader.new_cache().restore(list(cache.ids), cache.state())
        path = tmp_path / f"{saver.kv_dtype}.safetensors"
        assert save_cache(cache, path, fingerprint(saver, "tiny"))
        assert fingerprint(saver, "tiny") != fingerprint(reader, "tiny")
        assert read_cache(reader, path, fingerprint(reader, "tiny")) == (None, "")
        assert save_cache(cache, path, fingerprint(reader, "tiny"))  # a file that claims the reader's dtype
        assert read_cache(reader, path, fingerprint(reader, "tiny")) == (None, "")
