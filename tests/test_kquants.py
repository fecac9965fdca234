"""The test helpers for K-quant GGUF files: `tests.kquants` (quantizer, random blocks) and `tests.gguf_models` (writer).

Blocks are checked by `gguf`'s own dequantizer (the layouts' ground truth); written files by
`gguf.GGUFReader` (metadata, tensor types) and by transformers' GGUF loader, whose logits must
equal the source model's where the weights are F32 (so llama's q/k permutation and every name and
key are right), and those of the source model with each weight put through the same quantization
where they are not (rows are quantized independently, so the permutation does not change that).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tests import kquants
from tests.gguf_models import FALLBACK, Q4_K_M, VOCAB, fake_quantized, tensor_type, tiny, use_more_bits, write_gguf

IDS = torch.tensor([[1, 5, 17, 200, 3, 99, 42, 7, 300, 511, 2, 64]])
# relative RMS error on gaussian weights: well above what the scheme gives (about 0.33, 0.155, 0.078, 0.038, 0.019)
ROUND_TRIP = {"Q2_K": 0.4, "Q3_K": 0.2, "Q4_K": 0.1, "Q5_K": 0.05, "Q6_K": 0.03}
QTYPE = gguf.GGMLQuantizationType


def dequantize(raw: np.ndarray, type_name: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, QTYPE[type_name])


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(((a - b) ** 2).mean() / (b**2).mean()))


@pytest.mark.parametrize("type_name", list(ROUND_TRIP))
def test_round_trip(type_name):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 1024)).astype(np.float32)
    raw = kquants.quantize(w, type_name)
    assert raw.dtype == np.uint8 and raw.shape == (64, 4 * kquants.block_bytes(type_name)[1])
    assert rel_rms(dequantize(raw, type_name), w) < ROUND_TRIP[type_name]
    # rows of very different scales, one-signed rows, an outlier, zeros: each row as good on its own scale
    scales = (10.0 ** rng.uniform(-3, 1, size=(64, 1))).astype(np.float32)
    w = w * scales
    w[1] = np.abs(w[1])
    w[2] = -np.abs(w[2])
    w[3, 7] *= 40
    w[4] = 0
    back = dequantize(kquants.quantize(w, type_name), type_name)
    assert np.isfinite(back).all() and (back[4] == 0).all()
    for row in (0, 1, 2, 5, 63):
        assert rel_rms(back[row], w[row]) < ROUND_TRIP[type_name] * 1.5, row


def test_quantize_keeps_leading_dims_and_delegates():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((2, 3, 512)).astype(np.float32)
    assert kquants.quantize(w, "Q6_K").shape == (2, 3, 2 * 210)
    with pytest.raises(ValueError):
        kquants.quantize(w[..., :288], "Q4_K")
    for type_name in ("Q4_0", "Q5_1", "Q8_0"):
        assert np.array_equal(kquants.quantize(w, type_name), gguf.quants.quantize(w, QTYPE[type_name]))


@pytest.mark.parametrize("type_name", [*ROUND_TRIP, "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16", "BF16", "F32"])
def test_random_blocks(type_name):
    rng = np.random.default_rng(2)
    raw = kquants.random_blocks(8, 512, type_name, rng)
    block, size = gguf.GGML_QUANT_SIZES[QTYPE[type_name]]
    assert raw.dtype == np.uint8 and raw.shape == (8, 512 // block * size)
    w = dequantize(raw, type_name)
    assert w.shape == (8, 512) and np.isfinite(w).all() and np.abs(w).max() < 100 and w.std() > 0
    blocks = raw.reshape(8, 512 // block, size)
    for offset in kquants.FP16_OFFSETS.get(type_name, ()):
        d = blocks[..., offset : offset + 2].copy().view(np.float16).astype(np.float32)
        assert ((d >= 0.99e-3) & (d <= 1.01e-2)).all()
    assert not np.array_equal(raw, kquants.random_blocks(8, 512, type_name, rng))


def test_types_fall_back_as_llama_cpp():
    assert tensor_type("Q4_K", "blk.0.ffn_up.weight", (512, 256), 2, True) == "Q4_K"
    for k_type, fallback in FALLBACK.items():
        assert tensor_type(k_type, "blk.0.ffn_up.weight", (512, 96), 2, True) == fallback
    assert tensor_type("Q4_0", "blk.0.ffn_up.weight", (512, 48), 2, True) == "F16"
    assert tensor_type("Q8_0", "blk.0.attn_norm.weight", (256,), 2, True) == "F32"
    assert tensor_type(Q4_K_M, "output.weight", (512, 96), 2, True) == "Q8_0"


def test_q4_k_m_mix():
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    n = dict(n_layers=32)
    assert Q4_K_M("output.weight", (512, 256), **n) == "Q6_K"
    assert Q4_K_M("token_embd.weight", (512, 256), **n) == "Q4_K"
    assert Q4_K_M("token_embd.weight", (512, 256), **n, has_output=False) == "Q6_K"
    assert Q4_K_M("blk.6.attn_v.weight", (128, 256), **n) == Q4_K_M("blk.31.ffn_down.weight", (256, 512), **n) == "Q6_K"
    assert Q4_K_M("blk.7.attn_v.weight", (128, 256), **n) == Q4_K_M("blk.6.attn_q.weight", (256, 256), **n) == "Q4_K"


CASES = [
    ("llama", True, "F32"),
    ("llama", False, "F32"),
    ("qwen2", True, "F32"),
    ("qwen3", False, "F32"),
    ("llama", False, "Q8_0"),
    ("llama", True, Q4_K_M),
    ("qwen2", False, Q4_K_M),
    ("qwen3", True, Q4_K_M),
]


@pytest.mark.parametrize(("family", "tied", "types"), CASES, ids=lambda c: getattr(c, "__name__", str(c)))
def test_written_gguf_loads_in_transformers(tmp_path, family, tied, types):
    from transformers import AutoModelForCausalLM

    model = tiny(family, tied)
    with torch.no_grad():
        source = model(IDS).logits
    path = write_gguf(model, tmp_path / "model.gguf", types)

    reader = gguf.GGUFReader(str(path))
    fields = reader.fields
    assert fields["general.architecture"].contents() == family
    assert fields[f"{family}.block_count"].contents() == 2
    assert fields[f"{family}.embedding_length"].contents() == 256
    assert fields[f"{family}.attention.head_count_kv"].contents() == 2
    assert (f"{family}.attention.key_length" in fields) == (family != "qwen2")
    assert (f"{family}.rope.dimension_count" in fields) == (family == "llama")
    assert len(fields["tokenizer.ggml.tokens"].data) == VOCAB
    assert "tokenizer.chat_template" in fields
    assert ("output.weight" in {t.name for t in reader.tensors}) == (not tied)
    if types is Q4_K_M:
        assert fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q4_K_M

    expected = fake_quantized(model, types) if types != "F32" else {}
    written = {t.name: t.tensor_type.name for t in reader.tensors}
    for name, kind in written.items():
        assert kind == expected.get(name, "F32"), name
    if types is Q4_K_M:
        assert {"Q4_K", "Q6_K"} <= set(written.values())
        assert written["blk.1.attn_v.weight"] == written["blk.1.ffn_down.weight"] == "Q6_K"  # use_more_bits(1, 2)
        assert written["token_embd.weight"] == ("Q6_K" if tied else "Q4_K")

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    assert loaded.config.tie_word_embeddings == tied
    with torch.no_grad():
        logits = loaded(IDS).logits
        reference = model(IDS).logits  # the model with its weights as the GGUF holds them
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=1e-4)
    if types == "Q8_0":  # and near the unquantized model's (these random models amplify errors ~15x)
        assert (logits - source).abs().max() < 0.3 * source.std()
