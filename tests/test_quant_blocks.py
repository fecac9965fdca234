"""Group-wise 4- and 8-bit weights (quant_blocks, the kernel's `group_block`) and a GGUF's own blocks.

The kernel's q4/q8 projection is checked against the textbook: GGUF's Q8_1 activations (int8
per row and group of 32, scale amax/127), exact integer dots per group, then d sx dot + m sum.
Packing is checked against an independent unpacking of the documented layout, GGUF blocks
against the `gguf` package's own dequantizer, and the tiny model's q4/q8 lean files against
the fp32 kernel, with drafts bit-equal to single steps.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from chatcli.engine.runners import kernels
from chatcli.engine.runners.kernels.structs import WEIGHT_Q4, WEIGHT_Q8, Matrix
from chatcli.engine.runners.native import NativeRunner
from chatcli.engine.weights import quant_blocks as qb
from tests.tiny import lean_weights


def codes_of(weight: np.ndarray, bits: int, mins: bool = True) -> qb.Codes:
    codes = qb.quantize_q4(weight) if bits == 4 else qb.quantize_q8(weight)
    if bits == 4 and not mins:  # Q4_0: d (c - 8), codes re-centred on 8 with d from the range
        g = qb._grouped(weight)
        d = (np.abs(g).max(-1) / 7).astype(np.float16)
        inv = np.divide(1.0, d.astype(np.float32), out=np.zeros(d.shape, np.float32), where=d > 0)
        c = (np.clip(np.rint(g * inv[..., None]), -7, 7) + 8).astype(np.uint8)
        codes = qb.Codes(4, c.reshape(len(g), -1), d, None)
    return codes


def project(codes: qb.Codes, n: int, k: int, x: np.ndarray, threads: int = 2, norm=None) -> np.ndarray:
    """`x [S, k]` through the kernel's q4/q8 projection of `codes`."""
    arrays = qb.pack(codes)
    kp = -(-k // 32) * 32
    m = Matrix(
        WEIGHT_Q4 if codes.bits == 4 else WEIGHT_Q8,
        n,
        k,
        kp,
        arrays["w"].ctypes.data,
        None,
        None,
        arrays["d"].ctypes.data,
        arrays["m"].ctypes.data if "m" in arrays else None,
        None,
    )
    x = np.ascontiguousarray(x, np.float32)
    y = np.zeros((len(x), n), np.float32)
    assert kernels.library().chatcli_project(ctypes.byref(m), x.ctypes.data, len(x), y.ctypes.data, threads) == 0
    return y


def reference(codes: qb.Codes, k: int, x: np.ndarray) -> np.ndarray:
    """Q8_1 activations (round half to even, as the kernel's cvtps), exact integer dots per group."""
    n, kp = codes.codes.shape
    xs = np.zeros((len(x), kp), np.float32)
    xs[:, :k] = x
    xg = xs.reshape(len(x), kp // 32, 32)  # [S, G, 32]
    amax = np.abs(xg).max(-1)
    step = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)  # [S, G]
    xq = np.clip(np.rint(xg * (np.float32(1) / step)[..., None]), -128, 127).astype(np.int64)
    c = codes.codes.reshape(n, kp // 32, 32).astype(np.int64)  # [n, G, 32]
    dots = np.einsum("sgi,ngi->sng", xq, c).astype(np.float64)  # [S, n, G], exact
    d = codes.d.astype(np.float64)[None]  # [1, n, G]
    zero = 128 if codes.bits == 8 else 8
    m = codes.m.astype(np.float64)[None] if codes.m is not None else -zero * d
    sums = step.astype(np.float64)[:, None, :] * xq.sum(-1).astype(np.float64)[:, None, :]  # [S, 1, G]
    return (d * step.astype(np.float64)[:, None, :] * dots + m * sums).sum(-1)


@pytest.mark.parametrize("bits,mins", [(4, True), (4, False), (8, False)])
@pytest.mark.parametrize("shape", [(96, 64), (37, 50), (5, 3), (40, 200)])
def test_the_group_projection_is_the_textbook(kernel, shape, bits, mins):
    rng = np.random.default_rng(1)
    weight = rng.standard_normal(shape).astype(np.float32)  # [n, k]: padded outputs, inputs and groups
    x = (rng.standard_normal((7, shape[1])) * 3).astype(np.float32)
    codes = codes_of(weight, bits, mins)
    ours = project(codes, *shape, x)
    assert np.allclose(ours, reference(codes, shape[1], x), rtol=1e-4, atol=1e-4 * np.abs(ours).max())
    exact = x.astype(np.float64) @ weight.T.astype(np.float64)
    error = float(np.linalg.norm(ours - exact) / np.linalg.norm(exact))
    assert error < (0.2 if bits == 4 else 0.02)  # 4 bits: lossy, and close
    alone = np.concatenate([project(codes, *shape, x[i : i + 1], threads=1) for i in range(len(x))])
    assert np.array_equal(ours, alone)  # each row as if alone, any thread count: drafts stay exact


def unpack(arrays: dict, bits: int, n: int, kp: int) -> np.ndarray:
    """The documented layout read back byte by byte: codes `[n, kp]`."""
    w = arrays["w"]
    blocks, groups = w.shape[0], w.shape[1]
    out = np.zeros((blocks * 16, kp), np.uint8)
    for b in range(blocks):
        for g in range(groups):
            for quad in range(8):
                chunk = w[b, g, quad] if bits == 8 else w[b, g, quad // 2] >> (4 * (quad % 2)) & 0x0F
                for o in range(16):
                    out[b * 16 + o, g * 32 + quad * 4 : g * 32 + quad * 4 + 4] = chunk[o * 4 : o * 4 + 4]
    return out[:n]


@pytest.mark.parametrize("bits", [4, 8])
def test_packing_follows_the_documented_layout(bits):
    weight = np.random.default_rng(2).standard_normal((37, 70)).astype(np.float32)
    codes = codes_of(weight, bits)
    arrays = qb.pack(codes)
    assert np.array_equal(unpack(arrays, bits, 37, 96), codes.codes)
    assert arrays["d"].size == qb.scales_length(37, 70) and arrays["d"].nbytes % 64 == 0
    d = arrays["d"][: 3 * 3 * 16].reshape(3, 3, 16).transpose(0, 2, 1).reshape(48, 3)[:37]
    assert np.array_equal(d, codes.d)
    assert np.abs(codes.dequantized(70) - weight).max() < (np.abs(weight).max() / (7 if bits == 4 else 100))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_read_as_the_gguf_package_dequantizes_them(qtype):
    gguf = pytest.importorskip("gguf")
    weight = np.random.default_rng(3).standard_normal((24, 96)).astype(np.float32)
    kind = getattr(gguf.GGMLQuantizationType, qtype)
    raw = gguf.quants.quantize(weight, kind)  # [24, bytes] as a GGUF file holds it
    codes = qb.gguf_codes(qtype, raw)
    assert codes.bits == (8 if qtype == "Q8_0" else 4) and (codes.m is not None) == (qtype == "Q4_1")
    assert np.array_equal(codes.dequantized(96), gguf.quants.dequantize(raw, kind))
    assert qb.gguf_codes("Q6_K", raw) is None  # other types: quantized from the floats instead


def test_gguf_rows_are_found_in_either_order():
    """llama.cpp's converter permutes q/k rows per head; the blocks are matched to transformers' rows."""
    gguf = pytest.importorskip("gguf")

    class Config:
        num_attention_heads, num_key_value_heads = 4, 2

    blocks = qb.GGUFBlocks.__new__(qb.GGUFBlocks)
    blocks.heads, blocks.taken = {4, 2}, 0
    hf = torch.randn(32, 64)
    order = blocks._row_orders(32)[1]  # transformers row i = GGUF row order[i]
    gguf_rows = np.empty((32, 64), np.float32)
    gguf_rows[order] = hf.numpy()
    raw = gguf.quants.quantize(gguf_rows, gguf.GGMLQuantizationType.Q8_0)
    dequantized = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0))

    class Tensor:
        tensor_type, data = gguf.GGMLQuantizationType.Q8_0, raw

    blocks.tensors = {"w": Tensor}
    want = dequantized[torch.from_numpy(order)]  # the weight transformers loads
    got = blocks.codes("w", want)
    assert got is not None and np.array_equal(got.dequantized(64), want.numpy()) and blocks.taken == 1
    rows = torch.arange(31, -1, -1)
    assert np.array_equal(blocks.codes("w", want, rows).dequantized(64), want[rows].numpy())
    assert blocks.codes("w", want + 0.01) is None  # not these weights: quantized from the floats instead
    assert blocks.codes("missing", want) is None


@pytest.fixture(scope="module")
def files(tiny_loaded, tmp_path_factory):
    folder = tmp_path_factory.mktemp("grouped")
    return {
        kind: lean_weights(tiny_loaded.model, kind, folder, tiny_loaded.tokenizer)
        for kind in ("float32-panels", "q4", "q8")
    }


@pytest.mark.parametrize("kind,bound", [("q4", 0.35), ("q8", 0.03)])
def test_native_grouped_tracks_fp32_and_drafts_stay_exact(files, kernel, kind, bound):
    fp32, ours = NativeRunner(files["float32-panels"]), NativeRunner(files[kind])
    assert ours.quantized and ours.weight_bytes < fp32.weight_bytes / (5 if kind == "q4" else 3)
    ids = list(range(3, 40))
    caches = fp32.new_cache(), ours.new_cache()
    for step in (ids, [5], [9], [11]):
        a, b = fp32.forward(step, caches[0]), ours.forward(step, caches[1])
        assert 0 < float(np.linalg.norm(a - b) / np.linalg.norm(a)) < bound  # random weights: 4 bits is noisy
    draft, single = ours.new_cache(), ours.new_cache()
    ours.forward(ids[:20], draft)
    ours.forward(ids[:20], single)
    together = ours.verify(ids[20:26], draft)
    alone = np.stack([ours.forward([t], single) for t in ids[20:26]])
    assert np.array_equal(together, alone)
    assert np.array_equal(draft.k[:, :, : 26 // 16 + 1], single.k[:, :, : 26 // 16 + 1])


def test_the_norms_kept_apart_are_applied(kernel, tmp_path):
    """A grouped file keeps the RMSNorm weights out of the blocks and the kernel multiplies them in: on a
    model whose norms are random, q8 tracks fp32, and fp32 without those norms would not."""
    import copy

    from tests.tiny import build_family

    model = build_family("llama", 400)
    plain = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in plain.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
    fp32 = NativeRunner(lean_weights(model, "float32-panels", tmp_path / "a"))
    q8 = NativeRunner(lean_weights(model, "q8", tmp_path / "b"))
    unnormed = NativeRunner(lean_weights(plain, "float32-panels", tmp_path / "c"))
    assert set(q8.config.norms()) <= set(q8.weights.file.tensors)
    ids = list(range(3, 30))
    want = fp32.forward(ids, fp32.new_cache())
    got = q8.forward(ids, q8.new_cache())
    without = unnormed.forward(ids, unnormed.new_cache())
    assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) < 0.03
    assert float(np.linalg.norm(without - want) / np.linalg.norm(want)) > 0.1


def test_q4_and_q8_load_on_the_kernel_and_are_refused_elsewhere(tiny_model_dir, tiny_loaded, kernel, monkeypatch):
    from chatcli.engine.kv import persist
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.hf import build_engine
    from chatcli.engine.load.options import LoadError, LoadOptions

    prints = set()
    for quantize in ("q4", "q8", "int8"):
        engine = load_engine(str(tiny_model_dir), LoadOptions(device="cpu", quantize=quantize))
        assert isinstance(engine.runner, NativeRunner) and engine.runner.config.kind == quantize
        prints.add(persist.fingerprint(engine.runner, "m"))
    assert len(prints) == 3  # a saved cache of one never loads into another
    with pytest.raises(LoadError, match="q4 runs on the lean path in the compiled kernel"):
        build_engine(tiny_loaded, runner="hf", quantize="q4")
    monkeypatch.setattr(kernels, "library", lambda: None)
    monkeypatch.setattr(kernels, "_reason", "switched off for this test")
    with pytest.raises(LoadError, match="q8 needs the compiled kernel: switched off for this test"):
        load_engine(str(tiny_model_dir), LoadOptions(device="cpu", quantize="q8"))


def test_the_embedded_gguf_runs_on_its_own_blocks(kernel):
    """SmolLM2's Q4_1 layers and Q8_0 embedding are the q4 file's blocks byte for byte (not requantized),
    and its perplexity is fp32's (the same weights; only the activations are rounded to int8)."""
    gguf = pytest.importorskip("gguf")
    from chatcli.bench.measure import perplexity
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from tests.conftest import embedded_path

    path = embedded_path()
    engine = load_engine(path, LoadOptions(quantize="q4"))
    runner = engine.runner
    assert runner.config.kind == "q4"
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}

    def dequantized(name: str) -> np.ndarray:
        t = tensors[name]
        return gguf.quants.dequantize(t.data, t.tensor_type)

    def ours(name: str, bits: int) -> np.ndarray:
        w = runner.weights
        k, n = runner.config.shapes()[name]
        arrays = {"w": w.array(f"{name}.w")}
        codes = unpack(arrays, bits, n, -(-k // 32) * 32)
        d = w.array(f"{name}.d")[: -(-n // 16) * 16 * (k // 32)].reshape(-1, k // 32, 16).transpose(0, 2, 1)
        m = w.array(f"{name}.m")[: d.size].reshape(-1, k // 32, 16).transpose(0, 2, 1) if bits == 4 else None
        d, m = d.reshape(-1, k // 32)[:n], None if m is None else m.reshape(-1, k // 32)[:n]
        return qb.Codes(bits, codes, d, m).dequantized(k)

    # llama.cpp's q/k rows are already in rope pairs (2i, 2i + 1), the lean order: no permutation
    qkv = np.concatenate([dequantized(f"blk.3.attn_{p}.weight") for p in "qkv"])
    assert np.array_equal(ours("layers.3.qkv", 4), qkv)
    assert np.array_equal(ours("layers.3.down", 4), dequantized("blk.3.ffn_down.weight"))
    assert np.array_equal(ours("head", 8), dequantized("token_embd.weight"))  # tied, Q8_0
    fp32 = load_engine(path, LoadOptions(kv_dtype="float32", quantize="none"))
    ratio = perplexity(engine)[0] / perplexity(fp32)[0]
    assert abs(ratio - 1) < 0.05


def test_auto_reads_a_q4_gguf_as_its_blocks_where_the_kernel_runs(kernel, real_default, monkeypatch):
    """The default (`--quantize auto`) on the embedded Q4_1 file is its own blocks, each tensor in its
    own type (the file holds its embedding in Q8_0), read from the file itself; without the kernel,
    and for a model that is no GGUF, auto is none."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from chatcli.engine.runners import kernels
    from chatcli.engine.weights.gguf_convert import gguf_file_type
    from tests.conftest import embedded_path

    assert gguf_file_type(embedded_path()) == 3  # LLAMA_FTYPE_MOSTLY_Q4_1, as the file says
    assert real_default.runner.weights_dtype == "gguf Q4_1+Q8_0" and real_default.runner.exact_verify
    monkeypatch.setattr(kernels, "library", lambda: None)
    monkeypatch.setattr(kernels, "_reason", "switched off for this test")
    assert load_engine(embedded_path(), LoadOptions(quantize="auto")).runner.weights_dtype == "float32"


@pytest.mark.parametrize("file_type,kind", [(2, "q4"), (3, "q4"), (7, "q8"), (15, None), (0, None), (None, None)])
def test_a_ggufs_file_type_is_read_from_its_header(tmp_path, file_type, kind):
    """`general.file_type` after a long array (a vocabulary) and strings, as writers lay it out."""
    gguf = pytest.importorskip("gguf")
    from chatcli.engine.load.options import GGUF_KINDS
    from chatcli.engine.weights.gguf_convert import gguf_file_type

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_token_list([f"tok{i}" for i in range(3000)])
    writer.add_array("test.numbers", list(range(100)))
    if file_type is not None:
        writer.add_file_type(file_type)
    writer.add_tensor("w", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_file_type(path) == file_type
    assert GGUF_KINDS.get(gguf_file_type(path)) == kind
    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x03\x00")
    assert gguf_file_type(tmp_path / "bad.gguf") is None


def test_the_header_names_the_weights(tiny_model_dir, kernel):
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from chatcli.ui.widgets.info_bar import engine_label

    for quantize, label in (("none", "float32-panels"), ("auto", "float32-panels"), ("int8", "int8"), ("q4", "q4")):
        engine = load_engine(str(tiny_model_dir), LoadOptions(device="cpu", quantize=quantize))
        assert engine_label(engine).endswith(f"· cpu · {label} · kernel {kernels.build_name()}")
