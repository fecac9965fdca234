"""The native runner (chatcli/engine/runners/kernels/decode.cpp over a memory-mapped lean file).

The torch lean runner over the same model is the reference: the kernel's fp32 logits are its
logits within float rounding over prefills, decodes and crops. Its int8 projection is the
textbook per-row quantization (int8 weights per output, uint8 activations per row, exact
integer dots). A prefill, a draft checked in one call and the same tokens one at a time give
exactly the same logits and cache contents, whatever the thread count. The best build this CPU
runs (AVX-512 VNNI or AVX2; test_kernel_builds runs each); skipped only on CPUs without AVX2 or
machines without a compiler (see the `kernel` fixture).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import numpy as np
import pytest
import torch

from chatcli.engine.engine import Finished
from chatcli.engine.runners import kernels
from chatcli.engine.runners.kernels.structs import WEIGHT_F32, WEIGHT_I8, Matrix
from chatcli.engine.runners.lean import LeanRunner
from chatcli.engine.runners.native import NativeCache, NativeRunner
from chatcli.engine.sample.sampling import SamplingParams
from chatcli.engine.weights.layouts import pack_int8, panels, unpack_int8
from tests.test_lean import close, drive
from tests.tiny import build_model, lean_weights

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, lookup=0)


@pytest.fixture(scope="module")
def files(tiny_loaded, tmp_path_factory):
    """The tiny model's lean files: the torch runner's dense fp32, the kernel's panels and int8."""
    folder = tmp_path_factory.mktemp("lean")
    return {
        kind: lean_weights(tiny_loaded.model, kind, folder, tiny_loaded.tokenizer)
        for kind in ("float32-dense", "float32-panels", "int8")
    }


