"""A GGUF read by chatcli itself into the `gguf` lean file (gguf_lean): every tensor in its own type.

Tiny random models of each family read directly (llama tied and untied, qwen2 with biases, qwen3
with q/k norms, Gemma 2 with soft-capping and a sliding layer, Gemma 3 with five sliding layers on
their own rope base, Phi-3 with fused tensors and half its heads rotated, and with LongRoPE, Phi-4-mini's
shape, SmolLM3 with an unrotated layer, Granite with its multipliers, OLMo 2 with its output norms, OLMo 3 with
three sliding layers of four and YaRN on the fourth) are
written as GGUF files in K-quant mixes and single types; the native runner over the file's own
blocks must give the logits of transformers over the same weights (each put through its type's
quantization: `gguf_models.fake_quantized`) within the int8 activations' rounding, over a prefill,
decode steps, a crop and a draft; and a draft's logits are bit-equal to single steps'.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chatcli.engine.runners.native import NativeRunner
from chatcli.engine.weights.gguf_file import GGUFFile
from chatcli.engine.weights.gguf_lean import direct_reason
from tests.gguf_models import Q4_K_M, fake_quantized, tiny, uniform, write_gguf
from tests.gguf_runs import (
    IDS,
    assert_close,
    assert_drafts_are_single_steps,
    assert_near_the_files_size,
    computed,
    direct_runner,
)

CASES = [
    ("llama", True, Q4_K_M),
    ("llama", False, Q4_K_M),
    ("qwen2", False, Q4_K_M),
    ("qwen3", True, Q4_K_M),
    ("gemma2", True, Q4_K_M),
    ("gemma3_text", True, Q4_K_M),
    ("phi3", False, Q4_K_M),
    ("smollm3", True, Q4_K_M),
    ("granite", True, Q4_K_M),
    ("olmo2", False, Q4_K_M),
    ("olmo3", False, Q4_K_M),
    ("llama", False, uniform("Q5_K")),
    ("llama", True, uniform("Q6_K")),
    ("qwen2", True, uniform("Q8_0")),
    ("llama", False, uniform("Q5_1")),
    ("llama", False, uniform("Q4_0")),
]


@pytest.mark.parametrize(("family", "tied", "types"), CASES, ids=lambda c: getattr(c, "__name__", str(c)))
def test_a_gguf_read_directly_computes_its_own_weights(kernel, tmp_path, family, tied, types):
    model = tiny(family, tied)
    assert_close(computed(model, types, direct_runner(model, types, tmp_path)))


@pytest.mark.parametrize(("family", "tied", "types"), CASES[:11], ids=lambda c: getattr(c, "__name__", str(c)))
def test_a_draft_gives_the_bits_of_single_steps(kernel, tmp_path, family, tied, types):
    assert_drafts_are_single_steps(direct_runner(tiny(family, tied), types, tmp_path))


def test_a_longrope_phi3_runs_its_short_factors_up_to_its_original_context(kernel, tmp_path):
    model = tiny("phi3", False, longrope=True)
    runner = direct_runner(model, Q4_K_M, tmp_path, limit=256)
    assert runner.config.positions == 64  # the original context, not the file's 256
    fake_quantized(model, Q4_K_M)
    with torch.no_grad():
        want = model(torch.tensor([IDS])).logits[0].numpy()
    got = runner.verify(IDS, runner.new_cache())
    assert np.abs(got - want).max() < 0.04 * np.abs(want).max()


def test_a_phi4_mini_gguf_rotates_three_quarters_of_each_head_on_its_short_factors(kernel, tmp_path):
    """Phi-4-mini's shape: partial rotary 0.75, tied embeddings (no output.weight), LongRoPE."""
    model = tiny("phi4-mini", True)
    runner = direct_runner(model, Q4_K_M, tmp_path, limit=256)
    assert runner.config.positions == 64 and "rope_factors_short.weight" in GGUFFile(tmp_path / "model.gguf").tensors
    assert_close(computed(model, Q4_K_M, runner))
    assert_drafts_are_single_steps(runner)


def test_the_lean_file_is_no_larger_than_the_gguf(kernel, tmp_path):
    assert_near_the_files_size(tmp_path, Q4_K_M, {"Q4_K", "Q6_K"}, 1.05)


