"""A GGUF's Q4_K and Q6_K rows read as the file holds them (the kernel's WEIGHT_RAW_Q4K / _Q6K, project_raw.h).

Each block of 16 rows is put into the repacked layout as a projection reaches it, so a raw matrix must give
the bits of the same rows repacked (`kquant_blocks.tensor_parts`), in every build, for any number of rows
(a decode step's one, a prompt's chunk), a last block of fewer than 16 rows, and extreme codes and scales.
"""

from __future__ import annotations

import numpy as np
import pytest

from chatcli.engine.runners.kernels.structs import WEIGHT_RAW_Q4K, WEIGHT_RAW_Q6K, Matrix
from tests.kquants import random_blocks
from tests.test_kquant_blocks import dequantized, extreme_blocks, matrix, project, textbook

pytest.importorskip("gguf")

RAW = {"Q4_K": WEIGHT_RAW_Q4K, "Q6_K": WEIGHT_RAW_Q6K}


def raw_matrix(type_name: str, raw: np.ndarray, k: int) -> Matrix:
    return Matrix(RAW[type_name], len(raw), k, k, raw.ctypes.data)


@pytest.mark.parametrize("type_name", list(RAW))
@pytest.mark.parametrize(("n", "rows"), [(32, 1), (48, 3), (40, 9), (24, 17)])
def test_raw_rows_give_the_repacked_rows_bits_in_each_build(build, type_name, n, rows):
    rng = np.random.default_rng(n * 31 + rows)
    k = 768
    raw = random_blocks(n, k, type_name, rng) if rows % 2 else extreme_blocks(type_name, n, k, rng)
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
