"""gpt-oss read from its GGUF on the kernel (`gguf_oai`, `gguf_lean`, `kernels/moe.h`, MXFP4 in `project_iq4*.h`).

A tiny random `GptOssForCausalLM` (`tests.gguf_oai`: biases everywhere, sinks, a sliding first layer, YaRN,
8 experts of which a token takes 4) written as a `gpt-oss` GGUF with F32 or MXFP4 experts, read directly and
run by the native runner in each kernel build this CPU runs: its logits are transformers' over the same
weights (MXFP4's values put into the model) — to float rounding at F32, within the int8 activations' rounding
at MXFP4 (routings checked to be nowhere near a tie) — over a prefill and decode steps past the window, and
drafts are the bits of single steps. MXFP4's blocks are repacked without changing a value, by numpy and by
the kernel alike.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chatcli.engine.runners.native import NativeRunner
from chatcli.engine.weights.gguf_file import GGUFFile
from chatcli.engine.weights.gguf_lean import convert_gguf_lean, direct_reason
from chatcli.engine.weights.gguf_rope import rope_table
from chatcli.engine.weights.kquant_blocks import pack_mxfp4, packed_by
from chatcli.engine.weights.lean_file import LeanWeights
from tests.gguf_oai import tiny_gptoss, use_file_experts, write_gptoss
from tests.gguf_runs import IDS, Computed, assert_close, assert_drafts_are_single_steps

MARGIN = 0.1  # the least gap between a row's 4th router logit and its 5th, every layer (MXFP4)


def gptoss_runner(model, experts: str, tmp_path, kv_dtype: str = "float32") -> NativeRunner:
    path = write_gptoss(model, tmp_path / "gptoss.gguf", experts)
    assert direct_reason(GGUFFile(path)) is None
    lean = tmp_path / "gguf.safetensors"
    convert_gguf_lean(path, lean, 128, "test")
    return NativeRunner(LeanWeights(lean, "gguf", "test"), kv_dtype=kv_dtype, threads=2)


def logits(model, runner) -> tuple[np.ndarray, np.ndarray]:
    """transformers' logits over IDS and the runner's (a prefill of 8, then steps: past the window of 4)."""
    with torch.no_grad():
        want = model(torch.tensor([IDS])).logits[0].numpy()
    cache = runner.new_cache()
    got = np.concatenate([runner.verify(IDS[:8], cache), *(runner.verify([t], cache) for t in IDS[8:])])
    return got, want


def tie_margin(model, k: int = 4) -> float:
    seen = []
    hooks = [
        layer.mlp.router.register_forward_hook(lambda _m, _a, o: seen.append(o[0])) for layer in model.model.layers
    ]
    with torch.no_grad():
        model(torch.tensor([IDS]))
    for hook in hooks:
        hook.remove()
    return min(float((top[:, k - 1] - top[:, k]).min()) for top in (r.topk(k + 1).values for r in seen))


def test_a_float_gptoss_gguf_computes_transformers_logits(build, tmp_path):
    model = tiny_gptoss()
    runner = gptoss_runner(model, "F32", tmp_path)
    c = runner.config
    assert (c.family, c.experts, c.experts_used, c.ffn, c.act) == ("gpt_oss", 8, 4, 256, "swiglu_oai")
    assert c.sliding == (True, False) and c.window == 4 and c.biases and c.sinks
    got, want = logits(model, runner)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    assert_drafts_are_single_steps(runner)


@pytest.mark.parametrize("seed", [4, 5])  # routings far from a tie
def test_mxfp4_experts_compute_their_own_values(build, tmp_path, seed):
    model = tiny_gptoss(seed)
    runner = gptoss_runner(model, "MXFP4", tmp_path)
    assert set(runner.config.types.split("+")) == {"F32", "MXFP4"}
    use_file_experts(model)
    assert tie_margin(model) > MARGIN  # else rounding may route a row to the other expert
    got, want = logits(model, runner)
    assert_close(Computed(got, want, {"MXFP4"}))  # the MoE tests' tolerance: int8 activations' rounding
    assert_drafts_are_single_steps(runner)


def test_mxfp4_blocks_repack_without_changing_a_value(kernel):
    """Every scale byte (the subnormal 0 and 1 and the largest among them) and every nibble: the kernel's packer and
    numpy's give the same bytes, and the kernel's projection of them is the dequantized matrix's."""
    from chatcli.engine.runners.native import block_matrix
    from chatcli.engine.weights.lean_file import block_strides  # noqa: F401  (the layout's reader)

    rng = np.random.default_rng(0)
    n, k = 48, 256
    raw = rng.integers(0, 256, size=(n, k // 32, 17), dtype=np.uint8)
    raw[..., 0] = rng.integers(112, 136, size=(n, k // 32))  # scales 2^-16 .. 2^7
    raw[0, :2, 0] = [0, 1]
    raw = raw.reshape(n, -1)
    ours = pack_mxfp4(raw)
    theirs = packed_by(kernel, "MXFP4", raw)
    assert ours.keys() == theirs.keys() and all(np.array_equal(ours[key], theirs[key]) for key in ours)
    import gguf

    dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4).reshape(n, k)  # [n, k]
    x = rng.standard_normal((3, k)).astype(np.float32)
    y = np.zeros((3, n), np.float32)
    arrays = {key: np.ascontiguousarray(v) for key, v in theirs.items()}
    m = block_matrix("mxfp4", n, k, k, lambda a: arrays[a].ctypes.data if a in arrays else None)
    assert kernel.chatcli_project(__import__("ctypes").byref(m), x.ctypes.data, 3, y.ctypes.data, 2) == 0
    want = x @ dense[:, :].T
    assert np.abs(y - want).max() < 0.02 * np.abs(want).max()  # int8 activations' rounding


def test_yarn_rope_is_transformers_with_llamas_truncation(tmp_path):
    model = tiny_gptoss()
    path = write_gptoss(model, tmp_path / "gptoss.gguf")
    table = rope_table(GGUFFile(path), 64, 16)  # [T, 32, 2]
    rotary = model.model.rotary_emb
    cos, sin = rotary(torch.zeros(1), torch.arange(16)[None])
    assert np.allclose(table[:, :, 0], cos[0].numpy(), atol=1e-6) and np.allclose(
        table[:, :, 1], sin[0].numpy(), atol=1e-6
    )


def test_a_gptoss_file_missing_its_sinks_is_not_read_directly(tmp_path):
    from tests.gguf_models import rewrite_gguf

    path = write_gptoss(tiny_gptoss(), tmp_path / "gptoss.gguf")
    damaged = rewrite_gguf(path, tmp_path / "nosinks.gguf", tensors={"blk.1.attn_sinks.weight": None})
    assert direct_reason(GGUFFile(damaged)) == "blk.1.attn_sinks.weight is missing"


def test_a_gptoss_gguf_loads_on_its_own_blocks(kernel, tmp_path):
    """The whole load, as a user's: no longer refused, read directly, the engine's logits the direct runner's."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions

    path = write_gptoss(tiny_gptoss(4), tmp_path / "gptoss.gguf", "MXFP4")
    runner = load_engine(str(path), LoadOptions(device="cpu")).runner
    assert isinstance(runner, NativeRunner) and runner.config.family == "gpt_oss"
    (tmp_path / "again").mkdir()
    direct = gptoss_runner(tiny_gptoss(4), "MXFP4", tmp_path / "again", kv_dtype=runner.kv_dtype)
    assert np.array_equal(runner.verify(IDS[:6], runner.new_cache()), direct.verify(IDS[:6], direct.new_cache()))
