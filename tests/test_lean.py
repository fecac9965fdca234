"""The lean runner against the transformers reference (HFRunner) on the same weights.

Same greedy tokens and logits within tolerance over multi-turn use with crops, on the
tiny random Llama and (marked real_model) on SmolLM2-135M; int8 close to fp32; the
fallback to HF for architectures the lean path does not cover.
"""

from __future__ import annotations

import random
import sys
from types import SimpleNamespace

import pytest
import torch

from chatcli.engine import lean, lean_cache
from chatcli.engine.compiled import Int8Rows
from chatcli.engine.engine import Engine, Finished
from chatcli.engine.lean import LeanCache, LeanRunner, lean_support
from chatcli.engine.load import LoadError, build_engine, context_limit, make_runner
from chatcli.engine.quantize import (
    Int8Dense,
    QuantizeError,
    calibration_ids,
    check_quantize,
    down_smoothing,
    quantize_hf_model,
)
from chatcli.engine.runner import HFRunner
from chatcli.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def runners(loaded):
    limit = context_limit(loaded.model.config, loaded.tokenizer)
    return HFRunner(loaded.model, limit), LeanRunner(loaded.model, limit)


def close(a: torch.Tensor, b: torch.Tensor, rel: float) -> bool:
    return float((a - b).abs().max()) <= rel * float(b.abs().max())


def drive(ref, ours, vocab: int, seed: int, steps: int, limit: int, rel: float):
    """Random prefills, decode steps and crops on both runners; every step's logits are compared."""
    rng = random.Random(seed)
    cache_ref, cache_ours = ref.new_cache(), ours.new_cache()
    compared = 0
    with torch.inference_mode():
        for _ in range(steps):
            action = rng.choice(["prefill", "decode", "decode", "crop"])
            if action == "crop" and len(cache_ref):
                keep = rng.randrange(0, len(cache_ref))
                cache_ref.crop(keep)
                cache_ours.crop(keep)
                assert cache_ours.ids == cache_ref.ids
                continue
            n = rng.randint(2, 24) if action == "prefill" else 1
            if len(cache_ref) + n > limit:
                cache_ref.crop(0)
                cache_ours.crop(0)
            ids = [rng.randrange(vocab) for _ in range(n)]
            a = ref.forward(ids, cache_ref)  # [V]
            b = ours.forward(ids, cache_ours)  # [V]
            assert a.shape == b.shape and b.dtype == torch.float32
            assert close(b, a, rel), f"logits differ after {len(cache_ref)} positions ({action})"
            assert int(a.argmax()) == int(b.argmax())
            assert cache_ours.ids == cache_ref.ids
            compared += 1
    return compared


def test_tiny_is_supported(tiny_loaded):
    assert lean_support(tiny_loaded.model) is None


def test_logits_match_hf_over_random_prefills_decodes_and_crops(tiny_loaded):
    ref, ours = runners(tiny_loaded)
    vocab = tiny_loaded.model.config.vocab_size
    for seed in range(3):
        assert drive(ref, ours, vocab, seed, steps=60, limit=ref.context_limit, rel=1e-4) > 20


def test_cache_is_reserved_up_front_and_counts_written_positions(tiny_loaded):
    _, ours = runners(tiny_loaded)
    cache = ours.new_cache()
    with torch.inference_mode():
        ours.forward(list(range(3, 9)), cache)
        k = cache.k
        assert cache.capacity == ours.context_limit
        per_position = cache.nbytes // 6
        assert cache.nbytes == 6 * per_position > 0
        ours.forward([10, 11], cache)
        cache.crop(4)  # the pages behind positions 4..7 stay written
        assert cache.nbytes == 8 * per_position
        ours.forward([12], cache)
    assert cache.k is k  # never moved
    assert cache.clone(3).nbytes == 3 * per_position


