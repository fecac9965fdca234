"""Every build of the compiled kernel (kernels.BUILDS: AVX-512 with VNNI, AVX2) that this CPU runs.

The rest of the suite runs the best build the CPU has; this module runs each one it can, so an
AVX-512 machine checks the AVX2 build too. A projection is exact integer dots (int8, q4, q8) or
one FMA chain per output (fp32) in either build, so the builds give the same bits there; a whole
step may sum its norms and softmax in another order, so a build tracks the torch path within
float rounding, and keeps a draft bit-equal to its single steps.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from chatcli.engine.runners import kernels
from chatcli.engine.runners.lean import LeanRunner
from chatcli.engine.runners.native import NativeRunner
from tests.test_families import family_case
from tests.test_kernel import project as project_int8_or_f32
from tests.test_kernel import reference_int8
from tests.test_lean import drive
from tests.test_quant_blocks import codes_of
from tests.test_quant_blocks import project as project_grouped
from tests.test_quant_blocks import reference as reference_grouped
from tests.tiny import build_tokenizer, lean_weights


def loaded_build(name: str) -> ctypes.CDLL:
    if kernels.compiler() is None:
        pytest.skip("no C++ compiler")
    if name not in kernels.runnable():
        from chatcli.engine.cpu import cpu_flags

        lacks = [f for f in kernels.BUILDS[name][1] if f not in cpu_flags()]
        pytest.skip(f"the {name} build needs {', '.join(lacks)}")
    lib, why = kernels.load(name)
    assert lib is not None, why
    return lib


@pytest.fixture(params=list(kernels.BUILDS))
def build(request, monkeypatch):
    """The build's library in place of `kernels.library()`, for the runners and the projections."""
    lib = loaded_build(request.param)
    monkeypatch.setattr(kernels, "library", lambda: lib)
    return request.param


@pytest.fixture(scope="module")
def files(tiny_loaded, tmp_path_factory):
    folder = tmp_path_factory.mktemp("builds")
    kinds = ("float32-dense", "float32-panels", "int8", "q4", "q8")
    return {kind: lean_weights(tiny_loaded.model, kind, folder, tiny_loaded.tokenizer) for kind in kinds}


