"""A GGUF's Q4_K and Q6_K rows read as the file holds them (the kernel's WEIGHT_RAW_Q4K / _Q6K, project_raw.h).

Each block of 16 rows is put into the repacked layout as a projection reaches it, so a raw matrix must give
the bits of the same rows repacked (`kquant_blocks.tensor_parts`), in every build, for any number of rows
(a decode step's one, a prompt's chunk), a last block of fewer than 16 rows, and extreme codes and scales.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from chatcli.engine.runners.kernels.structs import WEIGHT_RAW_MXFP4, WEIGHT_RAW_Q4K, WEIGHT_RAW_Q6K, Matrix
from tests.kquants import random_blocks
from tests.test_kquant_blocks import dequantized, extreme_blocks, matrix, project, textbook

pytest.importorskip("gguf")

RAW = {"Q4_K": WEIGHT_RAW_Q4K, "Q6_K": WEIGHT_RAW_Q6K, "MXFP4": WEIGHT_RAW_MXFP4}


def raw_matrix(type_name: str, raw: np.ndarray, k: int) -> Matrix:
    return Matrix(RAW[type_name], len(raw), k, k, raw.ctypes.data)


@pytest.mark.parametrize("type_name", list(RAW))
@pytest.mark.parametrize(("n", "rows"), [(32, 1), (48, 3), (40, 9), (24, 17)])
def test_raw_rows_give_the_repacked_rows_bits_in_each_build(build, type_name, n, rows):
    rng = np.random.default_rng(n * 31 + rows)
    k = 2880 if type_name == "MXFP4" else 768  # gpt-oss's width: 90 groups of 32
    raw = (
        random_blocks(n, k, type_name, rng)
        if rows % 2 or type_name == "MXFP4"
        else extreme_blocks(type_name, n, k, rng)
    )
    if type_name == "MXFP4" and rows == 3:  # every E8M0 scale's edge: the subnormal 0 and 1, the largest here
        raw.reshape(n, k // 32, 17)[0, :3, 0] = [0, 1, 140]
    x = (rng.standard_normal((rows, k)) * 2).astype(np.float32)
    packed, _arrays = matrix(type_name, raw, k)
    got = project(raw_matrix(type_name, raw, k), x, n)
    assert np.array_equal(got, project(packed, x, n))
    want = textbook(x, dequantized(type_name, raw, k))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_raw_row_gets_the_same_bits_alone_or_with_others():
    rng = np.random.default_rng(5)
    raw = random_blocks(32, 512, "Q4_K", rng)
    x = rng.standard_normal((12, 512)).astype(np.float32)
    m = raw_matrix("Q4_K", raw, 512)
    together = project(m, x, 32)
    assert all(np.array_equal(project(m, x[s : s + 1], 32)[0], together[s]) for s in range(12))


def moe_runner(tmp_path, family: str, raw: bool, name: str = "lean"):
    """A tiny Q4_K_M mixture's GGUF (tmp_path/moe.gguf, written once; gpt-oss: MXFP4 experts) on the native runner,
    its experts left in the GGUF (`raw`) or repacked into the lean file."""
    from chatcli.engine.runners.native import NativeRunner
    from chatcli.engine.weights.gguf_lean import convert_gguf_lean
    from chatcli.engine.weights.lean_file import LeanWeights
    from tests.gguf_models import Q4_K_M, tiny, write_gguf
    from tests.gguf_oai import tiny_gptoss, write_gptoss

    path = tmp_path / "moe.gguf"
    if not path.exists() and family == "gpt_oss":
        write_gptoss(tiny_gptoss(4), path, "MXFP4")
    elif not path.exists():
        write_gguf(tiny(family, False, seed=1), path, Q4_K_M)
    lean = tmp_path / f"{name}.safetensors"
    if not lean.exists():
        convert_gguf_lean(path, lean, 128, "test", raw_experts=raw)
    weights = LeanWeights(lean, "gguf", "test")
    weights.gguf = path
    return NativeRunner(weights, threads=2)


def logits(runner) -> np.ndarray:
    """A prefill of 8, then single steps, over IDS."""
    from tests.gguf_runs import IDS

    cache = runner.new_cache()
    return np.concatenate([runner.verify(IDS[:8], cache), *(runner.verify([t], cache) for t in IDS[8:])])


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_experts_left_in_the_gguf_give_the_repacked_files_bits(build, tmp_path, family):
    """A Q4_K_M mixture (gpt-oss: MXFP4 experts) whose experts stay in its GGUF (`raw_experts`): the lean file holds
    none of their arrays,
    its logits over a prompt's chunk and single steps are the repacked file's, bit for bit, and a GGUF that is not
    the one it was written from is refused."""
    from chatcli.engine.runners.native import NativeRunner
    from chatcli.engine.weights.lean_file import LeanFileError, LeanWeights
    from tests.gguf_models import tiny, write_gguf

    packed, raw = moe_runner(tmp_path, family, False, "packed"), moe_runner(tmp_path, family, True)
    assert raw.config.raw_experts and not packed.config.raw_experts

    def experts(name: str) -> bool:  # an experts' projection's array (not gpt-oss's experts_bias)
        return ".experts_gate_up." in name or ".experts_down." in name

    assert not any(experts(name) for name in raw.weights.file.tensors)
    repacked = sum(packed.weights.file.tensors[n].nbytes for n in packed.weights.file.tensors if experts(n))
    assert raw.weight_bytes == packed.weight_bytes - repacked + raw._experts.raw_bytes
    assert np.array_equal(logits(raw), logits(packed))
    other = write_gguf(tiny("qwen3_moe", False, seed=1), tmp_path / "other.gguf", "Q8_0")
    weights = LeanWeights(tmp_path / "lean.safetensors", "gguf", "test")
    weights.gguf = other
    with pytest.raises(LeanFileError, match="not the one it was written from"):
        NativeRunner(weights, threads=2)


def test_the_experts_are_repacked_a_layer_at_a_time_behind_the_runner(kernel, tmp_path, monkeypatch):
    """The runner reads the GGUF's rows until a process of their own has repacked each layer into its file; it then
    reads that file, with the same bits; a later start reads every layer from its file, and a layer whose file was
    damaged is read from the GGUF again and repacked again."""
    from chatcli.engine.runners import native_experts
    from chatcli.engine.weights.gguf_experts import layer_path
    from chatcli.engine.weights.sidecar import path_of

    monkeypatch.setattr(native_experts, "POLL_S", 0.0)
    runner = moe_runner(tmp_path, "qwen3_moe", True)
    want = logits(runner)
    assert runner._experts.pending == [0, 1]
    assert "CHATCLI_REPACK_EXPERTS is off" in runner.repacking_note()  # no process yet
    runner.start_repacking()
    assert runner.repacking_note().startswith("0 of 2 layers' experts are repacked")
    for _ in range(600):  # ~60 s at most: the poll is on each forward
        if not runner._experts.pending:
            break
        runner.verify([5], runner.new_cache())
        time.sleep(0.1)
    assert runner._experts.pending == [] and runner._experts.process is None and runner.repacking_note() == ""
    assert all(layer_path(tmp_path / "lean.safetensors", i).is_file() for i in (0, 1))
    assert np.array_equal(logits(runner), want)
    again = moe_runner(tmp_path, "qwen3_moe", True)
    assert again._experts.pending == [] and np.array_equal(logits(again), want)
    damaged = layer_path(tmp_path / "lean.safetensors", 1)
    with open(damaged, "r+b") as f:
        f.truncate(damaged.stat().st_size - 64)
    assert path_of(damaged).exists()
    third = moe_runner(tmp_path, "qwen3_moe", True)
    assert third._experts.pending == [1] and np.array_equal(logits(third), want)


def test_no_repacking_where_it_is_turned_off_or_its_runner_is_gone(kernel, tmp_path, monkeypatch):
    from chatcli.engine.runners import native_experts
    from chatcli.engine.weights.gguf_experts import layer_path

    runner = moe_runner(tmp_path, "qwen3_moe", True)
    monkeypatch.setenv("CHATCLI_REPACK_EXPERTS", "off")
    runner.start_repacking()
    assert runner._experts.process is None
    lean = tmp_path / "lean.safetensors"
    assert native_experts.main([str(lean), str(tmp_path / "moe.gguf"), str(os.getppid() + 1)]) == 0
    assert not layer_path(lean, 0).exists()


def test_a_users_start_repacks_and_verify_rehashes_the_experts_files(kernel, tmp_path, monkeypatch):
    """`load_engine` on a Q4_K_M mixture leaves its experts in the GGUF (on the AVX-512 build) and repacks them
    behind the runner; `chatcli pull --verify` rehashes each layer's file and removes one whose bytes changed with
    its mtime put back, which the next start then reads from the GGUF again."""
    from chatcli.engine import verify_model_files
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from chatcli.engine.runners import kernels, native_experts
    from tests.gguf_models import Q4_K_M, tiny, write_gguf

    monkeypatch.setattr(kernels, "build_name", lambda: "avx512")  # the build that leaves them (any build reads them)
    monkeypatch.setattr(native_experts, "POLL_S", 0.0)
    path = write_gguf(tiny("qwen3_moe", False, seed=1), tmp_path / "moe.gguf", Q4_K_M)
    runner = load_engine(str(path), LoadOptions(device="cpu")).runner
    assert runner.config.raw_experts and path in runner.files()
    for _ in range(600):
        if not runner._experts.pending:
            break
        runner.verify([5], runner.new_cache())
        time.sleep(0.1)
    assert runner._experts.pending == []
    layer = sorted(runner.weights.file.path.parent.glob("*.experts-1.safetensors"))[0]
    st = layer.stat()
    with open(layer, "r+b") as f:  # other bytes, the size and mtime put back
        f.seek(st.st_size - 4096)
        f.write(b"\x17" * 4096)
    os.utime(layer, ns=(st.st_atime_ns, st.st_mtime_ns))
    checks = {c.path.name: c.problem for c in verify_model_files(str(path))}
    assert checks[runner.weights.file.path.name] == "" and checks[layer.name.replace("-1.", "-0.")] == ""
    assert "BLAKE3" in checks[layer.name] and not layer.exists()
    monkeypatch.setenv("CHATCLI_REPACK_EXPERTS", "off")
    assert load_engine(str(path), LoadOptions(device="cpu")).runner._experts.pending == [1]


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
def test_the_kernels_packing_of_whole_blocks_is_numpys_at_the_extremes(build, type_name):
    """`chatcli_pack` packs each whole block of 16 Q4_K / Q6_K rows through the raw rows' transposes on AVX-512
    (project_raw.h: pack_kquant_rows), a last short block row by row: numpy's bytes either way, in each build."""
    from chatcli.engine.runners import kernels
    from chatcli.engine.weights import kquant_blocks as kb

    raw = extreme_blocks(type_name, 40, 768, np.random.default_rng(8))
    _kind, ours = kb.tensor_parts(type_name, raw, packer=kernels.library())  # the build's
    _kind, want = kb.tensor_parts(type_name, raw)
    for key, array in ours.items():
        flat, reference = array.view(np.uint8).ravel(), want[key].view(np.uint8).ravel()
        assert np.array_equal(flat, reference[: flat.size]) and not reference[flat.size :].any(), key


def test_the_repacking_process_is_reaped_as_it_ends_without_a_forward(kernel, tmp_path):
    """An idle runner (a server between requests) leaves no zombie once its repacking process is done; the next
    forward then takes every layer up."""
    from chatcli.engine.weights.gguf_experts import layer_path

    runner = moe_runner(tmp_path, "qwen3_moe", True)
    want = logits(runner)
    runner.start_repacking()
    process = runner._experts.process
    for _ in range(600):  # ~60 s at most, with no forward meanwhile
        if process.returncode is not None:
            break
        time.sleep(0.1)
    assert process.returncode == 0 and not os.path.exists(f"/proc/{process.pid}")
    assert all(layer_path(tmp_path / "lean.safetensors", i).is_file() for i in (0, 1))
    assert runner._experts.pending == [0, 1]  # taken up by the next forward only
    assert np.array_equal(logits(runner), want)
    assert runner._experts.pending == [] and runner._experts.process is None