def test_huge_pages_always_keeps_the_reservation_lazy(monkeypatch):
    monkeypatch.setattr(lean_cache, "huge_pages_always", lambda: True)
    advised = []
    monkeypatch.setattr(lean_cache, "advise_no_huge_pages", lambda t: advised.append(t.numel()) or True)
    lean_cache.madvise_works.cache_clear()
    cache = LeanCache(2, 1, 64, 4096, torch.float32, "cpu")
    cache.reserve(3)
    assert cache.capacity == 4096 and advised[-2:] == [2 * 64 * 4096] * 2  # k and v, marked before any write
    monkeypatch.setattr(lean_cache, "advise_no_huge_pages", lambda t: False)
    lean_cache.madvise_works.cache_clear()
    cache = LeanCache(2, 1, 64, 4096, torch.float32, "cpu")
    cache.reserve(3)
    assert cache.capacity == lean_cache.CACHE_BLOCK  # cannot opt out of huge pages: grow in blocks
    lean_cache.madvise_works.cache_clear()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_NOHUGEPAGE) is Linux's")
def test_madvise_no_huge_pages_is_accepted():
    assert lean_cache.advise_no_huge_pages(torch.empty(1 << 22, dtype=torch.uint8))


def test_int8_needs_float32_weights(tiny_loaded):
    bf16 = SimpleNamespace(dtype=torch.bfloat16, device=torch.device("cpu"), config=tiny_loaded.model.config)
    with pytest.raises(LoadError, match="--quantize int8 quantizes float32 weights; the model is bfloat16"):
        make_runner(bf16, 64, "lean", "int8")


def test_cache_off_the_cpu_grows_in_blocks():
    cache = LeanCache(2, 1, 4, 4096, torch.float32, "meta")  # like a GPU: memory committed when allocated
    cache.reserve(10)
    assert cache.capacity == lean_cache.CACHE_BLOCK
    assert LeanCache(2, 1, 4, 4096, torch.float32, "cpu").capacity == 0  # nothing before the first forward


def test_cache_grows_in_blocks_and_keeps_what_it_holds(tiny_loaded, monkeypatch):
    monkeypatch.setattr(lean_cache, "CACHE_BLOCK", 8)
    monkeypatch.setattr(lean_cache, "RESERVE_BYTES", 1)  # too little to reserve up front: grow instead
    ref, ours = runners(tiny_loaded)
    cache = ours.new_cache()
    capacities = []
    with torch.inference_mode():
        ours.forward(list(range(3, 9)), cache)
        capacities.append(cache.capacity)
        cache_ref = ref.new_cache()
        ref.forward(list(range(3, 9)), cache_ref)
        for i in range(20):  # crosses two block boundaries while decoding
            a = ref.forward([10 + i], cache_ref)
            b = ours.forward([10 + i], cache)
            assert close(b, a, 1e-4)
            capacities.append(cache.capacity)
    assert capacities[0] == 8 and capacities[-1] == 32
    assert capacities == sorted(capacities)
    assert cache.nbytes == 2 * cache.k[:, :, :26].numel() * cache.k.element_size()


def test_crop_keeps_capacity_and_overwrites(tiny_loaded):
    ref, ours = runners(tiny_loaded)
    cache = ours.new_cache()
    with torch.inference_mode():
        first = ours.forward([5, 6, 7, 8], cache)
        before = cache.nbytes
        cache.crop(2)
        assert len(cache) == 2 and cache.nbytes == before
        ours.forward([9, 9], cache)  # positions 2..3 now hold other ids
        cache.crop(2)
        again = ours.forward([7, 8], cache)
    assert torch.equal(first, again) or close(again, first, 1e-5)


def test_context_limit_is_enforced(tiny_loaded):
    _, ours = runners(tiny_loaded)
    cache = ours.new_cache()
    with torch.inference_mode(), pytest.raises(ValueError, match="context limit"):
        ours.forward([5] * (ours.context_limit + 1), cache)
    with pytest.raises(ValueError):
        ours.forward([], cache)


def test_long_lived_front_ends_drop_the_reference_model(tiny_model_dir):
    import weakref

    from chatcli.engine.load import LoadOptions
    from chatcli.options import StartOptions

    start = StartOptions(model=str(tiny_model_dir), load=LoadOptions(device="cpu", kv_dtype="float32"))
    kept = start.load_engine(long_lived=False)  # one-shot: exits before the copy would pay
    assert kept.runner.model is not None
    engine = start.load_engine()
    assert isinstance(engine.runner, LeanRunner) and engine.runner.model is None
    history = [{"role": "user", "content": "Hello, how are you?"}]
    replies = [[ev for ev in e.generate(history, e.new_session(), GREEDY) if isinstance(ev, Finished)][0].reply
               for e in (kept, engine)]
    assert replies[0] == replies[1]
    gone = weakref.ref(kept.runner.model)
    kept.runner.release_reference()
    assert gone() is None  # nothing else holds the transformers model


