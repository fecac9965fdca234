"""The kernel's NEON build (kernels.BUILDS["neon"]: aarch64 with the dot-product extension), tested on
this x86 machine: built by Debian's cross compiler into a static program with a small harness
(tests/kernel_harness/harness.cpp, see tests/neon_case.py) and run under qemu-user on tiny models —
correctness, not speed. Skipped, with the reason, where `aarch64-linux-gnu-g++` or `qemu-aarch64` is
missing (`.ci/run` installs both).

Each case is a lean file of one or more weight kinds: fp32 panels, int8, q4 and q8 (a Llama's), and GGUF
files read directly in mixes that hold every block type the kernel runs (Q2_K..Q6_K; F16, BF16, F32;
IQ4_NL, IQ4_XS, MXFP4; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), on families with biases, q/k norms, soft-capping, GeGLU,
sandwich norms, a sliding window, a layer without rope, Granite's multipliers and OLMo 2's norms, caches in
fp32, bf16, fp16 and q8_0. On each, the NEON build keeps the exactness contract on its own (a prefill's last row, a
draft's rows and a sequence batched beside another are the bits of single steps); with every rope table the
identity (a layer without rope keeps none) it gives the AVX2 build's bits, row for row (the same integer dots
and the same fp32 operations in the same order: simd_neon.h), and with the real rope it is within rounding of
them (x86's compiler fuses rope's products: see neon_case.flat_rope). The fp32
case also tracks the torch path. Each kind's projection alone (chatcli_project, random blocks, a partial
last vector, activations at their extremes) gives the AVX2 build's bits too. ~30 s on two cores.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from chatcli.engine.runners import kernels
from chatcli.engine.runners.kernels.structs import BLOCK_KINDS, WEIGHT_F32, WEIGHT_I8
from chatcli.engine.runners.lean import LeanRunner
from chatcli.engine.runners.native import NativeRunner
from chatcli.engine.runners.native_cache import CACHE_DTYPES
from chatcli.engine.weights.kquant_blocks import RUN, tensor_parts
from chatcli.engine.weights.layouts import pack_int8, panels
from tests import neon_case
from tests.gguf_models import Q4_K_M, tiny
from tests.gguf_runs import direct_runner
from tests.kquants import random_blocks
from tests.test_lean import close
from tests.tiny import lean_weights

pytestmark = pytest.mark.skipif(neon_case.missing_tools() is not None, reason=str(neon_case.missing_tools()))

SCRIPT = neon_case.Script(
    prompt=[1, 5, 17, 200, 3, 99, 42, 7, 300, 350, 2, 64], draft=[9, 17, 250, 4, 4], other=[11, 12, 13, 300, 2, 8, 77]
)


def mix(**types: str):
    """A GGUF type chooser: the type of each tensor by its name's last part (attn_q, ffn_down, output, ...)."""

    def choose(name: str, shape: tuple[int, ...]) -> str:
        return types[name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]]

    choose.file_type, choose.types = "MOSTLY_Q4_K_M", types
    return choose


K_QUANTS = mix(
    attn_q="Q2_K", attn_k="Q3_K", attn_v="Q4_K", attn_output="Q5_K", ffn_gate="Q6_K", ffn_up="Q3_K",
    ffn_down="Q2_K", output="Q6_K", token_embd="Q4_K",
)  # fmt: skip
FLOATS_IQ4 = mix(
    attn_q="F16", attn_k="BF16", attn_v="F32", attn_output="IQ4_NL", ffn_gate="IQ4_XS", ffn_up="F16",
    ffn_down="IQ4_XS", output="BF16", token_embd="IQ4_NL",
)  # fmt: skip
LEGACY = mix(
    attn_q="Q4_0", attn_k="Q4_1", attn_v="Q5_0", attn_output="Q5_1", ffn_gate="Q8_0", ffn_up="Q4_1",
    ffn_down="Q5_0", output="Q8_0", token_embd="Q4_0",
)  # fmt: skip

TOLERANCE = {False: 1e-5, True: 1e-2}  # of the largest logit: fp32 rounding; a quantized activation's step

