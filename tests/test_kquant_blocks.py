"""A GGUF's own blocks of every type the kernel runs (kquant_blocks, the kernel's `kquant_block` and `low_block`).

Each type's decoding is checked against the `gguf` package's own dequantizer on random blocks, and
the kernel's projection against the textbook: the activations int8 per row and group of 32 (scale
amax/127), times the weights exactly as the file holds them, summed in float64. Parts of several
types stacked along the outputs (a fused projection of a Q4_K_M file) give each part's columns.
Q3_K, Q2_K, IQ4_NL and IQ4_XS run in both builds (AVX-512, AVX2) at their codes' and scales' extremes,
to the same bits.
F16, BF16 and F32 tensors keep every element's bits; their projection (fp32 activations, no int8) is
the float64 textbook's within fp32 rounding in both builds, to the same bits, whatever the rows beside.
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

TYPES = ["Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "Q5_0", "Q5_1", "Q8_0", "Q4_0", "Q4_1", "IQ4_NL", "IQ4_XS"]
LOW = ["Q3_K", "Q2_K"]
IQ4 = ["IQ4_NL", "IQ4_XS"]


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


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K", *LOW])
def test_k_blocks_decode_to_the_gguf_packages_values(type_name):
    raw = random_blocks(21, 512, type_name, np.random.default_rng(3))
    got = kb.decode_k(type_name, raw).dequantized()
    assert np.array_equal(got, dequantized(type_name, raw, 512))


@pytest.mark.parametrize("type_name", IQ4)
def test_iq4_blocks_decode_to_the_gguf_packages_values(type_name):
    raw = random_blocks(21, 512, type_name, np.random.default_rng(5))
    blocks = kb.decode_iq4(type_name, raw)
    assert blocks.codes.max() <= 15 and np.array_equal(blocks.dequantized(), dequantized(type_name, raw, 512))


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
    k, types, sizes = 256, ["Q4_K", "Q6_K", "Q3_K", "Q8_0", "Q2_K"], [32, 16, 24, 24, 8]
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
    raw = np.zeros((4, 66), np.uint8)
    assert kb.tensor_parts("IQ2_XXS", raw) is None and kb.kind_of("IQ2_XXS") is None


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


def test_packing_through_one_arena_gives_fresh_arrays_bytes(kernel):
    """A first start packs every chunk into one buffer kept from call to call (`arena`): each call's
    arrays are those of a fresh packing, padding included, whatever the buffer held before (a larger
    tensor of every byte 0xFF, another type, other shapes)."""
    rng = np.random.default_rng(13)
    arena: dict = {}
    kb.tensor_parts("Q4_K", random_blocks(64, 1024, "Q4_K", rng), packer=kernel, arena=arena)
    arena["out"][:] = 0xFF  # what stale bytes could be
    for type_name, n, k in [("Q6_K", 37, 512), ("Q4_K", 21, 256), ("Q8_0", 19, 96), ("Q6_K", 37, 512)]:
        raw = random_blocks(n, k, type_name, rng)
        _, fresh = kb.tensor_parts(type_name, raw, packer=kernel)
        _, reused = kb.tensor_parts(type_name, raw, packer=kernel, arena=arena)
        assert set(fresh) == set(reused)
        for key, array in fresh.items():
            assert reused[key].dtype == array.dtype and np.array_equal(
                reused[key].view(np.uint8), array.view(np.uint8)
            ), key


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K"])
def test_amx_passes_give_vnnis_bits_and_each_rows_alone(amx, type_name):
    """45 rows of a K-quant projection (on 2 threads: row blocks of 32 and 13, AMX passes of 16 and the rest
    on VNNI) give, bit for bit, the same rows projected one at a time and the same 45 rows with AMX off; and
    the textbook within rounding. 8 rows (a batch of decode steps) stay on VNNI, to the same bits."""
    rng = np.random.default_rng(21)
    n, k = 40, 512
    raw = random_blocks(n, k, type_name, rng)
    m, _arrays = matrix(type_name, raw, k)
    x = rng.standard_normal((45, k)).astype(np.float32) * np.linspace(0.1, 4, k, dtype=np.float32)
    together, eight = project(m, x, n), project(m, x[:8], n)
    alone = np.concatenate([project(m, x[i : i + 1], n) for i in range(len(x))])
    assert amx.chatcli_amx(ctypes.c_int32(0)) == 0
    vnni = project(m, x, n)
    assert np.array_equal(together, alone) and np.array_equal(together, vnni)
    assert np.array_equal(eight, alone[:8])
    want = textbook(x, dequantized(type_name, raw, k))
    assert np.allclose(together, want, rtol=1e-4, atol=1e-3 * np.abs(want).max())


def extreme_blocks(type_name: str, n: int, k: int, rng) -> np.ndarray:
    """Random blocks whose first 8 rows hold the largest codes, half of them at the largest scales (and
    mins), half at the most negative (Q3_K, IQ4_XS: -32) or the smallest (Q2_K: 0); d and dmin kept.
    IQ4: the table's -127 (IQ4_NL: its 113 in rows 4..7)."""
    raw = random_blocks(n, k, type_name, rng)
    blocks = raw.reshape(n, k // (32 if type_name == "IQ4_NL" else 256), -1)
    if type_name == "IQ4_NL":  # d | qs: index 0 (-127), or 15 (113)
        blocks[:4, :, 2:], blocks[4:8, :, 2:] = 0x00, 0xFF
    elif type_name == "IQ4_XS":  # d | scales (bytes 2..8): 6-bit 0 (-32) or 63 (31) | qs: index 0 (-127)
        blocks[:8, :, 8:], blocks[:4, :, 2:8], blocks[4:8, :, 2:8] = 0x00, 0x00, 0xFF
    elif type_name == "Q3_K":  # hmask and qs: codes 7; scales' bytes 96..108: 6-bit 63 (31) or 0 (-32)
        blocks[:8, :, :96], blocks[:4, :, 96:108], blocks[4:8, :, 96:108] = 0xFF, 0xFF, 0x00
    else:  # scales | mins << 4 at 15 or 0, codes 3
        blocks[:8, :, 16:80], blocks[:4, :, :16], blocks[4:8, :, :16] = 0xFF, 0xFF, 0x00
    return raw


@pytest.fixture(params=list(kernels.BUILDS))
def build(request, monkeypatch):
    """Each build this CPU runs, in place of `kernels.library()`."""
    from tests.test_kernel_builds import loaded_build

    lib = loaded_build(request.param)
    monkeypatch.setattr(kernels, "library", lambda: lib)
    return lib


@pytest.mark.parametrize("type_name", [*LOW, *IQ4])
def test_the_low_bit_and_iq4_types_are_the_textbook_at_their_extremes_in_each_build(build, type_name):
    rng = np.random.default_rng(21)
    n, k = 40, 768
    raw = extreme_blocks(type_name, n, k, rng)
    m, _arrays = matrix(type_name, raw, k)
    x = (rng.standard_normal((6, k)) * 3).astype(np.float32)
    x[0], x[1] = 1.0, -1.0  # every activation at +-127
    x[2, ::2], x[2, 1::2] = 1.0, -1.0
    want = textbook(x, dequantized(type_name, raw, k))
    np.testing.assert_allclose(project(m, x, n), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    _kind, packed = kb.tensor_parts(type_name, raw, packer=build)  # this build's packer
    for key, array in packed.items():
        flat = array.view(np.uint8).ravel()
        assert np.array_equal(flat, _arrays[key].view(np.uint8).ravel()[: flat.size]), key


def test_the_builds_give_the_low_bit_and_iq4_types_the_same_bits():
    from tests.test_kernel_builds import loaded_build

    rng = np.random.default_rng(22)
    x = (rng.standard_normal((5, 512)) * 2).astype(np.float32)
    x[0] = 1.0
    raws = {t: extreme_blocks(t, 24, 512, rng) for t in [*LOW, *IQ4]}
    outputs = []
    for name in kernels.BUILDS:
        lib = loaded_build(name)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(kernels, "library", lambda lib=lib: lib)
            built = [matrix(t, raw, 512) for t, raw in raws.items()]  # (Matrix, its arrays kept alive)
            outputs.append([project(m, x, 24) for m, _arrays in built])
    first, second = outputs
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


FLOATS = ["F16", "BF16", "F32"]


def float_weights(type_name: str, arrays: dict, n: int, k: int) -> np.ndarray:
    """The packed `w` `[ceil(n/16), k, 16]` of a float kind read back as fp32 `[ceil(n/16) * 16, k]`; the
    bytes past it are checked to be zeros."""
    w = arrays["w"]
    blocks = -(-n // 16)
    bits, tail = w[: blocks * k * 16], w[blocks * k * 16 :]
    assert not tail.view(np.uint8).any()
    values = (bits.astype(np.uint32) << 16).view(np.float32) if type_name == "BF16" else bits.astype(np.float32)
    return values.reshape(blocks, k, 16).transpose(0, 2, 1).reshape(blocks * 16, k)


@pytest.mark.parametrize("type_name", FLOATS)
def test_float_tensors_keep_every_elements_bits(type_name):
    n, k = 37, 72
    raw = random_blocks(n, k, type_name, np.random.default_rng(30))
    kind, arrays = kb.tensor_parts(type_name, raw)
    assert kind == type_name.lower() and arrays["w"].nbytes % 64 == 0
    values = float_weights(type_name, arrays, n, k)
    assert np.array_equal(values[:n], dequantized(type_name, raw, k)) and not values[n:].any()  # padding: zeros


@pytest.mark.parametrize("type_name", FLOATS)
@pytest.mark.parametrize("n,k,rows", [(40, 512, 1), (37, 77, 5), (16, 96, 9)])
def test_float_projections_are_the_textbook_in_each_build(build, type_name, n, k, rows):
    rng = np.random.default_rng(n + k + rows)
    raw = random_blocks(n, k, type_name, rng)
    m, arrays = matrix(type_name, raw, k)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[0, :40] = 0
    want = x.astype(np.float64) @ dequantized(type_name, raw, k).astype(np.float64).T  # fp32 activations
    np.testing.assert_allclose(project(m, x, n), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    _kind, packed = kb.tensor_parts(type_name, raw, packer=build)  # this build's packer: numpy's bytes
    flat, reference = packed["w"].view(np.uint8).ravel(), arrays["w"].view(np.uint8).ravel()
    assert np.array_equal(flat, reference[: flat.size]) and not reference[flat.size :].any()


def test_a_float_row_gets_the_same_bits_alone_or_with_others_in_both_builds():
    from tests.test_kernel_builds import loaded_build

    rng = np.random.default_rng(31)
    x = rng.standard_normal((7, 200)).astype(np.float32)
    raws = {t: random_blocks(40, 200, t, rng) for t in FLOATS}
    outputs = []
    for name in kernels.BUILDS:
        lib = loaded_build(name)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(kernels, "library", lambda lib=lib: lib)
            built = {t: matrix(t, raw, 200) for t, raw in raws.items()}
            together = [project(m, x, 40) for m, _arrays in built.values()]
            for (m, _arrays), whole in zip(built.values(), together, strict=True):
                for s in range(7):
                    assert np.array_equal(project(m, x[s : s + 1], 40, threads=1)[0], whole[s])
            outputs.append(together)
    first, second = outputs
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


def test_float_and_iq4_parts_beside_other_types_fill_their_own_columns(kernel):
    rng = np.random.default_rng(32)
    k, types, sizes = 256, ["Q4_K", "F16", "Q8_0", "IQ4_XS", "BF16", "IQ4_NL"], [32, 24, 16, 16, 8, 24]
    raws = [random_blocks(n, k, t, rng) for t, n in zip(types, sizes, strict=True)]
    built = [matrix(t, raw, k) for t, raw in zip(types, raws, strict=True)]
    whole = parts_matrix([m for m, _ in built], k, k)
    x = rng.standard_normal((3, k)).astype(np.float32)
    y = project(whole, x, sum(sizes))
    want = np.concatenate([project(m, x, n) for (m, _), n in zip(built, sizes, strict=True)], axis=1)
    assert np.array_equal(y, want)