def test_engine_replies_match_hf_over_a_conversation_with_an_edit(tiny_loaded):
    hf_engine = build_engine(tiny_loaded, runner="hf")
    lean_engine = build_engine(tiny_loaded, runner="lean", kv_dtype="float32")
    assert isinstance(lean_engine.runner, LeanRunner) and isinstance(hf_engine.runner, HFRunner)
    sessions = {e: e.new_session() for e in (hf_engine, lean_engine)}
    history: list[dict] = []
    user_turns = ["Hello, how are you?", "What is the capital of France?", "café naïve", "def main():"]
    for i, text in enumerate(user_turns):
        history.append({"role": "user", "content": text})
        results = []
        for engine, session in sessions.items():
            done = [ev for ev in engine.generate(history, session, GREEDY) if isinstance(ev, Finished)][0]
            results.append(done)
        a, b = results
        assert b.reply == a.reply and b.finish_reason == a.finish_reason
        assert b.stats.cached_tokens == a.stats.cached_tokens and b.stats.prompt_tokens == a.stats.prompt_tokens
        history.append({"role": "assistant", "content": a.reply})
        if i == 1:  # the user edits their first message: both caches crop to the system-less prefix
            history[0] = {"role": "user", "content": "Hi there!"}


def test_auto_picks_lean_for_llama(tiny_loaded):
    assert isinstance(build_engine(tiny_loaded).runner, LeanRunner)


def _tiny_mistral():
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return MistralForCausalLM(config).eval()


def test_other_architectures_fall_back_to_hf():
    model = _tiny_mistral()
    assert "mistral" in lean_support(model)
    assert isinstance(make_runner(model, 64, "auto"), HFRunner)
    with pytest.raises(LoadError, match="--runner lean"):
        make_runner(model, 64, "lean")


@pytest.mark.parametrize(
    "change, reason",
    [({"attention_bias": True}, "attention biases"), ({"hidden_act": "gelu"}, "activation"),
     ({"rope_parameters": {"rope_type": "dynamic"}}, "rope type")],
)
def test_unsupported_llama_variants_are_named(tiny_loaded, change, reason):
    config = SimpleNamespace(**{**tiny_loaded.model.config.to_dict(), **change})
    fake = SimpleNamespace(config=config, model=tiny_loaded.model.model)
    assert reason in lean_support(fake)


def test_int8_dense_is_close_to_fp32():
    torch.manual_seed(0)
    weight = torch.randn(96, 64)  # [out, in]
    x = torch.randn(5, 64)  # [S, in]
    exact = x @ weight.t()
    approx = Int8Dense(weight)(x)
    assert approx.shape == exact.shape
    assert float((approx - exact).norm() / exact.norm()) < 0.03


def test_bf16_cache_tracks_fp32_over_crops(tiny_loaded):
    limit = context_limit(tiny_loaded.model.config, tiny_loaded.tokenizer)
    exact = LeanRunner(tiny_loaded.model, limit, kv_dtype=torch.float32)
    bf16 = LeanRunner(tiny_loaded.model, limit, kv_dtype=torch.bfloat16)
    assert bf16.new_cache().k.dtype == torch.bfloat16
    compared = drive(exact, bf16, tiny_loaded.model.config.vocab_size, seed=3, steps=40, limit=limit, rel=2e-2)
    assert compared > 10


def test_kv_dtype_auto_follows_the_cpu(tiny_loaded, monkeypatch):
    import chatcli.engine.cpu as cpu

    limit = context_limit(tiny_loaded.model.config, tiny_loaded.tokenizer)
    for native, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(cpu, "has_native_bf16", lambda native=native: native)
        assert make_runner(tiny_loaded.model, limit, "lean").kv_dtype == want
        assert make_runner(tiny_loaded.model, limit, "lean", kv_dtype="float32").kv_dtype == torch.float32
    assert isinstance(make_runner(tiny_loaded.model, limit, "hf"), HFRunner)  # auto: the HF cache as it is
    with pytest.raises(LoadError, match="--kv-dtype bfloat16: the HF runner"):
        make_runner(tiny_loaded.model, limit, "hf", kv_dtype="bfloat16")
    with pytest.raises(LoadError, match="--kv-dtype must be"):
        make_runner(tiny_loaded.model, limit, "lean", kv_dtype="int4")


