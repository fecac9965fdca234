"""A mixture of experts read from its GGUF's own blocks on the kernel (`gguf_lean`, `kernels/moe.h`).

Tiny random Qwen3-MoE (`qwen3moe`), Mixtral (`llama` with `expert_count`) and GraniteMoE (`granitemoe`: its
multipliers, the residual's on the experts' output too) models, eight experts of which
a token takes two in every layer, are written as GGUF files (the router F32, each expert's gate, up and
down stacked in 3-D tensors, as llama.cpp's converter writes them) and run by the native runner, in each
kernel build this CPU runs (AVX2's included): its logits must be transformers' over the same weights — to
float rounding at F32 and F16, within the int8 activations' rounding at K-quants and Q8_0 (where a
routing within rounding of a tie could take the other expert, as llama.cpp's can: the seeds' routings are
checked to be nowhere near one) — over a prefill, decode steps and drafts bit-equal to single steps. An
expert no row chooses is never computed, a qwen3moe file loads as a user's does, and GraniteMoeShared's
shared experts, which the kernel does not compute, are refused in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from chatcli.engine.load.options import LoadError
from chatcli.engine.runners.native import NativeRunner
from tests.gguf_models import Q4_K_M, tiny, uniform, write_gguf
from tests.gguf_runs import IDS, assert_close, assert_drafts_are_single_steps, computed, direct_runner

FLOATS = [("qwen3_moe", "F32"), ("qwen3_moe", "F16"), ("mixtral", "F32"), ("mixtral", "F16")]
FLOATS += [("granitemoe", "F32"), ("granitemoe", "F16")]
# (family, types, seed): seeds whose routing (transformers', over the file's weights) is nowhere near a tie
QUANTIZED = [
    ("qwen3_moe", Q4_K_M, 1),
    ("qwen3_moe", Q4_K_M, 2),
    ("mixtral", uniform("Q8_0"), 0),
    ("mixtral", uniform("Q5_K"), 0),
    ("granitemoe", Q4_K_M, 19),
]
MARGIN = 0.1  # the least gap between a row's last expert's router logit and the next one's, in every layer


def routes(model, ids: list[int]) -> list[torch.Tensor]:
    """Per layer, transformers' router logits [ids, experts] over `ids` (one forward)."""
    seen = []
    routers = [
        layer.mlp.gate if hasattr(layer, "mlp") else layer.block_sparse_moe.router for layer in model.model.layers
    ]
    hooks = [router.register_forward_hook(lambda _m, _a, o: seen.append(o[0])) for router in routers]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for hook in hooks:
        hook.remove()
    return seen


def tie_margin(model, k: int) -> float:
    """The least gap, over every layer and id, between a row's k-th router logit and its (k+1)-th."""
    return min(float((top[:, k - 1] - top[:, k]).min()) for top in (r.topk(k + 1).values for r in routes(model, IDS)))


@pytest.mark.parametrize(("family", "types"), FLOATS)
def test_a_float_moe_gguf_computes_transformers_logits(build, tmp_path, family, types):
    model = tiny(family, False)
    runner = direct_runner(model, types, tmp_path)
    assert runner.config.experts == 8 and runner.config.experts_used == 2 and runner.config.ffn == 256
    c = computed(model, types, runner)
    assert np.abs(c.got - c.want).max() < 1e-4 * np.abs(c.want).max()
    assert_drafts_are_single_steps(runner)


@pytest.mark.parametrize(("family", "types", "seed"), QUANTIZED, ids=lambda c: getattr(c, "__name__", str(c)))
def test_a_quantized_moe_gguf_computes_its_own_weights(build, tmp_path, family, types, seed):
    model = tiny(family, False, seed=seed)
    runner = direct_runner(model, types, tmp_path)
    c = computed(model, types, runner)  # the model now holds the file's weights
    assert tie_margin(model, 2) > MARGIN  # else rounding may route a row to the other expert
    assert_close(c)
    assert_drafts_are_single_steps(runner)


def test_a_prompts_chunk_gives_the_bits_of_single_steps(build, tmp_path):
    """A call of 16 rows or more projects expert by expert (an expert's rows unpack each block once where
    they are enough), fewer rows all chosen experts in one split: the same bits either way, and as steps."""
    runner = direct_runner(tiny("qwen3_moe", False, seed=1), Q4_K_M, tmp_path)
    ids = [int(i) for i in np.random.default_rng(3).integers(3, 500, size=96)]
    steps = runner.new_cache()
    single = np.concatenate([runner.verify([t], steps) for t in ids])
    chunked = runner.new_cache()
    rows = np.concatenate(
        [runner.verify(ids[:80], chunked), runner.verify(ids[80:90], chunked), runner.verify(ids[90:], chunked)]
    )
    assert np.array_equal(rows, single)


