"""The compiled decode step (chatcli/engine/kernels/decode.cpp) against the torch path.

The torch lean runner is the reference: the kernel's fp32 steps give its logits within
float rounding over prefills, decodes and crops; its int8 projection is the textbook
per-row asymmetric quantization; and rows checked together (a draft) give exactly the
logits and cache contents that the same tokens give one at a time, whatever the thread
count. Skipped only on CPUs without AVX-512 VNNI (see the `kernel` fixture).
"""

from __future__ import annotations

import pytest
import torch

from chatcli.engine import kernels
from chatcli.engine.compiled import Int8Rows
from chatcli.engine.engine import Finished
from chatcli.engine.lean import LeanRunner
from chatcli.engine.load import build_engine, context_limit, make_runner
from chatcli.engine.quantize import calibration_ids
from chatcli.engine.sampling import SamplingParams
from tests.test_lean import close, drive
from tests.tiny import build_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, lookup=0)


def reference_int8(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Symmetric per-row int8 weights, asymmetric per-row uint8 activations, exact integer dots."""
    w_scale = (weight.abs().amax(1) / 127).clamp_min(1e-8)  # [out]
    wq = torch.round(weight / w_scale[:, None]).clamp(-127, 127).long()  # [out, in]
    lo, hi = x.amin(1).clamp(max=0), x.amax(1).clamp(min=0)  # [S]
    step = torch.where(hi > lo, (hi - lo) / 255, torch.ones_like(hi))
    zero = torch.round(-lo / step).clamp(0, 255)
    xq = (torch.round(x / step[:, None]) + zero[:, None]).clamp(0, 255).long()  # [S, in]
    dots = xq @ wq.t() - zero.long()[:, None] * wq.sum(1)[None, :]  # [S, out], exact
    return step[:, None] * w_scale[None, :] * dots.float()


@pytest.mark.parametrize("shape", [(96, 64), (37, 50), (5, 3)])
def test_int8_rows_is_the_textbook_quantization(kernel, shape):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(*shape, generator=gen)  # [out, in], odd sizes: padded outputs and inputs
    x = torch.randn(7, shape[1], generator=gen) * 3  # [S, in]
    ours = Int8Rows(weight)(x)
    assert ours.shape == (7, shape[0])
    assert torch.allclose(ours, reference_int8(x, weight), rtol=1e-5, atol=1e-5)
    assert float((ours - x @ weight.t()).norm() / (x @ weight.t()).norm()) < 0.03
    step = weight.abs().amax(1, keepdim=True) / 127  # [out, 1]
    assert bool(((Int8Rows(weight).dequantized() - weight).abs() <= step / 2 + 1e-6).all())  # the packing round-trips


def test_int8_rows_computes_each_row_as_if_alone(kernel):
    gen = torch.Generator().manual_seed(1)
    proj = Int8Rows(torch.randn(300, 64, generator=gen))
    x = torch.randn(9, 64, generator=gen)
    x[4] *= 50  # one row with a far larger range: a shared scale would crush the others
    together = proj(x)
    alone = torch.cat([proj(x[i : i + 1]) for i in range(9)])
    assert torch.equal(together, alone)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_compiled_steps_track_the_torch_path_over_crops(tiny_loaded, kernel, kv_dtype):
    limit = context_limit(tiny_loaded.model.config, tiny_loaded.tokenizer)
    torch_path = LeanRunner(tiny_loaded.model, limit, kv_dtype=kv_dtype, kernel=False)
    compiled = LeanRunner(tiny_loaded.model, limit, kv_dtype=kv_dtype)
    assert torch_path.compiled is None and compiled.compiled is not None, compiled.kernel_why_not
    rel = 1e-4 if kv_dtype == torch.float32 else 2e-2
    for seed in range(2):
        assert drive(torch_path, compiled, tiny_loaded.model.config.vocab_size, seed, steps=60, limit=limit, rel=rel) > 20


def test_odd_vocab_and_long_context(kernel):
    """A vocabulary that is no multiple of 16 (the scalar tail of the fp32 head) and a history
    longer than one 16-wide block of attention scores."""
    model = build_model(vocab_size=403, max_positions=512, seed=2)
    torch_path = LeanRunner(model, 512, kv_dtype=torch.float32, kernel=False)
    compiled = LeanRunner(model, 512, kv_dtype=torch.float32)
    ids = [(i * 37) % 403 for i in range(300)]
    with torch.inference_mode():
        caches = torch_path.new_cache(), compiled.new_cache()
        torch_path.forward(ids, caches[0]), compiled.forward(ids, caches[1])
        for token in (7, 402, 0):
            a, b = torch_path.forward([token], caches[0]), compiled.forward([token], caches[1])
            assert b.shape == (403,) and close(b, a, 1e-4)


def int8_runner(loaded, **kw):
    limit = context_limit(loaded.model.config, loaded.tokenizer)
    return make_runner(loaded.model, limit, "lean", "int8", calibration_ids=calibration_ids(loaded.tokenizer), **kw)


@pytest.mark.parametrize("weights", ["float32", "int8"])
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_draft_is_checked_exactly_as_its_tokens_decode_one_by_one(tiny_loaded, kernel, weights, kv_dtype, threads):
    if weights == "int8":
        runner = int8_runner(tiny_loaded, kv_dtype=kv_dtype)
    else:
        runner = make_runner(tiny_loaded.model, context_limit(tiny_loaded.model.config, tiny_loaded.tokenizer), "lean",
                             kv_dtype=kv_dtype)
    assert runner.compiled is not None and runner.exact_verify
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            one, together = runner.new_cache(), runner.new_cache()
            prompt = list(range(3, 40))
            runner.forward(prompt, one)
            runner.forward(prompt, together)
            draft = [9, 17, 250, 4, 4, 31, 99]
            stepwise = torch.stack([runner.forward([t], one) for t in draft])  # [7, V]
            checked = runner.verify(draft, together)  # [7, V]
    finally:
        torch.set_num_threads(before)
    assert torch.equal(checked, stepwise)
    end = len(prompt) + len(draft)
    assert torch.equal(together.k[:, :, :end], one.k[:, :, :end]) and torch.equal(together.v[:, :, :end], one.v[:, :, :end])


def test_int8_drafts_keep_greedy_replies(tiny_loaded, kernel):
    """Through the kernel, int8 drafts too: a greedy reply is the one it is without them."""
    engine = build_engine(tiny_loaded, runner="lean", quantize="int8")
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


def test_the_reference_model_can_be_released(tiny_loaded, kernel):
    limit = context_limit(tiny_loaded.model.config, tiny_loaded.tokenizer)
    runner = LeanRunner(tiny_loaded.model, limit, kv_dtype=torch.float32)
    ids = list(range(3, 30))
    with torch.inference_mode():
        before = [runner.forward(ids, runner.new_cache())]
        cache = runner.new_cache()
        runner.forward(ids[:-1], cache)
        before.append(runner.forward(ids[-1:], cache))
        runner.release_reference()
        assert runner.compiled is not None
        cache = runner.new_cache()
        runner.forward(ids[:-1], cache)
        assert torch.equal(runner.forward(ids[-1:], cache), before[1])


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
    assert not target.exists() and not list(target.parent.glob(target.stem + ".*.tmp"))


def test_the_library_is_named_by_its_source(tmp_path, monkeypatch, kernel):
    cxx = kernels.compiler()
    first = kernels.library_path(cxx)
    other = tmp_path / "decode.cpp"
    other.write_text(kernels.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(kernels, "SOURCE", other)
    assert kernels.library_path(cxx) != first


def test_without_the_kernel_the_torch_path_runs(tiny_loaded, no_kernel):
    limit = context_limit(tiny_loaded.model.config, tiny_loaded.tokenizer)
    runner = LeanRunner(tiny_loaded.model, limit)
    assert runner.compiled is None and runner.kernel_why_not == "switched off for this test"
    with torch.inference_mode():
        cache = runner.new_cache()
        runner.forward([3, 4, 5], cache)
        assert runner.forward([6], cache).shape == (tiny_loaded.model.config.vocab_size,)


def test_a_dropped_runner_is_freed_at_once(tiny_loaded, kernel):
    """The compiled step keeps the weights it reads, not its runner: no cycle outlives `del`."""
    import gc
    import weakref

    runner = LeanRunner(tiny_loaded.model, 64, kv_dtype=torch.float32)
    assert runner.compiled is not None
    gone = weakref.ref(runner)
    gc.disable()
    try:
        del runner
        assert gone() is None
    finally:
        gc.enable()


def test_out_of_range_ids_are_refused_not_read(tiny_loaded, kernel):
    runner = LeanRunner(tiny_loaded.model, 64, kv_dtype=torch.float32)
    cache = runner.new_cache()
    with torch.inference_mode():
        runner.forward([3, 4], cache)
        with pytest.raises(IndexError):
            runner.forward([tiny_loaded.model.config.vocab_size], cache)
        with pytest.raises(ValueError, match="Int8Rows takes"):
            Int8Rows(torch.randn(8, 16))(torch.randn(2, 15))
    assert cache.ids == [3, 4]


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
