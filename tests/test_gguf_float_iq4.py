"""GGUF files with F16, BF16 (and F32) tensors, and with IQ4_NL / IQ4_XS ones, read directly (gguf_lean,
kquant_blocks' `f16` / `bf16` / `f32`, `iq4nl` / `iq4xs`), as tests/test_gguf_low_bits.py does for Q3_K
and Q2_K.

Tiny random models written as llama.cpp's F16 / BF16 GGUFs, a Q4_K_M-like file that keeps its output
and embedding in F16, IQ4_XS and IQ4_NL files (alone, beside Q6_K, or IQ4_NL beside Q4_K as llama.cpp's
fallback): the native runner over the file's own tensors gives the logits of transformers over the same
weights (each as the file holds it) — within fp32 rounding where every projection is a float one,
within the int8 activations' rounding beside quantized ones — over a prefill and decode steps; a
draft's logits are bit-equal to single steps' in each kernel build; and the lean file stays within
1.1x of the GGUF's bytes (no fp32 copy of a 16-bit tensor). The IQ4 tensors come from tests.kquants'
quantizer (the `gguf` package has none for them).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gguf_models import Q4_K_M, tiny, uniform
from tests.gguf_runs import (
    assert_close,
    assert_drafts_are_single_steps,
    assert_near_the_files_size,
    computed,
    direct_runner,
)


def Q4_K_M_F16_OUT(name: str, shape: tuple[int, ...], *, n_layers: int | None = None, has_output: bool = True) -> str:
    """Q4_K_M with the output and the embedding kept in F16 (llama.cpp's --output-tensor-type f16
    --token-embedding-type f16, as some uploads are made)."""
    if name in ("output.weight", "token_embd.weight"):
        return "F16"
    return Q4_K_M(name, shape, n_layers=n_layers, has_output=has_output)


Q4_K_M_F16_OUT.file_type = "MOSTLY_Q4_K_M"


def IQ4_XS_MIX(name: str, shape: tuple[int, ...], *, has_output: bool = True) -> str:
    """Roughly llama.cpp's IQ4_XS files: Q6_K for the output (the embedding where tied), IQ4_XS elsewhere."""
    del shape
    return "Q6_K" if name == "output.weight" or (name == "token_embd.weight" and not has_output) else "IQ4_XS"


IQ4_XS_MIX.file_type = "MOSTLY_IQ4_XS"


def Q4_K_IQ4_NL(name: str, shape: tuple[int, ...]) -> str:
    """Q4_K with attn_v and ffn_down in IQ4_NL, as llama.cpp's fallback gives rows too narrow for a K-quant."""
    del shape
    return "IQ4_NL" if name.endswith(("attn_v.weight", "ffn_down.weight")) else "Q4_K"


Q4_K_IQ4_NL.file_type = "MOSTLY_Q4_K_S"
IQ4_CASES = [
    ("llama", True, IQ4_XS_MIX),
    ("llama", False, uniform("IQ4_XS")),
    ("llama", False, uniform("IQ4_NL")),
    ("qwen2", False, Q4_K_IQ4_NL),
    ("qwen3", True, IQ4_XS_MIX),
]

CASES = [  # (family, tied, types, bound on the largest logit error over the largest logit)
    ("llama", True, uniform("F16"), 1e-4),
    ("llama", False, uniform("BF16"), 1e-4),
    ("qwen2", False, uniform("F16"), 1e-4),
    ("qwen3", True, uniform("BF16"), 1e-4),
    ("llama", True, uniform("F32"), 1e-4),
    ("llama", True, Q4_K_M_F16_OUT, 0.04),
    ("llama", False, Q4_K_M_F16_OUT, 0.04),
]


def ids(case) -> str:
    """A case's id: a chooser's name, `uniform`'s by its file type."""
    name = getattr(case, "__name__", str(case))
    return case.file_type if name == "choose" else name


@pytest.mark.parametrize(("family", "tied", "types", "bound"), CASES, ids=ids)
def test_a_float_gguf_read_directly_computes_its_own_weights(kernel, tmp_path, family, tied, types, bound):
    model = tiny(family, tied)
    runner = direct_runner(model, types, tmp_path)
    c = computed(model, types, runner)
    assert {"F16", "BF16", "F32"} & c.types and set(runner.config.types.split("+")) == c.types
    assert_close(c, bound)
    assert bound >= 1e-3 or (c.got.argmax(-1) == c.want.argmax(-1)).all()


@pytest.mark.parametrize(("family", "tied", "types", "_bound"), [CASES[0], CASES[1], CASES[5]], ids=ids)
def test_a_float_draft_gives_the_bits_of_single_steps(build, tmp_path, family, tied, types, _bound):
    assert_drafts_are_single_steps(direct_runner(tiny(family, tied), types, tmp_path))


@pytest.mark.parametrize(
    ("types", "kinds", "bound"),
    [
        (uniform("F16"), {"F16"}, 1.01),
        (uniform("BF16"), {"BF16"}, 1.01),
        (Q4_K_M_F16_OUT, {"F16", "Q4_K", "Q6_K"}, 1.1),
    ],
    ids=ids,
)
def test_the_lean_file_of_float_tensors_stays_near_the_ggufs_size(kernel, tmp_path, types, kinds, bound):
    assert_near_the_files_size(tmp_path, types, kinds, bound)


def test_the_iq4_quantizer_round_trips_through_the_gguf_package():
    import gguf

    from tests import kquants

    rng = np.random.default_rng(40)
    w = rng.standard_normal((16, 512)).astype(np.float32) * (10.0 ** rng.uniform(-3, 1, size=(16, 1)))
    w[3] = 0
    for type_name in ("IQ4_NL", "IQ4_XS"):
        raw = kquants.quantize(w, type_name)
        back = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])
        assert raw.dtype == np.uint8 and back.shape == w.shape and (back[3] == 0).all()
        for row in (0, 1, 2, 15):
            assert np.sqrt(((back[row] - w[row]) ** 2).mean() / (w[row] ** 2).mean()) < 0.12, (type_name, row)


@pytest.mark.parametrize(("family", "tied", "types"), IQ4_CASES, ids=ids)
def test_an_iq4_gguf_read_directly_computes_its_own_weights(kernel, tmp_path, family, tied, types):
    model = tiny(family, tied)
    runner = direct_runner(model, types, tmp_path)
    c = computed(model, types, runner)
    assert {"IQ4_NL", "IQ4_XS"} & c.types and set(runner.config.types.split("+")) == c.types
    assert_close(c)


@pytest.mark.parametrize(("family", "tied", "types"), [IQ4_CASES[0], IQ4_CASES[3]], ids=ids)
def test_an_iq4_draft_gives_the_bits_of_single_steps(build, tmp_path, family, tied, types):
    assert_drafts_are_single_steps(direct_runner(tiny(family, tied), types, tmp_path))


@pytest.mark.parametrize(
    ("types", "kinds", "bound"),
    [
        (uniform("IQ4_XS"), {"IQ4_XS"}, 1.02),
        (uniform("IQ4_NL"), {"IQ4_NL"}, 1.0),
        (IQ4_XS_MIX, {"IQ4_XS", "Q6_K"}, 1.1),
    ],
    ids=ids,
)
def test_the_lean_file_of_iq4_tensors_stays_near_the_ggufs_size(kernel, tmp_path, types, kinds, bound):
    assert_near_the_files_size(tmp_path, types, kinds, bound)