def test_an_expert_no_row_chooses_is_never_computed(kernel, tmp_path):
    """An expert that none of four ids chooses in the last layer holds NaN weights: transformers, which
    computes only the chosen experts, and the kernel give the same finite logits (a dense sum over every
    expert, its weight 0, would be NaN)."""
    model = tiny("qwen3_moe", False)
    ids = IDS[:4]
    chosen = routes(model, ids)[-1].topk(2).indices.unique().tolist()
    unused = next(e for e in range(8) if e not in chosen)
    experts = model.model.layers[-1].mlp.experts
    with torch.no_grad():
        experts.gate_up_proj[unused] = float("nan")
        experts.down_proj[unused] = float("nan")
        want = model(torch.tensor([ids])).logits[0].numpy()
    runner = direct_runner(model, "F32", tmp_path)
    cache = runner.new_cache()
    got = np.concatenate([runner.verify(ids[:2], cache), *(runner.verify([t], cache) for t in ids[2:])])
    assert np.isfinite(want).all() and np.isfinite(got).all()
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def test_a_qwen3moe_gguf_loads_on_its_own_blocks(kernel, tmp_path):
    """The whole load: no longer refused, its config written from the metadata, `--quantize auto` reads its
    blocks, and the engine's logits are the direct runner's; the active weights are the file's share a token
    reads."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions

    path = write_gguf(tiny("qwen3_moe", False, seed=1), tmp_path / "moe.gguf", Q4_K_M)
    runner = load_engine(str(path), LoadOptions(device="cpu")).runner
    assert isinstance(runner, NativeRunner) and runner.config.kind == "gguf" and runner.config.family == "qwen3_moe"
    assert runner.active_bytes < 0.5 * runner.weight_bytes  # two experts of eight
    (tmp_path / "again").mkdir()
    direct = direct_runner(tiny("qwen3_moe", False, seed=1), Q4_K_M, tmp_path / "again", kv_dtype=runner.kv_dtype)
    assert np.array_equal(runner.verify(IDS[:6], runner.new_cache()), direct.verify(IDS[:6], direct.new_cache()))


def test_a_granitemoe_gguf_loads_on_its_own_blocks(kernel, tmp_path):
    """The whole load of a GraniteMoE file: the config written from its metadata is transformers' (its experts and
    Granite's four multipliers), the lean file holds the residual and logit scales, and the engine's logits are
    the direct runner's."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from chatcli.engine.weights.gguf_file import GGUFFile
    from chatcli.engine.weights.gguf_meta import hf_config

    model = tiny("granitemoe", False, seed=19)
    path = write_gguf(model, tmp_path / "granitemoe.gguf", Q4_K_M)
    config = hf_config(GGUFFile(path))
    for key in ("model_type", "intermediate_size", "num_local_experts", "num_experts_per_tok", "embedding_multiplier",
                "residual_multiplier", "attention_multiplier", "logits_scaling"):  # fmt: skip
        assert config[key] == pytest.approx(getattr(model.config, key)), key
    runner = load_engine(str(path), LoadOptions(device="cpu")).runner
    assert isinstance(runner, NativeRunner) and runner.config.kind == "gguf" and runner.config.family == "granitemoe"
    assert (runner.config.residual_scale, runner.config.logits_scaling) == pytest.approx((0.4, 2.5))
    (tmp_path / "again").mkdir()
    direct = direct_runner(tiny("granitemoe", False, seed=19), Q4_K_M, tmp_path / "again", kv_dtype=runner.kv_dtype)
    assert np.array_equal(runner.verify(IDS[:6], runner.new_cache()), direct.verify(IDS[:6], direct.new_cache()))


def test_without_the_kernel_a_moe_gguf_is_one_line(no_kernel, tmp_path):
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions

    path = write_gguf(tiny("qwen3_moe", False), tmp_path / "moe.gguf", "F32")
    said = r"moe.gguf.*mixture of experts \(qwen3_moe\) runs only on the compiled kernel.*switched off for this test"
    with pytest.raises(LoadError, match=said):
        load_engine(str(path), LoadOptions(device="cpu"))


def test_a_granitemoe_with_shared_experts_is_one_line(kernel, tmp_path):
    """GraniteMoeShared's file (llama.cpp writes it as `granitemoe` with `expert_shared_feed_forward_length` and
    `ffn_{gate,up,down}_shexp` beside the routed experts): the kernel computes no shared experts, so it is refused
    in one line that says so, not run without them."""
    import gguf

    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from tests.gguf_models import rewrite_gguf

    source = write_gguf(tiny("granitemoe", False), tmp_path / "granitemoe.gguf", "F32")
    rng = np.random.default_rng(0)
    parts = [f"blk.{i}.ffn_{p}_shexp.weight" for i in range(2) for p in ("gate", "up", "down")]
    shared = {name: rng.standard_normal((256, 256), np.float32) for name in parts}
    width = {"granitemoe.expert_shared_feed_forward_length": (256, gguf.GGUFValueType.UINT32)}
    path = rewrite_gguf(source, tmp_path / "shared.gguf", width, shared)
    with pytest.raises(LoadError, match=r"shared.gguf: .*shared experts \(ffn_\*_shexp: GraniteMoeShared's\)") as err:
        load_engine(str(path), LoadOptions(device="cpu"))
    assert "\n" not in str(err.value)


NAN_ROUTER = r"""
import sys
from pathlib import Path
import numpy as np, torch
from tests.gguf_models import tiny
from tests.gguf_runs import IDS, direct_runner
model = tiny("qwen3_moe", False)
with torch.no_grad():
    model.model.layers[0].mlp.gate.weight.fill_(float("nan"))
runner = direct_runner(model, "F32", Path(sys.argv[1]))
cache = runner.new_cache()
rows = [runner.verify(IDS[:6], cache), runner.verify([IDS[6]], cache)]
print("nan" if all(np.isnan(r).all() for r in rows) else "numbers")
"""


def test_a_router_of_nan_weights_gives_nan_not_a_crash(kernel, tmp_path):
    """A damaged router (NaN logits) chose expert -1, out of range: the process crashed. Now every row takes
    the lowest experts and its logits are NaN (in a child: a crash must not take the test run with it)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    argv = [sys.executable, "-c", NAN_ROUTER, str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "nan"