@pytest.fixture(params=["kernel", "torch"])
def int8_path(request):
    """Each int8 decode path: the compiled kernel's `Int8Rows` and torch's fbgemm `Int8Dense`."""
    if request.param == "kernel":
        request.getfixturevalue("kernel")
        return Int8Rows
    request.getfixturevalue("no_kernel")
    return Int8Dense


def test_int8_lean_runner_tracks_fp32(tiny_loaded, int8_path):
    limit = context_limit(tiny_loaded.model.config, tiny_loaded.tokenizer)
    fp32 = LeanRunner(tiny_loaded.model, limit)
    with pytest.raises(ValueError, match="calibration"):
        make_runner(tiny_loaded.model, limit, "lean", "int8")
    int8 = make_runner(tiny_loaded.model, limit, "lean", "int8", calibration_ids=calibration_ids(tiny_loaded.tokenizer))
    assert int8.quantized and not fp32.quantized
    assert int8.weight_bytes < fp32.weight_bytes / 2  # what a decode step reads
    layer = int8.layers[0]
    assert all(isinstance(p.decode, int8_path) and p.w_t is not None for p in (layer.qkv, layer.out, layer.gate_up, layer.down))
    assert isinstance(int8.head.decode, int8_path) and int8.head.w_t is None  # the head only ever sees one row
    assert all(p.w_t.dtype == torch.float32 for p in (layer.qkv, layer.down))  # prefill on the model's own weights
    assert (int8.compiled is not None) == (int8_path is Int8Rows)
    ids = list(range(3, 40))
    with torch.inference_mode():
        caches = fp32.new_cache(), int8.new_cache()
        a, b = fp32.forward(ids, caches[0]), int8.forward(ids, caches[1])
        assert float((a - b).norm() / a.norm()) < 0.1
        assert int(a.argmax()) == int(b.argmax())
        for token in (5, 9, 11):  # decode steps: the int8 projections
            a, b = fp32.forward([token], caches[0]), int8.forward([token], caches[1])
            assert float((a - b).norm() / a.norm()) < 0.1


def test_int8_prefill_runs_on_dense_weights(tiny_loaded, int8_path, monkeypatch):
    limit = context_limit(tiny_loaded.model.config, tiny_loaded.tokenizer)
    int8 = make_runner(tiny_loaded.model, limit, "lean", "int8", calibration_ids=calibration_ids(tiny_loaded.tokenizer))
    calls = []
    original = int8_path.__call__
    monkeypatch.setattr(int8_path, "__call__", lambda self, x: calls.append(x.shape[0]) or original(self, x))
    with torch.inference_mode():
        cache = int8.new_cache()
        int8.forward(list(range(3, 20)), cache)
        assert calls == [1]  # only the head, on the last position
        calls.clear()
        int8.forward([7], cache)
    # a decode step: each projection in torch, or all of them inside the kernel's one call
    assert calls == ([1] * (4 * len(int8.layers) + 1) if int8_path is Int8Dense else [])