# (id, lean kind of the tiny Llama or (family, tied, GGUF types), KV cache)
CASES = [
    ("fp32-panels", "float32-panels", "float32"),
    ("int8", "int8", "bfloat16"),
    ("q4", "q4", "float16"),  # an fp16 KV cache
    ("q8", "q8", "bfloat16"),
    ("qwen2-kquants", ("qwen2", False, K_QUANTS), "float32"),
    ("qwen3-floats-iq4", ("qwen3", False, FLOATS_IQ4), "bfloat16"),
    ("gemma2-legacy", ("gemma2", True, LEGACY), "float32"),
    ("qwen3moe-q4km", ("qwen3_moe", False, Q4_K_M), "float32"),  # a mixture of experts (kernels/moe.h)
    ("smollm3-q4km", ("smollm3", True, Q4_K_M), "float32"),  # a layer without rope
    ("granite-legacy", ("granite", True, LEGACY), "bfloat16"),  # its multipliers
    ("olmo2-kquants", ("olmo2", False, K_QUANTS), "float32"),  # norms on the outputs alone, q/k norms of all q, k
    ("qwen3-legacy-q8kv", ("qwen3", False, LEGACY), "q8_0"),  # a q8_0 KV cache (heads of 32)
    ("gptoss-mxfp4", ("gpt_oss", False, "MXFP4"), "bfloat16"),  # biases, sinks, its SwiGLU, MXFP4 experts, YaRN
]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return neon_case.build_harness(tmp_path_factory.mktemp("neon"))


@pytest.fixture(scope="module")
def avx2():
    """The AVX2 build in place of `kernels.library()`: the runners' build here, the bits to match."""
    if "avx2" not in kernels.runnable() or kernels.compiler() is None:
        pytest.skip("the AVX2 build does not run here: nothing to build the cases with and compare to")
    lib, why = kernels.load("avx2")
    assert lib is not None, why
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "library", lambda: lib)
        yield lib


def runner_for(spec, kv_dtype: str, tiny_loaded, folder) -> NativeRunner:
    if isinstance(spec, str):
        weights = lean_weights(tiny_loaded.model, spec, folder, tiny_loaded.tokenizer)
        return NativeRunner(weights, kv_dtype=kv_dtype, threads=2)
    family, tied, types = spec
    if family == "gpt_oss":
        from tests.gguf_oai import tiny_gptoss
        from tests.test_gguf_gptoss import gptoss_runner

        return gptoss_runner(tiny_gptoss(4), types, folder, kv_dtype)
    runner = direct_runner(tiny(family, tied), types, folder)
    return NativeRunner(runner.weights, kv_dtype=kv_dtype, threads=2)


@dataclass
class Ran:
    runner: NativeRunner  # on the AVX2 build
    neon: list[np.ndarray]  # the NEON build's rows under qemu (neon_case.run)
    avx2: list[np.ndarray]  # the AVX2 build's (neon_case.script)
    neon_flat: list[np.ndarray]  # both again with every rope the identity (neon_case.flat_rope)
    avx2_flat: list[np.ndarray]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request, harness, avx2, tiny_loaded, tmp_path_factory) -> Ran:
    name, spec, kv_dtype = request.param
    folder = tmp_path_factory.mktemp(name)
    runner = runner_for(spec, kv_dtype, tiny_loaded, folder)
    if not isinstance(spec, str):  # the file holds each type the mix asks for (a tied model: no output)
        types = getattr(spec[2], "types", None)
        asked = {t for part, t in (types or {}).items() if part != "output" or not spec[1]}
        assert set(runner.config.types.split("+")) == asked or types is None
    rows = {}
    for flat in (False, True):
        script = replace(SCRIPT, flat_rope=flat)
        neon_case.write_case(runner, folder / f"case-{flat}.bin", script, kv_dtype)
        neon = neon_case.run(harness, folder / f"case-{flat}.bin", runner, script, folder / f"logits-{flat}.bin")
        rows[flat] = neon, neon_case.script(runner, script)
    return Ran(runner, *rows[False], *rows[True])


def test_neon_drafts_prefills_and_batches_are_single_steps(case):
    for steps, prefill, draft, batch in (case.neon, case.neon_flat):
        P = len(SCRIPT.prompt)
        assert np.array_equal(prefill[0], steps[P - 1])
        assert np.array_equal(draft, steps[P:])
        assert np.array_equal(batch[len(SCRIPT.other) :], steps)
        assert np.isfinite(steps).all() and np.abs(steps).max() > 0


def test_neon_gives_the_avx2_builds_bits_but_for_rope(case):
    """Every row, with rope the identity; with the real rope, the first position's (cos 1, sin 0)."""
    for name, a, b in zip(("steps", "prefill", "draft", "batch"), case.neon_flat, case.avx2_flat, strict=True):
        assert a.shape == b.shape, name
        differ = np.flatnonzero((a != b).any(-1))
        assert differ.size == 0, f"{name}: rows {differ.tolist()} differ, by up to {np.abs(a - b).max()}"
    assert np.array_equal(case.neon[0][0], case.avx2[0][0])
    assert np.array_equal(case.neon[3][0], case.avx2[3][0])  # the batch's first row, the other prompt's


