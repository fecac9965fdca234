"""The torch lean runner against the transformers reference (HFRunner) on the same weights.

Same greedy tokens and logits within tolerance over multi-turn use with crops, on the
tiny random Llama and (marked real_model) on SmolLM2-135M; int8 close to fp32; the
fallback to HF for architectures the lean path does not cover; its KV cache's memory.
The native runner (the compiled kernel) has the same checks in test_kernel.
"""

from __future__ import annotations

import random
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from chatcli.engine.engine import Engine, Finished
from chatcli.engine.kv import memory as kv_memory
from chatcli.engine.load.hf import LoadedModel, build_engine, make_hf_runner
from chatcli.engine.load.options import LoadError, check_quantize, pick_kv_dtype
from chatcli.engine.runners.hf import HFRunner
from chatcli.engine.runners.lean import LeanRunner
from chatcli.engine.runners.lean_cache import LeanCache
from chatcli.engine.sample.sampling import SamplingParams
from chatcli.engine.weights.families import context_limit, lean_support
from chatcli.engine.weights.lean_convert import fused_transposed, projections
from chatcli.engine.weights.lean_file import head_rows
from chatcli.engine.weights.quantize import Int8Dense, calibration_ids, down_smoothing, quantize_hf_model
from tests.conftest import require_kernel
from tests.tiny import build_tokenizer, lean_weights

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def dense(tiny_loaded, tmp_path_factory):
    return lean_weights(tiny_loaded.model, "float32-dense", tmp_path_factory.mktemp("dense"), tiny_loaded.tokenizer)


@pytest.fixture(scope="module")
def int8_file(tiny_loaded, tmp_path_factory):
    return lean_weights(tiny_loaded.model, "int8", tmp_path_factory.mktemp("int8"), tiny_loaded.tokenizer)


def runners(loaded, dense, **kw):
    limit = context_limit(loaded.model.config, loaded.tokenizer)
    return HFRunner(loaded.model, limit), LeanRunner(dense, **kw)


def close(a, b, rel: float) -> bool:
    return float(np.abs(a - b).max()) <= rel * float(np.abs(b).max())


def drive(ref, ours, vocab: int, seed: int, steps: int, limit: int, rel: float):
    """Random prefills, decode steps and crops on both runners; every step's logits are compared."""
    rng = random.Random(seed)
    cache_ref, cache_ours = ref.new_cache(), ours.new_cache()
    compared = 0
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
        assert isinstance(b, np.ndarray) and a.shape == b.shape and b.dtype == np.float32
        assert close(b, a, rel), f"logits differ after {len(cache_ref)} positions ({action})"
        assert int(a.argmax()) == int(b.argmax())
        assert cache_ours.ids == cache_ref.ids
        compared += 1
    return compared


def test_tiny_is_supported(tiny_loaded):
    assert lean_support(tiny_loaded.model.config) is None
    assert lean_support(tiny_loaded.model.config.to_dict()) is None  # config.json as read by the loader


def test_logits_match_hf_over_random_prefills_decodes_and_crops(tiny_loaded, dense):
    ref, ours = runners(tiny_loaded, dense)
    vocab = tiny_loaded.model.config.vocab_size
    for seed in range(3):
        assert drive(ref, ours, vocab, seed, steps=60, limit=ref.context_limit, rel=1e-4) > 20


def test_weights_are_views_of_the_mapped_file(tiny_loaded, dense):
    _, ours = runners(tiny_loaded, dense)
    base, size = dense.file.base, dense.file.size
    for tensor in (ours.embed, ours.layers[0].qkv.w_t, ours.layers[-1].down.w_t, ours.head.w_t):
        assert base <= tensor.data_ptr() < base + size  # no copy: the page cache's pages
    assert "/proc" and dense.file.path.name in open("/proc/self/maps").read()


