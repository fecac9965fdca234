"""A conversation's KV cache on disk: restored exactly, ignored when it does not fit."""

from __future__ import annotations

import os

import numpy as np
import pytest

from chatcli.engine.engine import common_prefix
from chatcli.engine.kv.persist import fingerprint, read_cache, save_cache, trim_folder
from chatcli.engine.sample.sampling import SamplingParams
from tests.conftest import require_kernel


def turn(engine, session, messages):
    return list(engine.generate(messages, session, SamplingParams(temperature=0, max_tokens=8)))[-1]


def test_saved_cache_continues_exactly(tiny_engine, tmp_path):
    fp = fingerprint(tiny_engine.runner, "tiny")
    session = tiny_engine.new_session()
    messages = [{"role": "user", "content": "Hello there"}]
    done = turn(tiny_engine, session, messages)
    path = tmp_path / "c.safetensors"
    assert save_cache(session.cache, path, fp)

    restored = tiny_engine.new_session()
    restored.cache = read_cache(tiny_engine.runner, path, fp)[0]
    assert restored.cache is not None and restored.cache.ids == session.cache.ids
    messages += [{"role": "assistant", "content": done.reply}, {"role": "user", "content": "again"}]
    a = turn(tiny_engine, restored, messages)
    b = turn(tiny_engine, tiny_engine.new_session(), messages)
    assert a.stats.cached_tokens == common_prefix(session.cache.ids, tiny_engine.tokenizer.encode_chat(messages)) > 0
    assert a.reply == b.reply
    probe = tiny_engine.tokenizer.encode_chat(messages)
    restored.cache.crop(len(probe) - 1)
    cached = tiny_engine.runner.forward(probe[len(restored.cache) :], restored.cache)
    full = tiny_engine.runner.forward(probe, tiny_engine.runner.new_cache())
    np.testing.assert_allclose(cached, full, atol=1e-4, rtol=1e-4)


def test_foreign_or_damaged_files_are_ignored(tiny_engine, tmp_path):
    fp = fingerprint(tiny_engine.runner, "tiny")
    session = tiny_engine.new_session()
    turn(tiny_engine, session, [{"role": "user", "content": "Hi"}])
    path = tmp_path / "c.safetensors"
    save_cache(session.cache, path, fp)
    assert read_cache(tiny_engine.runner, path, fingerprint(tiny_engine.runner, "other-model"))[0] is None
    data = bytearray(path.read_bytes())
    data[:64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    assert read_cache(tiny_engine.runner, path, fp)[0] is None
    save_cache(session.cache, path, fp)
    path.write_bytes(path.read_bytes()[:-100])  # truncated
    assert read_cache(tiny_engine.runner, path, fp)[0] is None
    assert read_cache(tiny_engine.runner, tmp_path / "missing.safetensors", fp)[0] is None


@pytest.mark.parametrize("kernel", [False, True])
def test_file_from_the_other_runner_is_ignored(tiny_loaded, tmp_path, kernel):
    from chatcli.engine.load.hf import build_engine

    if kernel:
        require_kernel()
    hf = build_engine(tiny_loaded, runner="hf")
    lean = build_engine(tiny_loaded, runner="lean", kv_dtype="float32", kernel=kernel)
    for a, b in ((hf, lean), (lean, hf)):
        session = a.new_session()
        turn(a, session, [{"role": "user", "content": "Hi"}])
        path = tmp_path / "c.safetensors"
        save_cache(session.cache, path, fingerprint(a.runner, "tiny"))
        assert fingerprint(a.runner, "tiny") != fingerprint(b.runner, "tiny")
        assert read_cache(b.runner, path, fingerprint(b.runner, "tiny"))[0] is None


@pytest.mark.parametrize("kernel", [False, True])
def test_file_from_another_cache_dtype_or_quantization_is_ignored(tiny_loaded, tmp_path, kernel):
    from chatcli.engine.load.hf import build_engine

    if kernel:
        require_kernel()
    fp32 = build_engine(tiny_loaded, runner="lean", kv_dtype="float32", kernel=kernel)
    session = fp32.new_session()
    turn(fp32, session, [{"role": "user", "content": "Hi"}])
    path = tmp_path / "c.safetensors"
    assert save_cache(session.cache, path, fingerprint(fp32.runner, "tiny"))
    for other in (
        build_engine(tiny_loaded, runner="lean", kv_dtype="bfloat16", kernel=kernel),
        build_engine(tiny_loaded, runner="lean", quantize="int8", kv_dtype="float32", kernel=kernel),
    ):
        assert fingerprint(other.runner, "tiny") != fingerprint(fp32.runner, "tiny")
        assert read_cache(other.runner, path, fingerprint(other.runner, "tiny"))[0] is None
    assert read_cache(fp32.runner, path, fingerprint(fp32.runner, "tiny"))[0] is not None


def test_too_large_is_not_written(tiny_engine, tmp_path):
    session = tiny_engine.new_session()
    turn(tiny_engine, session, [{"role": "user", "content": "Hi"}])
    path = tmp_path / "c.safetensors"
    path.write_bytes(b"stale")
    assert not save_cache(session.cache, path, "fp", max_bytes=16)
    assert not path.exists()  # the stale file went too


def test_trim_folder_drops_oldest(tmp_path):
    for i in range(4):
        p = tmp_path / f"{i}.safetensors"
        p.write_bytes(b"x" * 100)
        os.utime(p, (i, i))
    trim_folder(tmp_path, budget=250)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2.safetensors", "3.safetensors"]