def reference_int8(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Symmetric per-row int8 weights, asymmetric per-row uint8 activations, exact integer dots."""
    w_scale = np.maximum(np.abs(weight).max(1) / 127, 1e-8).astype(np.float32)  # [out]
    wq = np.clip(np.rint(weight / w_scale[:, None]), -127, 127).astype(np.int64)  # [out, in]
    lo, hi = np.minimum(x.min(1), 0), np.maximum(x.max(1), 0)  # [S]
    step = np.where(hi > lo, (hi - lo) / np.float32(255), np.float32(1)).astype(np.float32)
    zero = np.clip(np.rint(-lo / step), 0, 255)
    xq = np.clip(np.rint(x * (np.float32(1) / step)[:, None]) + zero[:, None], 0, 255).astype(np.int64)  # [S, in]
    dots = xq @ wq.T - zero.astype(np.int64)[:, None] * wq.sum(1)[None, :]  # [S, out], exact
    return step[:, None].astype(np.float64) * w_scale[None, :] * dots


def project(weight: np.ndarray, x: np.ndarray, int8: bool, threads: int = 2) -> np.ndarray:
    """`x [S, in] @ weight [out, in]^T` through the kernel's projection, in its weight layout."""
    lib = kernels.library()
    n, k = weight.shape
    keep = []
    if int8:
        packed, scale, wsum = (t.numpy() for t in pack_int8(torch.from_numpy(weight)))
        keep += [packed, scale, wsum]
        m = Matrix(WEIGHT_I8, n, k, -(-k // 4) * 4, packed.ctypes.data, scale.ctypes.data, wsum.ctypes.data)
    else:
        w = panels(torch.from_numpy(weight).t().contiguous()).numpy()
        keep.append(w)
        m = Matrix(WEIGHT_F32, n, k, k, w.ctypes.data, None, None)
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty((x.shape[0], n), dtype=np.float32)
    assert lib.chatcli_project(ctypes.byref(m), x.ctypes.data, x.shape[0], y.ctypes.data, threads) == 0
    return y


@pytest.mark.parametrize("shape", [(96, 64), (37, 50), (5, 3)])
def test_the_int8_projection_is_the_textbook_quantization(kernel, shape):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal(shape).astype(np.float32)  # [out, in], odd sizes: padded outputs and inputs
    x = (rng.standard_normal((7, shape[1])) * 3).astype(np.float32)  # [S, in]
    ours = project(weight, x, int8=True)
    exact = x.astype(np.float64) @ weight.T.astype(np.float64)
    assert ours.shape == (7, shape[0])
    assert np.allclose(ours, reference_int8(x, weight), rtol=1e-5, atol=1e-5)
    assert float(np.linalg.norm(ours - exact) / np.linalg.norm(exact)) < 0.03
    assert np.allclose(project(weight, x, int8=False), exact, rtol=1e-5, atol=1e-5)


def test_the_int8_packing_round_trips():
    weight = torch.randn(37, 50, generator=torch.Generator().manual_seed(3))
    packed, scale, wsum = pack_int8(weight)
    assert packed.shape == (3, 13, 16, 4) and scale.shape == wsum.shape == (48,)
    q = unpack_int8(packed, 37, 50)
    assert torch.equal(wsum[:37], q.sum(1, dtype=torch.int32))
    step = scale[:37, None]
    assert bool(((q.float() * step - weight).abs() <= step / 2 + 1e-6).all())


def test_int8_rows_are_each_computed_as_if_alone(kernel):
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((300, 64)).astype(np.float32)
    x = rng.standard_normal((9, 64)).astype(np.float32)
    x[4] *= 50  # one row with a far larger range: a shared scale would crush the others
    together = project(weight, x, int8=True)
    alone = np.concatenate([project(weight, x[i : i + 1], int8=True) for i in range(9)])
    assert np.array_equal(together, alone)


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_native_steps_track_the_torch_path_over_crops(tiny_loaded, files, kernel, kv_dtype):
    torch_path = LeanRunner(files["float32-dense"], kv_dtype=getattr(torch, kv_dtype))
    native = NativeRunner(files["float32-panels"], kv_dtype=kv_dtype)
    assert native.context_limit == torch_path.context_limit
    rel = 1e-4 if kv_dtype == "float32" else 2e-2
    for seed in range(2):
        assert (
            drive(
                torch_path,
                native,
                tiny_loaded.model.config.vocab_size,
                seed,
                steps=60,
                limit=native.context_limit,
                rel=rel,
            )
            > 20
        )


def test_native_int8_tracks_fp32(tiny_loaded, files, kernel):
    fp32, int8 = NativeRunner(files["float32-panels"]), NativeRunner(files["int8"])
    assert int8.quantized and int8.weight_bytes < fp32.weight_bytes / 3
    ids = list(range(3, 40))
    caches = fp32.new_cache(), int8.new_cache()
    for step in (ids, [5], [9], [11]):
        a, b = fp32.forward(step, caches[0]), int8.forward(step, caches[1])
        assert 0 < float(np.linalg.norm(a - b) / np.linalg.norm(a)) < 0.1  # quantized, and close
        assert int(a.argmax()) == int(b.argmax())


def test_odd_vocab_and_long_context(kernel, tmp_path):
    """A vocabulary that is no multiple of 16 or 64 (the masked tail of the head's last panel)
    and a history longer than one 16-wide block of attention scores."""
    model = build_model(vocab_size=403, max_positions=512, seed=2)
    torch_path = LeanRunner(lean_weights(model, "float32-dense", tmp_path), kv_dtype=torch.float32)
    native = NativeRunner(lean_weights(model, "float32-panels", tmp_path))
    ids = [(i * 37) % 403 for i in range(300)]
    caches = torch_path.new_cache(), native.new_cache()
    torch_path.forward(ids, caches[0]), native.forward(ids, caches[1])
    for token in (7, 402, 0):
        a, b = torch_path.forward([token], caches[0]), native.forward([token], caches[1])
        assert b.shape == (403,) and close(b, a, 1e-4)
    n = len(caches[1].ids)  # the transposed key blocks read back as the torch path's rows, partial block too
    assert n % 16 and close(caches[1].keys(n), caches[0].k[:, :, :n].numpy(), 1e-4)
    assert np.array_equal(caches[1].state()["k"][1], caches[1].keys(n))


@pytest.mark.parametrize("weights", ["float32-panels", "int8"])
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("threads", [1, 2])
def test_prefill_draft_and_steps_give_the_same_bits(files, kernel, weights, kv_dtype, threads):
    """One row at a time, a whole prefill, and a draft checked in one call: the same logits and the
    same cache, bit for bit (the engine relies on it to keep greedy replies with drafts)."""
    runner = NativeRunner(files[weights], kv_dtype=kv_dtype, threads=threads)
    assert runner.exact_verify
    prompt, draft = list(range(3, 40)), [9, 17, 250, 4, 4, 31, 99]
    one, together = runner.new_cache(), runner.new_cache()
    stepwise_prompt = [runner.forward([t], one) for t in prompt]
    assert np.array_equal(runner.forward(prompt, together), stepwise_prompt[-1])
    stepwise = np.stack([runner.forward([t], one) for t in draft])  # [7, V]
    checked = runner.verify(draft, together)  # [7, V]
    assert np.array_equal(checked, stepwise)
    end = len(prompt) + len(draft)
    assert one.ids == together.ids and len(one.ids) == end
    assert np.array_equal(together.keys(end), one.keys(end))
    assert np.array_equal(together.v[:, :, :end], one.v[:, :, :end])


def test_the_cache_crops_clones_and_round_trips_its_state(files, kernel):
    runner = NativeRunner(files["float32-panels"], kv_dtype="bfloat16")
    cache = runner.new_cache()
    runner.forward(list(range(3, 30)), cache)
    clone = cache.clone(10)
    assert clone.ids == cache.ids[:10] and np.array_equal(clone.keys(10), cache.keys(10))
    cache.crop(10)
    a, b = runner.forward([7], cache), runner.forward([7], clone)
    assert np.array_equal(a, b)
    restored = runner.new_cache()
    assert restored.restore(list(cache.ids), cache.state())
    assert np.array_equal(runner.forward([8], restored), runner.forward([8], cache))
    assert not runner.new_cache().restore([1, 2], cache.state())  # the ids must be the state's


def test_int8_drafts_keep_greedy_replies(files, tiny_model_dir, kernel):
    """Through the kernel, int8 drafts too: a greedy reply is the one it is without them."""
    from chatcli.engine.engine import Engine
    from chatcli.engine.load.lean import folder_tokenizer

    engine = Engine(NativeRunner(files["int8"]), folder_tokenizer(tiny_model_dir), "tiny")
    assert engine.lookup_for(SamplingParams(lookup=4)) == 4
    text = "def main():\n    print('hello world')\n    return 0\n"
    messages = [{"role": "user", "content": text * 3}]
    replies = []
    for params in (GREEDY, GREEDY.with_(lookup=4)):
        session = engine.new_session()
        done = [ev for ev in engine.generate(messages, session, params) if isinstance(ev, Finished)][0]
        replies.append((done.reply, list(session.cache.ids), done.stats.draft_tokens))
    assert replies[0][:2] == replies[1][:2]
    assert replies[0][2] == 0 and replies[1][2] > 0


def test_out_of_range_ids_and_positions_are_refused_not_read(files, tiny_loaded, kernel):
    runner = NativeRunner(files["float32-panels"])
    cache = runner.new_cache()
    runner.forward([3, 4], cache)
    with pytest.raises(IndexError):
        runner.forward([tiny_loaded.model.config.vocab_size], cache)
    with pytest.raises(IndexError):
        runner.forward([-1], cache)
    with pytest.raises(ValueError, match="context limit"):
        runner.forward([5] * runner.context_limit, cache)
    with pytest.raises(ValueError):
        runner.forward([], cache)
    assert cache.ids == [3, 4]


def test_a_dropped_runner_is_freed_at_once(files, kernel):
    """Nothing the kernel reads keeps a cycle: the runner and its mapping go with `del`."""
    import gc
    import weakref

    runner = NativeRunner(files["float32-panels"])
    gone = weakref.ref(runner)
    gc.disable()
    try:
        del runner
        assert gone() is None
    finally:
        gc.enable()


def test_the_cache_type_is_checked(files, kernel):
    runner = NativeRunner(files["float32-panels"], kv_dtype="float32")
    with pytest.raises(ValueError, match="float32, bfloat16, float16 or q8_0"):
        NativeRunner(files["float32-panels"], kv_dtype="float64")
    with pytest.raises(ValueError, match="float32-panels, int8, q4, q8 or gguf"):
        NativeRunner(files["float32-dense"])
    c = files["float32-panels"].config
    other = NativeCache(c.layers, c.kv_heads, c.head_dim, 64, "bfloat16")
    with pytest.raises(AssertionError):
        runner.forward([3], other)


def test_without_the_kernel_the_torch_path_runs(tiny_model_dir, no_kernel):
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions

    engine = load_engine(str(tiny_model_dir), LoadOptions(device="cpu"))
    assert isinstance(engine.runner, LeanRunner)
    cache = engine.runner.new_cache()
    engine.runner.forward([3, 4, 5], cache)
    assert engine.runner.forward([6], cache).shape == (engine.runner.config.vocab,)
    with pytest.raises(RuntimeError, match="switched off for this test"):
        NativeRunner(None)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(kernels.ENV, "off")
    kernels.library.cache_clear()
    try:
        assert kernels.library() is None and kernels.why_not() == "CHATCLI_KERNEL=off"
    finally:
        monkeypatch.delenv(kernels.ENV)
        kernels.library.cache_clear()


def test_a_failed_build_is_one_line(tmp_path, monkeypatch, kernel):
    bad = tmp_path / "decode.cpp"
    bad.write_text("int main( {\n")
    monkeypatch.setattr(kernels, "SOURCE", bad)
    cxx = kernels.compiler()
    target = kernels.library_path(cxx)
    with pytest.raises(RuntimeError, match="error") as failed:
        kernels.build(cxx, target)
    assert "\n" not in str(failed.value)
    assert not target.exists() and not list(target.parent.glob(f".{target.name}.tmp-*"))


def test_the_library_is_named_by_its_source_and_compiler(tmp_path, monkeypatch, kernel):
    cxx = kernels.compiler()
    first = kernels.library_path(cxx)
    assert kernels.library_path(cxx) == first
    other = tmp_path / "decode.cpp"
    other.write_text(kernels.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(kernels, "SOURCE", other)
    assert kernels.library_path(cxx) != first
    monkeypatch.undo()
    assert kernels.library_path([*cxx, "-DCHANGED"]) != first  # the compiler's command counts too


def test_a_second_openmp_runtime_keeps_the_torch_path(monkeypatch):
    monkeypatch.setattr(kernels, "openmp_runtimes", lambda: {"/torch/lib/libgomp-ab12.so.1", "/usr/lib/libgomp.so.1"})
    kernels.library.cache_clear()
    try:
        if kernels.compiler() is None or kernels.missing_cpu_flags():
            pytest.skip("the kernel does not load here anyway")
        assert kernels.library() is None and "second OpenMP runtime" in kernels.why_not()
    finally:
        monkeypatch.undo()
        kernels.library.cache_clear()


def test_the_kernel_runs_without_torch_and_shares_one_runtime_with_a_later_torch(kernel):
    """A native one-shot never imports torch; where a torch comes later (the HF runner, the
    bench), its OpenMP is the one the kernel loaded, not a second one."""
    code = (
        "import sys\n"
        "from chatcli.engine.runners import kernels\n"
        "assert kernels.library() is not None, kernels.why_not()\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "print(len(kernels.openmp_runtimes()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]