def test_cache_is_reserved_up_front_and_counts_written_positions(tiny_loaded, dense):
    _, ours = runners(tiny_loaded, dense)
    cache = ours.new_cache()
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
    monkeypatch.setattr(kv_memory, "huge_pages_always", lambda: True)
    advised = []
    monkeypatch.setattr(kv_memory, "advise_no_huge_pages", lambda address, nbytes: advised.append(nbytes) or True)
    kv_memory.madvise_works.cache_clear()
    cache = LeanCache(2, 1, 64, 4096, torch.float32, "cpu")
    cache.reserve(3)
    assert cache.capacity == 4096 and advised[-2:] == [4 * 2 * 64 * 4096] * 2  # k and v, marked before any write
    monkeypatch.setattr(kv_memory, "advise_no_huge_pages", lambda address, nbytes: False)
    kv_memory.madvise_works.cache_clear()
    cache = LeanCache(2, 1, 64, 4096, torch.float32, "cpu")
    cache.reserve(3)
    assert cache.capacity == kv_memory.CACHE_BLOCK  # cannot opt out of huge pages: grow in blocks
    kv_memory.madvise_works.cache_clear()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_NOHUGEPAGE) is Linux's")
def test_madvise_no_huge_pages_is_accepted():
    buffer = torch.empty(1 << 22, dtype=torch.uint8)
    assert kv_memory.advise_no_huge_pages(buffer.data_ptr(), buffer.numel())


def test_int8_needs_float32_weights_on_the_cpu():
    check_quantize(None, "cuda", "bfloat16")
    with pytest.raises(LoadError, match="--quantize int8 quantizes float32 weights; the model is bfloat16"):
        check_quantize("int8", "cpu", "bfloat16")
    with pytest.raises(LoadError, match="--quantize must be one of auto, none, int8"):
        check_quantize("int4", "cpu", "float32")
    with pytest.raises(LoadError, match="CPU only"):
        check_quantize("int8", "cuda", "float32")


def test_cache_off_the_cpu_grows_in_blocks():
    cache = LeanCache(2, 1, 4, 4096, torch.float32, "meta")  # like a GPU: memory committed when allocated
    cache.reserve(10)
    assert cache.capacity == kv_memory.CACHE_BLOCK
    assert LeanCache(2, 1, 4, 4096, torch.float32, "cpu").capacity == 0  # nothing before the first forward


def test_cache_grows_in_blocks_and_keeps_what_it_holds(tiny_loaded, dense, monkeypatch):
    monkeypatch.setattr(kv_memory, "CACHE_BLOCK", 8)
    monkeypatch.setattr(kv_memory, "RESERVE_BYTES", 1)  # too little to reserve up front: grow instead
    ref, ours = runners(tiny_loaded, dense)
    cache = ours.new_cache()
    capacities = []
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


def test_crop_keeps_capacity_and_overwrites(tiny_loaded, dense):
    _, ours = runners(tiny_loaded, dense)
    cache = ours.new_cache()
    first = ours.forward([5, 6, 7, 8], cache)
    before = cache.nbytes
    cache.crop(2)
    assert len(cache) == 2 and cache.nbytes == before
    ours.forward([9, 9], cache)  # positions 2..3 now hold other ids
    cache.crop(2)
    again = ours.forward([7, 8], cache)
    assert close(again, first, 1e-5)


def test_context_limit_is_enforced(tiny_loaded, dense):
    _, ours = runners(tiny_loaded, dense)
    cache = ours.new_cache()
    with pytest.raises(ValueError, match="context limit"):
        ours.forward([5] * (ours.context_limit + 1), cache)
    with pytest.raises(ValueError):
        ours.forward([], cache)


def test_front_ends_hold_no_transformers_model(tiny_model_dir, no_kernel):
    from chatcli.engine.load.options import LoadOptions
    from chatcli.options import StartOptions

    engine = StartOptions(model=str(tiny_model_dir), load=LoadOptions(device="cpu")).load_engine()
    assert isinstance(engine.runner, LeanRunner)
    assert not any(isinstance(v, torch.nn.Module) for v in vars(engine.runner).values())
    assert type(engine.tokenizer).__name__ == "FolderTokenizer"