def test_neon_is_close_to_the_avx2_build(case):
    """With the real rope: within rounding of the AVX2 build (whose rope is fused, see neon_case.flat_rope)."""
    for name, a, b in zip(("steps", "prefill", "draft", "batch"), case.neon, case.avx2, strict=True):
        error = float(np.abs(a - b).max() / np.abs(b).max())
        assert error < TOLERANCE[case.runner.quantized], (name, error)


def test_the_cases_hold_every_weight_kind():
    covered = set()
    for _name, spec, _kv in CASES:
        if isinstance(spec, str) or isinstance(spec[2], str):  # a lean kind, or a GGUF of one type (gpt-oss's experts)
            covered |= {spec} if isinstance(spec, str) else {RUN[spec[2]]}
            continue
        covered |= {RUN[t] for t in getattr(spec[2], "types", {}).values()}
    assert covered == {"float32-panels", "int8", *BLOCK_KINDS}
    assert {kv for *_, kv in CASES} == set(CACHE_DTYPES)  # and every KV cache the kernel keeps


def test_neon_tracks_the_torch_path(harness, avx2, tiny_loaded, tmp_path):
    """fp32 panels and an fp32 cache: each single step within float rounding of the torch lean runner's."""
    runner = runner_for("float32-panels", "float32", tiny_loaded, tmp_path)
    neon_case.write_case(runner, tmp_path / "case.bin", SCRIPT, "float32")
    steps = neon_case.run(harness, tmp_path / "case.bin", runner, SCRIPT, tmp_path / "logits.bin")[0]
    torch_path = LeanRunner(lean_weights(tiny_loaded.model, "float32-dense", tmp_path, tiny_loaded.tokenizer))
    assert torch_path.kv_dtype == torch.float32
    cache = torch_path.new_cache()
    for t, row in zip(SCRIPT.prompt + SCRIPT.draft, steps, strict=True):
        assert close(row, torch_path.forward([t], cache), rel=1e-4)


GGUF_TYPES = [
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "MXFP4",
]


def projection(name: str, n: int = 39) -> neon_case.Projection:
    """A projection of `n` outputs (not a multiple of 4: a last, partial vector) of kind `name`: int8 and
    fp32 panels over 50 inputs (padded), a GGUF type's random blocks (tests.kquants) over 96 or 512, F16,
    BF16 and F32 rows over 51 (an odd input last)."""
    rng = np.random.default_rng(len(name))
    if name in ("int8", "fp32"):
        weight = torch.from_numpy(rng.standard_normal((n, 50)).astype(np.float32))
        weight[0], weight[1] = 1.0, -1.0
        if name == "fp32":
            return neon_case.Projection(WEIGHT_F32, n, 50, 50, {"w": panels(weight.t().contiguous()).numpy()})
        packed, scale, wsum = (t.numpy() for t in pack_int8(weight))
        return neon_case.Projection(WEIGHT_I8, n, 50, 52, {"w": packed, "scale": scale, "wsum": wsum})
    k = 51 if name in ("F16", "BF16", "F32") else 512 if name.endswith("_K") or name == "IQ4_XS" else 96
    kind, arrays = tensor_parts(name, random_blocks(n, k, name, rng))
    arrays = {("mins" if key == "m" else key): a for key, a in arrays.items()}
    return neon_case.Projection(BLOCK_KINDS[kind], n, k, k, arrays)


@pytest.mark.parametrize("name", ["int8", "fp32", *GGUF_TYPES, "F16", "BF16", "F32"])
def test_each_projection_gives_the_avx2_builds_bits(harness, avx2, tmp_path, name):
    """chatcli_project of 7 rows (passes of 4 and 3) and of one, two at the activations' extremes (all
    +1, all -1): the NEON build's outputs are the AVX2 build's, bit for bit, partial last block included."""
    p = projection(name)
    x = (np.random.default_rng(1).standard_normal((7, p.k)) * 3).astype(np.float32)
    x[0], x[1] = 1.0, -1.0
    for rows in (x, x[2:3]):
        here = neon_case.project_here(p, rows)
        assert np.abs(here).max() > 0
        assert np.array_equal(neon_case.project_neon(harness, tmp_path, p, rows), here), name


def test_the_library_builds_for_arm_as_kernels_builds_it(tmp_path):
    """`kernels.build` of the NEON build (its flags, -shared and -fPIC) with the cross compiler: an
    aarch64 shared object with the entry points the loader declares."""
    target = tmp_path / "decode-neon.so"
    kernels.build([neon_case.CROSS], target, "neon")
    header = target.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    assert kernels.intact(target)
    symbols = subprocess.run(
        ["aarch64-linux-gnu-nm", "-D", "--defined-only", str(target)], capture_output=True, text=True
    )
    for name in ("chatcli_decode", "chatcli_decode_batch", "chatcli_project", "chatcli_pack"):
        assert f" {name}\n" in symbols.stdout + "\n", name