def test_smoothing_scales_leave_the_function_unchanged(tiny_loaded):
    model = tiny_loaded.model
    limit = context_limit(model.config, tiny_loaded.tokenizer)
    plain = LeanRunner(model, limit, kv_dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    scales = [torch.rand(model.config.intermediate_size, generator=gen) * 4 + 0.25 for _ in model.model.layers]
    smoothed = LeanRunner(model, limit, kv_dtype=torch.float32, smooth=scales)
    measured = down_smoothing(model, calibration_ids(tiny_loaded.tokenizer))
    assert len(measured) == len(scales) and all(bool((s > 0).all()) for s in measured)
    ids = list(range(3, 30))
    with torch.inference_mode():
        a, b = plain.forward(ids, plain.new_cache()), smoothed.forward(ids, smoothed.new_cache())
    assert close(b, a, 1e-4)


def test_int8_hf_runner_quantizes_a_copy(tiny_loaded):
    model = tiny_loaded.model
    copy = quantize_hf_model(model)
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert type(copy.model.layers[0].self_attn.q_proj) is not torch.nn.Linear
    runner = make_runner(model, 256, "hf", "int8")
    assert isinstance(runner, HFRunner) and runner.model is not model
    assert runner.quantized and not make_runner(model, 256, "hf").quantized  # saved caches tell them apart


def test_quantize_choices_are_checked():
    check_quantize(None, "cuda")
    with pytest.raises(QuantizeError, match="int8"):
        check_quantize("int4", "cpu")
    with pytest.raises(QuantizeError, match="CPU only"):
        check_quantize("int8", "cuda")


@pytest.mark.real_model
def test_real_model_matches_hf(real_engine):
    model = real_engine.runner.model
    ref = HFRunner(model, real_engine.context_limit)
    assert isinstance(real_engine.runner, LeanRunner)
    ours = LeanRunner(model, real_engine.context_limit, kv_dtype=torch.float32)  # exact: the cache in fp32
    assert drive(ref, ours, model.config.vocab_size, seed=7, steps=14, limit=512, rel=1e-3) >= 8


@pytest.mark.real_model
def test_real_model_bf16_cache_tracks_fp32(real_engine):
    model = real_engine.runner.model
    exact = LeanRunner(model, real_engine.context_limit, kv_dtype=torch.float32)
    bf16 = LeanRunner(model, real_engine.context_limit, kv_dtype=torch.bfloat16)
    ids = real_engine.tokenizer.encode("The history of the city begins with a small settlement on the river, which")
    with torch.inference_mode():
        caches = exact.new_cache(), bf16.new_cache()
        a, b = exact.forward(ids, caches[0]), bf16.forward(ids, caches[1])
        for _ in range(12):  # greedy decode from both: the same tokens, logits within bf16 rounding
            assert int(a.argmax()) == int(b.argmax())
            assert float((a - b).abs().max()) < 0.05 * float(a.abs().max())
            token = int(a.argmax())
            a, b = exact.forward([token], caches[0]), bf16.forward([token], caches[1])
    assert caches[1].k.dtype == torch.bfloat16 and caches[1].nbytes * 2 == caches[0].nbytes


@pytest.mark.real_model
def test_real_model_greedy_replies_match_hf(real_engine):
    model = real_engine.runner.model
    hf = Engine(HFRunner(model, real_engine.context_limit), real_engine.tokenizer)
    exact = Engine(LeanRunner(model, real_engine.context_limit, kv_dtype=torch.float32), real_engine.tokenizer)
    history = [{"role": "user", "content": "What is the capital of France?"}]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    replies = []
    for engine in (hf, exact):
        session = engine.new_session()
        turn = list(history)
        out = []
        for follow_up in ("And of Italy?", "Thanks!"):
            done = [ev for ev in engine.generate(turn, session, params) if isinstance(ev, Finished)][0]
            out.append(done.reply)
            turn += [{"role": "assistant", "content": done.reply}, {"role": "user", "content": follow_up}]
        replies.append(out)
    assert replies[0] == replies[1]
    assert all(replies[0])


def test_fused_transposed_matches_cat_transpose_scale_and_interleave():
    from chatcli.engine.lean import fused_transposed

    torch.manual_seed(1)
    q, k, v = torch.randn(8, 6), torch.randn(4, 6), torch.randn(4, 6)  # [out_i, in]: 2 q heads, 1 kv head, hd 4
    scale = torch.rand(6) + 0.5  # [in]
    plain = fused_transposed([q, k, v])
    assert plain.is_contiguous() and torch.equal(plain, torch.cat([q, k, v]).t())
    scaled = fused_transposed([q, k, v], scale)
    assert torch.allclose(scaled, (torch.cat([q, k, v]) * scale).t())
    mixed = fused_transposed([q, k, v], None, interleave=(2, 1))
    order = torch.tensor([0, 2, 1, 3])  # hd 4: rotate-half pairs (0, 2), (1, 3) become adjacent
    assert torch.equal(mixed[:, :4], q[order].t()) and torch.equal(mixed[:, 4:8], q[4 + order].t())
    assert torch.equal(mixed[:, 8:12], k[order].t()) and torch.equal(mixed[:, 12:], v.t())