@pytest.mark.parametrize("kernel", [False, True])
def test_engine_replies_match_hf_over_a_conversation_with_an_edit(tiny_loaded, kernel):
    if kernel:
        require_kernel()
    hf_engine = build_engine(tiny_loaded, runner="hf")
    lean_engine = build_engine(tiny_loaded, runner="lean", kv_dtype="float32", kernel=kernel)
    assert type(lean_engine.runner).__name__ == ("NativeRunner" if kernel else "LeanRunner")
    assert isinstance(hf_engine.runner, HFRunner)
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


def test_auto_picks_a_lean_runner_for_llama(tiny_loaded):
    assert type(build_engine(tiny_loaded).runner).__name__ in ("LeanRunner", "NativeRunner")


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = build_tokenizer()
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=64)
    return GPT2LMHeadModel(config).eval(), tokenizer


def test_other_architectures_fall_back_to_hf():
    model, tokenizer = _tiny_gpt2()
    assert "'gpt2' is not in the lean path (llama, mistral, qwen2" in lean_support(model.config)
    loaded = LoadedModel(model, tokenizer, "gpt2", "gpt2", "cpu", "float32")
    assert isinstance(build_engine(loaded).runner, HFRunner)
    with pytest.raises(LoadError, match="--runner lean"):
        build_engine(loaded, runner="lean")


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"attention_bias": True}, "attention biases"),
        ({"hidden_act": "gelu"}, "activation"),
        ({"rope_parameters": {"rope_type": "dynamic"}}, "rope type"),
        ({"mlp_bias": True}, "MLP biases"),
        ({"model_type": "gemma2", "hidden_activation": "gelu"}, "activation 'gelu'"),
        (
            {
                "model_type": "gemma3_text",
                "hidden_activation": "gelu_pytorch_tanh",
                "use_bidirectional_attention": True,
            },
            "bidirectional",
        ),
    ],
)
def test_unsupported_llama_variants_are_named(tiny_loaded, change, reason):
    config = {**tiny_loaded.model.config.to_dict(), **change}
    assert reason in lean_support(config)
    assert reason in lean_support(SimpleNamespace(**config))


def test_int8_dense_is_close_to_fp32():
    torch.manual_seed(0)
    weight = torch.randn(96, 64)  # [out, in]
    x = torch.randn(5, 64)  # [S, in]
    exact = x @ weight.t()
    approx = Int8Dense(weight)(x)
    assert approx.shape == exact.shape
    assert float((approx - exact).norm() / exact.norm()) < 0.03


def test_bf16_cache_tracks_fp32_over_crops(tiny_loaded, dense):
    limit = context_limit(tiny_loaded.model.config, tiny_loaded.tokenizer)
    exact = LeanRunner(dense, kv_dtype=torch.float32)
    bf16 = LeanRunner(dense, kv_dtype=torch.bfloat16)
    assert bf16.new_cache().k.dtype == torch.bfloat16
    compared = drive(exact, bf16, tiny_loaded.model.config.vocab_size, seed=3, steps=40, limit=limit, rel=2e-2)
    assert compared > 10


def test_kv_dtype_auto_follows_the_cpu(tiny_loaded, monkeypatch):
    import chatcli.engine.cpu as cpu

    for native, want in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(cpu, "has_native_bf16", lambda native=native: native)
        assert pick_kv_dtype("auto", "cpu", "float32") == want
        assert pick_kv_dtype("float32", "cpu", "float32") == "float32"
        assert pick_kv_dtype("auto", "cpu", "float32", quantize="int8") == "float32"
        for blocks in ("q4", "q8", "gguf"):  # a GGUF's own blocks: fp16 (llama.cpp's cache) where bf16 would be
            assert pick_kv_dtype("auto", "cpu", "float32", quantize=blocks) == ("float16" if native else want)
        assert pick_kv_dtype("auto", "cuda", "bfloat16") == "bfloat16"
    assert isinstance(build_engine(tiny_loaded, runner="hf").runner, HFRunner)  # auto: the HF cache as it is
    with pytest.raises(LoadError, match="--kv-dtype bfloat16: the HF runner"):
        build_engine(tiny_loaded, runner="hf", kv_dtype="bfloat16")
    with pytest.raises(LoadError, match="--kv-dtype must be"):
        build_engine(tiny_loaded, runner="lean", kv_dtype="int4")


