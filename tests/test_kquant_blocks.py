"""A GGUF's own blocks of every type the kernel runs (kquant_blocks, the kernel's `kquant_block`).

Each type's decoding is checked against the `gguf` package's own dequantizer on random blocks, and
the kernel's projection against the textbook: the activations int8 per row and group of 32 (scale
amax/127), times the weights exactly as the file holds them, summed in float64. Parts of several
types stacked along the outputs (a fused projection of a Q4_K_M file) give each part's columns.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from chatcli.engine.runners import kernels
from chatcli.engine.runners.native import block_matrix, parts_matrix
from chatcli.engine.weights import kquant_blocks as kb
from tests.kquants import random_blocks

gguf = pytest.importorskip("gguf")

TYPES = ["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "Q8_0", "Q4_0", "Q4_1"]


def dequantized(type_name: str, raw: np.ndarray, k: int) -> np.ndarray:
    return gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, type_name)).reshape(len(raw), k)


def matrix(type_name: str, raw: np.ndarray, k: int, kp: int | None = None):
    kind, arrays = kb.tensor_parts(type_name, raw)
    m = block_matrix(kind, len(raw), k, kp or k, lambda key: arrays[key].ctypes.data if key in arrays else None)
    return m, arrays


def textbook(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """int8 activations per group of 32 (round half to even, as the kernel's cvtps), float64 sums."""
    s, k = x.shape
    g = x.reshape(s, k // 32, 32)
    amax = np.abs(g).max(-1)
    step = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    xq = np.clip(np.rint(g * (np.float32(1) / step)[..., None]), -128, 127)
    return (xq * step[..., None]).reshape(s, k).astype(np.float64) @ weight.astype(np.float64).T


def project(m, x: np.ndarray, n: int, threads: int = 2) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    y = np.zeros((len(x), n), np.float32)
    assert kernels.library().chatcli_project(ctypes.byref(m), x.ctypes.data, len(x), y.ctypes.data, threads) == 0
    return y


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_blocks_decode_to_the_gguf_packages_values(type_name):
    raw = random_blocks(21, 512, type_name, np.random.default_rng(3))
    got = kb.decode_k(type_name, raw).dequantized()
    assert np.array_equal(got, dequantized(type_name, raw, 512))


@pytest.mark.parametrize("type_name", ["Q5_0", "Q5_1"])
def test_q5_blocks_become_exact_byte_codes(type_name):
    raw = random_blocks(9, 96, type_name, np.random.default_rng(4))
    assert np.array_equal(kb.decode_q5(type_name, raw).dequantized(96), dequantized(type_name, raw, 96))


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n,rows", [(40, 1), (37, 5), (16, 9)])
def test_each_types_projection_is_the_textbook(kernel, type_name, n, rows):
    rng = np.random.default_rng(n + rows)
    k = 512
    raw = random_blocks(n, k, type_name, rng)
    m, _arrays = matrix(type_name, raw, k)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[0, :40] = 0  # an all-zero group
    want = textbook(x, dequantized(type_name, raw, k))
    np.testing.assert_allclose(project(m, x, n), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_a_row_gets_the_same_bits_alone_or_with_others(kernel):
    rng = np.random.default_rng(7)
    raw = random_blocks(48, 768, "Q6_K", rng)
    m, _arrays = matrix("Q6_K", raw, 768)
    x = rng.standard_normal((7, 768)).astype(np.float32)
    together = project(m, x, 48)
    for s in range(7):
        assert np.array_equal(project(m, x[s : s + 1], 48, threads=1)[0], together[s])


def test_parts_of_several_types_fill_their_own_columns(kernel):
    rng = np.random.default_rng(8)
    k, types, sizes = 256, ["Q4_K", "Q6_K", "Q8_0"], [32, 16, 24]
    raws = [random_blocks(n, k, t, rng) for t, n in zip(types, sizes, strict=True)]
    built = [matrix(t, raw, k) for t, raw in zip(types, raws, strict=True)]
    whole = parts_matrix([m for m, _ in built], k, k)
    x = rng.standard_normal((3, k)).astype(np.float32)
    y = project(whole, x, sum(sizes))
    want = np.concatenate([project(m, x, n) for (m, _), n in zip(built, sizes, strict=True)], axis=1)
    assert np.array_equal(y, want)


def test_rows_can_be_reordered(kernel):
    rng = np.random.default_rng(9)
    raw = random_blocks(32, 256, "Q4_K", rng)
    order = rng.permutation(32)
    kind, arrays = kb.tensor_parts("Q4_K", raw, order)
    m = block_matrix(kind, 32, 256, 256, lambda key: arrays[key].ctypes.data if key in arrays else None)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    plain, _ = matrix("Q4_K", raw, 256)
    assert np.array_equal(project(m, x, 32), project(plain, x, 32)[:, order])


def test_a_type_the_kernel_lacks_is_left_to_the_caller():
    raw = np.zeros((4, 2 * 256), np.uint8)
    assert kb.tensor_parts("F16", raw) is None


@pytest.mark.parametrize("type_name", TYPES)
def test_the_kernels_packing_is_numpys(kernel, type_name):
    """`chatcli_pack` (what a first start repacks with) gives `pack` / `pack_k`'s bytes, bar their padding."""
    raw = random_blocks(37, 512, type_name, np.random.default_rng(12))
    kind, ours = kb.tensor_parts(type_name, raw, packer=kernel)
    want_kind, want = kb.tensor_parts(type_name, raw)
    assert kind == want_kind and set(ours) == set(want)
    for key, array in ours.items():
        flat, reference = array.view(np.uint8).ravel(), want[key].view(np.uint8).ravel()
        assert np.array_equal(flat, reference[: flat.size]) and not reference[flat.size :].any(), key