def test_what_is_not_read_directly_says_why(tmp_path):
    model = tiny("llama", True)
    path = write_gguf(model, tmp_path / "tq2.gguf", "TQ2_0")  # ternary: a type the kernel does not run
    assert direct_reason(GGUFFile(path)) == "token_embd.weight is type 35"
    assert direct_reason(GGUFFile(write_gguf(model, tmp_path / "f16.gguf", "F16"))) is None  # F16: read directly


def test_a_gemma_gguf_loads_on_its_own_blocks(kernel, tmp_path):
    """The whole load: the GGUF's config written from its metadata passes the lean families' check,
    `--quantize auto` reads its blocks, and the engine's logits are the direct runner's."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions

    path = write_gguf(tiny("gemma3_text", True), tmp_path / "gemma.gguf", Q4_K_M)
    engine = load_engine(str(path), LoadOptions(device="cpu"))
    runner = engine.runner
    assert isinstance(runner, NativeRunner) and runner.config.kind == "gguf"
    assert runner.config.family == "gemma3_text" and runner.config.sliding_rope
    (tmp_path / "again").mkdir()
    direct = direct_runner(tiny("gemma3_text", True), Q4_K_M, tmp_path / "again", kv_dtype=runner.kv_dtype)
    assert np.array_equal(runner.verify(IDS[:6], runner.new_cache()), direct.verify(IDS[:6], direct.new_cache()))


@pytest.mark.parametrize("family", ["smollm3", "granite", "olmo2", "olmo3"])
def test_the_newest_dense_families_load_from_a_gguf_on_its_own_blocks(kernel, tmp_path, family):
    """The whole load of SmolLM3, Granite and OLMo 2 files: the config written from the metadata passes the lean
    families' check (SmolLM3's unrotated layers and Granite's multipliers in it) and the engine's logits are the
    direct runner's."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from chatcli.engine.weights.gguf_meta import hf_config

    tied = family not in ("olmo2", "olmo3")
    path = write_gguf(tiny(family, tied), tmp_path / f"{family}.gguf", Q4_K_M)
    config = hf_config(GGUFFile(path))
    assert config["model_type"] == family
    if family == "smollm3":
        assert config["no_rope_layers"] == [1, 1, 1, 0]
    if family == "granite":
        assert (config["embedding_multiplier"], config["logits_scaling"]) == (3.0, 2.5)
    if family == "olmo3":  # an olmo2 file with windows: OLMo 3's config, its sliding layers and YaRN as the file says
        assert config["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
        assert config["sliding_window"] == 4 and config["rope_parameters"]["full_attention"]["rope_type"] == "yarn"
    runner = load_engine(str(path), LoadOptions(device="cpu")).runner
    assert isinstance(runner, NativeRunner) and runner.config.kind == "gguf" and runner.config.family == family
    (tmp_path / "again").mkdir()
    direct = direct_runner(tiny(family, tied), Q4_K_M, tmp_path / "again", kv_dtype=runner.kv_dtype)
    assert np.array_equal(runner.verify(IDS[:6], runner.new_cache()), direct.verify(IDS[:6], direct.new_cache()))


@pytest.mark.parametrize("family", ["olmo2", "olmo3", "granite", "smollm3"])
def test_without_the_kernel_a_file_transformers_cannot_read_is_one_line_of_ours(no_kernel, tmp_path, family):
    """A family read only from its own blocks (transformers' GGUF reader has no such architecture): without the
    kernel, one line naming the file, its architecture and why the kernel does not run, not transformers' text."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadError, LoadOptions

    path = write_gguf(tiny(family, family not in ("olmo2", "olmo3")), tmp_path / f"{family}.gguf", Q4_K_M)
    arch = GGUFFile(path).arch
    with pytest.raises(LoadError) as caught:
        load_engine(str(path), LoadOptions(device="cpu"))
    line = str(caught.value)
    assert "\n" not in line and "not supported yet" not in line
    said = f"{family}.gguf: a GGUF of architecture {arch} (transformers reads none) runs only on the compiled kernel"
    assert said in line
    assert "the kernel does not run here: switched off for this test" in line  # the reason, not the options