def test_int8_lean_runner_tracks_fp32(tiny_loaded, dense, int8_file):
    fp32, int8 = LeanRunner(dense), LeanRunner(dense, int8=int8_file)
    assert int8.quantized and not fp32.quantized and not int8.exact_verify  # fbgemm: one activation scale a call
    assert int8.weight_bytes < fp32.weight_bytes / 2  # what a decode step reads
    layer = int8.layers[0]
    assert all(
        isinstance(p.decode, Int8Dense) and p.w_t is not None for p in (layer.qkv, layer.out, layer.gate_up, layer.down)
    )
    assert isinstance(int8.head.decode, Int8Dense) and int8.head.w_t is None  # the head only ever sees one row
    ids = list(range(3, 40))
    caches = fp32.new_cache(), int8.new_cache()
    a, b = fp32.forward(ids, caches[0]), int8.forward(ids, caches[1])
    assert float(np.linalg.norm(a - b) / np.linalg.norm(a)) < 0.1
    assert int(a.argmax()) == int(b.argmax())
    for token in (5, 9, 11):  # decode steps: the int8 projections
        a, b = fp32.forward([token], caches[0]), int8.forward([token], caches[1])
        assert float(np.linalg.norm(a - b) / np.linalg.norm(a)) < 0.1


def test_int8_prefill_runs_on_dense_weights(dense, int8_file, monkeypatch):
    int8 = LeanRunner(dense, int8=int8_file)
    calls = []
    original = Int8Dense.__call__
    monkeypatch.setattr(Int8Dense, "__call__", lambda self, x: calls.append(x.shape[0]) or original(self, x))
    cache = int8.new_cache()
    int8.forward(list(range(3, 20)), cache)
    assert calls == [1]  # only the head, on the last position
    calls.clear()
    int8.forward([7], cache)
    assert calls == [1] * (4 * len(int8.layers) + 1)  # a decode step: every projection in int8


def test_smoothing_scales_leave_the_function_unchanged(tiny_loaded):
    model = tiny_loaded.model
    gen = torch.Generator().manual_seed(0)
    scales = [torch.rand(model.config.intermediate_size, generator=gen) * 4 + 0.25 for _ in model.model.layers]
    plain, smoothed = projections(model), projections(model, scales)
    measured = down_smoothing(model, calibration_ids(tiny_loaded.tokenizer))
    assert len(measured) == len(scales) and all(bool((s > 0).all()) for s in measured)
    x = torch.randn(7, model.config.hidden_size, generator=gen)
    for name in ("layers.0", "layers.1"):
        outs = []
        for w in (plain, smoothed):
            gate, up = (x @ w[f"{name}.gate_up"]).chunk(2, -1)
            outs.append((torch.nn.functional.silu(gate) * up) @ w[f"{name}.down"])
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)
        assert not torch.equal(plain[f"{name}.down"], smoothed[f"{name}.down"])


def test_int8_hf_runner_quantizes_a_copy(tiny_loaded):
    model = tiny_loaded.model
    copy = quantize_hf_model(model)
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert type(copy.model.layers[0].self_attn.q_proj) is not torch.nn.Linear
    runner = make_hf_runner(model, 256, "int8")
    assert isinstance(runner, HFRunner) and runner.model is not model
    assert runner.quantized and not make_hf_runner(model, 256).quantized  # saved caches tell them apart


def test_fused_transposed_matches_cat_transpose_scale_and_rope_rows():
    torch.manual_seed(1)
    q, k, v = torch.randn(8, 6), torch.randn(4, 6), torch.randn(4, 6)  # [out_i, in]: 2 q heads, 1 kv head, hd 4
    scale = torch.rand(6) + 0.5  # [in]
    plain = fused_transposed([q, k, v])
    assert plain.is_contiguous() and torch.equal(plain, torch.cat([q, k, v]).t())
    scaled = fused_transposed([q, k, v], scale)
    assert torch.allclose(scaled, (torch.cat([q, k, v]) * scale).t())
    mixed = fused_transposed([q[head_rows(8, 2)], k[head_rows(4, 1)], v])
    order = torch.tensor([0, 2, 1, 3])  # hd 4: rotate-half pairs (0, 2), (1, 3) become adjacent
    assert torch.equal(mixed[:, :4], q[order].t()) and torch.equal(mixed[:, 4:8], q[4 + order].t())
    assert torch.equal(mixed[:, 8:12], k[order].t()) and torch.equal(mixed[:, 12:], v.t())


