"""A damaged cache gives no wrong answers: a compiled kernel is checked against its sidecar before
it is mapped (and built again where it does not match), and `chatcli pull --verify` rehashes the
files a start trusts on their size and mtime, converting again the damaged ones."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import blake3
import numpy as np
import pytest
from click.testing import CliRunner

from chatcli.cli import app
from chatcli.engine.runners import kernels
from chatcli.engine.weights import sidecar
from chatcli.engine.weights.tensorfile import MappedTensors

# -- the compiled kernel ----------------------------------------------------------------------


@pytest.fixture
def own_kernel_cache(kernel, tmp_path, monkeypatch):
    """A cache dir of this test's own holding a copy of the session's build (with its sidecar), and
    fresh `kernels.load` / `kernels.library` caches (the session's come back after the test).
    Returns (the copy, the intact bytes, the build's name)."""
    name = kernels.build_name()
    built = kernels.library_path(kernels.compiler(), name)
    assert kernels.intact(built)
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(kernels.ENV, name)  # the same build in a subprocess
    copy = kernels.library_path(kernels.compiler(), name)
    copy.parent.mkdir(parents=True)
    shutil.copy2(built, copy)
    shutil.copy2(sidecar.path_of(built), sidecar.path_of(copy))
    monkeypatch.setattr(kernels, "load", functools.cache(kernels.load.__wrapped__))
    monkeypatch.setattr(kernels, "library", functools.lru_cache(maxsize=1)(kernels.library.__wrapped__))
    monkeypatch.setattr(kernels, "_reason", "")
    monkeypatch.setattr(kernels, "_build", "")
    return copy, built.read_bytes(), name


def truncate_to_half(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


PROJECT_IN_A_SUBPROCESS = """
import numpy as np
from chatcli.engine.runners import kernels
from tests.test_kernel import project

assert kernels.library() is not None, kernels.why_not()
rng = np.random.default_rng(0)
w = rng.standard_normal((37, 50)).astype(np.float32)
x = rng.standard_normal((3, 50)).astype(np.float32)
y = project(w, x, int8=False)
assert np.allclose(y, x @ w.T, rtol=1e-4, atol=1e-4), float(np.abs(y - x @ w.T).max())
print("projected")
"""


def test_a_truncated_build_is_built_again_before_it_is_mapped(own_kernel_cache):
    copy, good, _name = own_kernel_cache
    truncate_to_half(copy)
    # in a subprocess: mapping the truncated file would end it with a bus error (-7), not fail an assert here
    done = subprocess.run(
        [sys.executable, "-c", PROJECT_IN_A_SUBPROCESS], capture_output=True, text=True, timeout=600, cwd=Path.cwd()
    )
    assert done.returncode == 0 and "projected" in done.stdout, (done.returncode, done.stderr[-2000:])
    assert copy.stat().st_size == len(good) and kernels.intact(copy)  # built again, recorded again


@pytest.fixture
def mapped(own_kernel_cache, monkeypatch):
    """`ctypes.CDLL` stood in by a recorder of (path, whether it matched its sidecar then): the tests
    in this process map nothing (a damaged build could crash pytest; the subprocess test maps)."""
    seen = []

    def cdll(path, *_a, **_k):
        seen.append((Path(path), kernels.intact(Path(path))))
        functions = ("chatcli_decode", "chatcli_decode_batch", "chatcli_project", "chatcli_pack", "chatcli_tolerant")
        functions += ("chatcli_taken_over", "chatcli_split_units", "chatcli_fail_thread")
        return types.SimpleNamespace(**{f: types.SimpleNamespace() for f in functions})

    monkeypatch.setattr(kernels.ctypes, "CDLL", cdll)
    return seen


@pytest.fixture
def fake_compiler(own_kernel_cache, mapped, monkeypatch):
    """The compiler stood in by a copy of the session's build (seconds saved); counts its runs."""
    copy, good, _name = own_kernel_cache
    runs = []

    def run(cmd, **_kw):
        runs.append(cmd)
        Path(cmd[cmd.index("-o") + 1]).write_bytes(good)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(
        kernels, "subprocess", types.SimpleNamespace(run=run, SubprocessError=subprocess.SubprocessError)
    )
    return runs


@pytest.mark.parametrize("damage", ["no sidecar", "truncated", "flipped bytes", "garbled sidecar"])
def test_a_build_that_does_not_match_its_sidecar_is_built_again_once(own_kernel_cache, fake_compiler, mapped, damage):
    copy, good, name = own_kernel_cache
    if damage == "no sidecar":  # a build from a chatcli that wrote none
        sidecar.path_of(copy).unlink()
    elif damage == "truncated":
        truncate_to_half(copy)
    elif damage == "flipped bytes":  # same size, and the mtime put back
        st = copy.stat()
        copy.write_bytes(good[:4096] + bytes(b ^ 0xFF for b in good[4096:4160]) + good[4160:])
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        sidecar.path_of(copy).write_text("{not json")
    assert not kernels.intact(copy)
    lib, why = kernels.load(name)
    assert lib is not None, why
    assert len(fake_compiler) == 1 and copy.read_bytes() == good and kernels.intact(copy)
    record = json.loads(sidecar.path_of(copy).read_text())  # its mtime moves on with each use (not stale)
    assert set(record) == {"size", "mtime_ns", "blake3"}
    assert (record["size"], record["blake3"]) == (len(good), blake3.blake3(copy.read_bytes()).hexdigest())
    kernels.load.cache_clear()  # the next start: nothing to build
    assert kernels.load(name)[0] is not None and len(fake_compiler) == 1
    assert mapped == [(copy, True), (copy, True)]  # only ever the intact build


def test_a_build_that_fails_the_check_is_never_mapped(own_kernel_cache, mapped, monkeypatch):
    copy, _good, name = own_kernel_cache
    truncate_to_half(copy)

    def broken_compiler(cmd, **_kw):
        return subprocess.CompletedProcess(cmd, 1, "", "decode.cpp:1: error: no compiler today")

    monkeypatch.setattr(
        kernels, "subprocess", types.SimpleNamespace(run=broken_compiler, SubprocessError=subprocess.SubprocessError)
    )
    lib, why = kernels.load(name)
    assert lib is None and "did not build" in why and "no compiler today" in why
    assert mapped == []


def test_the_intact_build_is_mapped_without_a_build(own_kernel_cache, fake_compiler, mapped):
    copy, _good, name = own_kernel_cache
    assert kernels.load(name)[0] is not None and fake_compiler == [] and mapped == [(copy, True)]


# -- chatcli pull --verify ---------------------------------------------------------------------


def logits_of(model: str) -> np.ndarray:
    from chatcli.engine.load.build import load_engine

    runner = load_engine(model).runner
    return np.asarray(runner.forward([1, 5, 9, 14, 3], runner.new_cache()), dtype=np.float32)


def damage_keeping_mtime(path: Path, tensor: str) -> None:
    """Negate the first floats of `tensor` in place (sign bits), then put the mtime back."""
    info = MappedTensors(path).tensors[tensor]
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(info.offset)
        data = bytearray(f.read(1024))
        for i in range(3, len(data), 4):
            data[i] ^= 0x80
        f.seek(info.offset)
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_pull_verify_finds_flipped_bytes_with_the_mtime_put_back_and_converts_again(
    tiny_model_dir, tmp_path, monkeypatch
):
    kernels.library()  # the session's build, before the cache dir moves (none is built there)
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    cli = CliRunner()
    model = str(tiny_model_dir)
    pulled = cli.invoke(app, ["pull", "-m", model])
    assert pulled.exit_code == 0, pulled.output
    files = [Path(line.split(" (")[0].strip()) for line in pulled.output.splitlines() if line.startswith("  ")]
    assert files and all(p.is_file() for p in files)
    before = logits_of(model)

    intact = cli.invoke(app, ["pull", "--verify", "-m", model])
    assert intact.exit_code == 0, intact.output
    assert [line.split()[:2] for line in intact.output.splitlines() if line.startswith(("ok", "damaged"))] == [
        ["ok", str(p)] for p in files
    ]

    damage_keeping_mtime(files[0], "head")
    assert sidecar.unchanged(files[0])  # a start trusts it: same size, same mtime
    assert not np.array_equal(logits_of(model), before)  # and answers wrongly

    verified = cli.invoke(app, ["pull", "--verify", "-m", model])
    assert verified.exit_code == 0, verified.output
    damaged = [line for line in verified.output.splitlines() if line.startswith("damaged")]
    assert len(damaged) == 1 and str(files[0]) in damaged[0] and "BLAKE3" in damaged[0]
    assert "converted again" in verified.output
    assert sidecar.check(files[0]) == ""  # converted again, recorded again
    np.testing.assert_array_equal(logits_of(model), before)

    again = cli.invoke(app, ["pull", "--verify", "-m", model])
    assert again.exit_code == 0 and "damaged" not in again.output and "ok " in again.output


def test_pull_verify_names_a_missing_model_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    out = CliRunner().invoke(app, ["pull", "--verify", "-m", str(tmp_path / "missing.gguf")])
    assert out.exit_code == 1 and "model file not found" in str(out.exception)  # main() prints it in one line