def extreme_inputs(shape: tuple[int, int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random weights and rows, with rows that take the codes' and activations' extremes: where a byte
    product's pair sums were kept in int16 (AVX2's VPMADDUBSW), these would saturate."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal(shape).astype(np.float32)  # [n, k]
    weight[0], weight[1] = 1.0, -1.0
    weight[2, ::2], weight[2, 1::2] = 1.0, -1.0
    x = (rng.standard_normal((6, shape[1])) * 3).astype(np.float32)  # [S, k]
    x[0], x[1] = 1.0, -1.0  # int8: all 255 with the zero point 0 (or 0 with it 255); q4 / q8: all +-127
    return weight, x


@pytest.mark.parametrize("shape", [(37, 50), (48, 96), (5, 200)])
def test_each_projection_is_the_textbook_at_the_extremes(build, shape):
    weight, x = extreme_inputs(shape, 4)
    ours = project_int8_or_f32(weight, x, int8=True)
    assert np.allclose(ours, reference_int8(x, weight), rtol=1e-5, atol=1e-5)
    assert np.allclose(
        project_int8_or_f32(weight, x, int8=False), x.astype(np.float64) @ weight.T, rtol=1e-5, atol=1e-4
    )
    for bits, mins in [(4, True), (4, False), (8, False)]:
        codes = codes_of(weight, bits, mins)
        assert codes.codes.max() == (15 if bits == 4 else 255)  # the extremes are there
        ours = project_grouped(codes, *shape, x)  # through kernels.library(): this build
        want = reference_grouped(codes, shape[1], x)
        assert np.allclose(ours, want, rtol=1e-4, atol=1e-4 * np.abs(want).max()), (bits, mins)


def project_k(type_name: str, x: np.ndarray) -> np.ndarray:
    """`x`'s first 512 inputs (tiled) through random K-quant blocks, the first rows at their largest
    codes and scales (the AVX2 build's int16 sums at their bound)."""
    from tests.kquants import random_blocks
    from tests.test_kquant_blocks import matrix, project

    raw = random_blocks(40, 512, type_name, np.random.default_rng(11))
    size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[type_name]
    blocks = raw.reshape(40, 2, size)
    if type_name == "Q6_K":  # codes at their largest, scales 127 (d, the last two bytes, kept)
        blocks[:4, :, :192], blocks[:4, :, 192:208] = 0xFF, 0x7F
    else:  # codes, scales and mins at their largest (d and dmin, the first four bytes, kept)
        blocks[:4, :, 4:] = 0xFF
    m, _arrays = matrix(type_name, raw, 512)
    wide = np.tile(x, (1, -(-512 // x.shape[1])))[:, :512]
    return project(m, wide, 40)


def many_rows(x: np.ndarray, count: int = 13) -> np.ndarray:
    """`x`'s rows, then random ones, `count` in all: enough for a K-quant projection's passes over a block's codes
    unpacked once (AVX2: kUnpackRows), and a shorter pass after them."""
    extra = (np.random.default_rng(7).standard_normal((count - len(x), x.shape[1])) * 3).astype(np.float32)
    return np.vstack([x, extra])


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K"])
def test_a_build_gives_k_quant_rows_their_bits_alone(build, type_name):
    """Many rows at once (each block's codes unpacked once, or AMX's tiles from 16 rows where the CPU has them,
    and with them off) are the rows alone."""
    _weight, x = extreme_inputs((70, 160), 5)
    rows = many_rows(x, 21)
    alone = np.vstack([project_k(type_name, rows[i : i + 1]) for i in range(len(rows))])
    lib = kernels.library()
    try:
        for amx in (1, 0):  # AVX-512: AMX's tiles where the CPU has them, then its VNNI passes over unpacked codes
            lib.chatcli_amx(amx)
            assert np.array_equal(project_k(type_name, rows), alone), f"amx {amx}"
    finally:
        lib.chatcli_amx(1)


def test_the_builds_give_the_same_projection_bits():
    names = [name for name in ("avx512", "avxvnni", "avx2") if name in kernels.runnable()]  # NEON's: test_kernel_neon
    if len(names) < 2:
        pytest.skip(f"this CPU runs one x86 build at most ({', '.join(names) or 'none'})")
    libs = {name: loaded_build(name) for name in names}
    weight, x = extreme_inputs((70, 160), 5)
    outputs = {}
    for name, lib in libs.items():
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(kernels, "library", lambda lib=lib: lib)
            outputs[name] = [project_int8_or_f32(weight, x, int8=True), project_int8_or_f32(weight, x, int8=False)]
            outputs[name] += [
                project_grouped(codes_of(weight, b, mn), 70, 160, x) for b, mn in [(4, True), (4, False), (8, False)]
            ]
            outputs[name] += [project_k(type_name, many_rows(x)) for type_name in ("Q4_K", "Q5_K", "Q6_K")]
    first, *others = outputs.values()
    for other in others:
        assert all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("kv_dtype, rel", [("float32", 1e-4), ("bfloat16", 2e-2)])
def test_a_build_tracks_the_torch_path_over_crops(build, files, tiny_loaded, kv_dtype, rel):
    torch_path = LeanRunner(files["float32-dense"], kv_dtype=getattr(torch, kv_dtype))
    native = NativeRunner(files["float32-panels"], kv_dtype=kv_dtype)
    vocab = tiny_loaded.model.config.vocab_size
    assert drive(torch_path, native, vocab, 5, steps=40, limit=native.context_limit, rel=rel) > 10


@pytest.mark.parametrize("weights", ["float32-panels", "int8", "q4", "q8"])
def test_a_build_keeps_drafts_and_prefills_exact(build, files, weights):
    runner = NativeRunner(files[weights], kv_dtype="bfloat16", threads=2)
    prompt, draft = list(range(3, 45)), [9, 17, 250, 4, 4, 31]
    one, together = runner.new_cache(), runner.new_cache()
    stepwise_prompt = [runner.forward([t], one) for t in prompt]
    assert np.array_equal(runner.forward(prompt, together), stepwise_prompt[-1])
    stepwise = np.stack([runner.forward([t], one) for t in draft])
    assert np.array_equal(runner.verify(draft, together), stepwise)
    if weights != "float32-panels":  # and quantized, close to fp32
        fp32 = NativeRunner(files["float32-panels"], kv_dtype="bfloat16")
        a = fp32.forward(prompt, fp32.new_cache())
        assert 0 < float(np.linalg.norm(a - stepwise_prompt[-1]) / np.linalg.norm(a)) < 0.35


@pytest.mark.parametrize("name", ["gemma2", "qwen2"])
def test_a_build_runs_the_families_extras(build, tmp_path_factory, name):
    """Soft-capped scores and logits, GeGLU, sandwich norms and sliding layers (Gemma 2); q/k/v biases
    (Qwen2): against transformers, prefills, steps and crops."""
    tokenizer = build_tokenizer()
    _, _, files, ref = family_case(name, tokenizer, tmp_path_factory, ("float32-panels",))
    native = NativeRunner(files["float32-panels"])
    assert drive(ref, native, len(tokenizer), 3, steps=30, limit=ref.context_limit, rel=1e-4) > 10


def test_the_environment_picks_a_build(monkeypatch):
    from chatcli.engine.cpu import cpu_flags

    for name, (_, needs) in kernels.BUILDS.items():
        monkeypatch.setenv(kernels.ENV, name)
        kernels.library.cache_clear()
        try:
            lib = kernels.library()
            if name in kernels.runnable() and kernels.compiler() is not None:
                assert lib is not None and f"decode-{name}-" in lib._name, kernels.why_not()
            elif name not in kernels.runnable():
                lacks = ", ".join(f for f in needs if f not in cpu_flags())
                assert lib is None and kernels.why_not() == f"{kernels.ENV}={name}: the CPU lacks {lacks}"
        finally:
            monkeypatch.delenv(kernels.ENV)
            kernels.library.cache_clear()