# -- the real model ---------------------------------------------------------------------------------


def exact_engines(loaded):
    """The real model's HF reference and each lean runner with an fp32 cache (exact: no bf16 rounding)."""
    engines = {
        "hf": build_engine(loaded, runner="hf"),
        "lean": build_engine(loaded, runner="lean", kv_dtype="float32", kernel=False),
    }
    from chatcli.engine.runners import kernels

    if kernels.library() is not None:  # the weights as transformers has them, not a GGUF's blocks (auto)
        engines["native"] = build_engine(loaded, runner="lean", quantize="none", kv_dtype="float32")
    return engines


@pytest.mark.real_model
def test_real_model_matches_hf(real_loaded):
    engines = exact_engines(real_loaded)
    ref = engines.pop("hf").runner
    for name, engine in engines.items():
        assert (
            drive(ref, engine.runner, real_loaded.model.config.vocab_size, seed=7, steps=14, limit=512, rel=1e-3) >= 8
        ), name


@pytest.mark.real_model
def test_real_model_bf16_cache_tracks_fp32(real_loaded, real_engine):
    exact = exact_engines(real_loaded)["lean"].runner
    bf16 = build_engine(real_loaded, runner="lean", kv_dtype="bfloat16", kernel=False).runner
    ids = real_engine.tokenizer.encode("The history of the city begins with a small settlement on the river, which")
    caches = exact.new_cache(), bf16.new_cache()
    a, b = exact.forward(ids, caches[0]), bf16.forward(ids, caches[1])
    for _ in range(12):  # greedy decode from both: the same tokens, logits within bf16 rounding
        assert int(a.argmax()) == int(b.argmax())
        assert float(np.abs(a - b).max()) < 0.05 * float(np.abs(a).max())
        token = int(a.argmax())
        a, b = exact.forward([token], caches[0]), bf16.forward([token], caches[1])
    assert caches[1].k.dtype == torch.bfloat16 and caches[1].nbytes * 2 == caches[0].nbytes


@pytest.mark.real_model
def test_real_model_greedy_replies_match_hf(real_loaded):
    history = [{"role": "user", "content": "What is the capital of France?"}]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    replies = {}
    for name, engine in exact_engines(real_loaded).items():
        session = engine.new_session()
        turn = list(history)
        out = []
        for follow_up in ("And of Italy?", "Thanks!"):
            done = [ev for ev in engine.generate(turn, session, params) if isinstance(ev, Finished)][0]
            out.append(done.reply)
            turn += [{"role": "assistant", "content": done.reply}, {"role": "user", "content": follow_up}]
        replies[name] = out
    assert all(replies["hf"])
    assert all(r == replies["hf"] for r in replies.values()), replies


@pytest.mark.real_model
def test_real_model_tokenizers_agree(real_loaded, real_engine):
    """The folder tokenizer (no transformers) gives transformers' ids, text and stop ids."""
    ours = real_engine.tokenizer
    theirs = build_engine(real_loaded, runner="hf").tokenizer
    assert type(ours).__name__ == "FolderTokenizer"
    conversations = [
        [{"role": "user", "content": "Hi"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Ünïcödé 🙂 <|im_end|> x\n\n  y"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "more"},
        ],
    ]
    for messages in conversations:
        assert ours.encode_chat(messages) == theirs.encode_chat(messages)
    ids = theirs.encode("Hello <|im_end|> world 🙂 café")
    assert ours.decode(ids) == theirs.decode(ids) and ours.encode("x y") == theirs.encode("x y")
    assert ours.stop_ids == theirs.stop_ids
    assert Engine  # the engine takes either
