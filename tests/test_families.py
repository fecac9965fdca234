"""Every lean family on the lean path, against transformers on the same tiny random weights.

For each family (chatcli.engine.weights.families) a tiny random model built from its config with each of
the family's extras switched on (tests.tiny.family_config: q/k/v biases, q/k norms, windows shorter
than the sequences, partial rotary, longrope, soft-capping, sandwich norms, a second rope base, layers
without rope, Granite's multipliers, OLMo 2's output norms and whole-q/k norms):
the torch lean runner and the kernel give transformers' logits within float rounding over random
prefills, decode steps and crops, drafts included; the kernel's int8 tracks its fp32; the engine's
greedy replies over a conversation with an edit are transformers'.

The reference recomputes the whole sequence at each step (no cache of its own to get wrong).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from chatcli.engine.engine import Finished
from chatcli.engine.load.hf import LoadedModel, build_engine
from chatcli.engine.runners.lean import LeanRunner
from chatcli.engine.sample.sampling import SamplingParams
from chatcli.engine.weights.families import context_limit, lean_support
from tests.conftest import require_kernel
from tests.test_lean import close, drive
from tests.tiny import WINDOW, build_family, build_tokenizer, lean_weights

FAMILIES = ["mistral", "qwen2", "qwen3", "phi3", "phi3-longrope", "phi4-mini", "gemma2", "gemma3_text", "smollm3"]
FAMILIES += ["granite", "olmo2", "olmo3"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


class Recompute:
    """transformers' logits for the whole sequence so far, at every step."""

    class Cache:
        def __init__(self) -> None:
            self.ids: list[int] = []

        def __len__(self) -> int:
            return len(self.ids)

        def crop(self, keep: int) -> None:
            del self.ids[keep:]

    def __init__(self, model, limit: int) -> None:
        self.model, self.context_limit = model, limit

    def new_cache(self) -> Recompute.Cache:
        return Recompute.Cache()

    @torch.inference_mode()
    def verify(self, ids: list[int], cache: Recompute.Cache) -> np.ndarray:
        cache.ids.extend(ids)
        logits = self.model(torch.tensor([cache.ids])).logits[0, -len(ids) :]  # [S, V]
        return logits.float().numpy()

    def forward(self, ids: list[int], cache: Recompute.Cache) -> np.ndarray:
        return self.verify(ids, cache)[-1]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def family_case(name: str, tokenizer, tmp_path_factory, kinds: tuple[str, ...]):
    """(name, model, its lean files of each kind, the reference) for one family."""
    model = build_family(name, len(tokenizer))
    folder = tmp_path_factory.mktemp(name)
    files = {kind: lean_weights(model, kind, folder, tokenizer) for kind in kinds}
    return name, model, files, Recompute(model, context_limit(model.config, tokenizer))


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tokenizer, tmp_path_factory):
    return family_case(request.param, tokenizer, tmp_path_factory, ("float32-dense", "float32-panels", "int8"))


def test_each_family_takes_the_lean_path_with_its_extras(family):
    name, model, files, _ = family
    assert lean_support(model.config) is None
    assert lean_support(model.config.to_dict()) is None  # config.json as the loader reads it
    c = files["float32-dense"].config
    expected = {
        "mistral": dict(sliding=(True, True)),
        "qwen2": dict(qkv_bias=True, sliding=(False, True)),
        "qwen3": dict(qk_norm=True),
        "phi3": dict(sliding=(True, True)),
        "phi3-longrope": dict(positions=64),  # the original context: longrope switches factors past it
        "phi4-mini": dict(positions=64),
        "smollm3": dict(nope=(False, False, False, True)),
        "granite": dict(residual_scale=0.4, logits_scaling=2.5, attn_scale=0.1),
        "olmo2": dict(pre_norms=False, post_norms=True, qk_norm=True, qk_norm_whole=True),
        "olmo3": dict(pre_norms=False, post_norms=True, qk_norm_whole=True, sliding=(True, False), sliding_rope=True),
        "gemma2": dict(post_norms=True, act="gelu_tanh", sliding=(True, False), attn_softcap=5.0, final_softcap=3.0),
        "gemma3_text": dict(post_norms=True, qk_norm=True, act="gelu_tanh", sliding=(True, False), sliding_rope=True),
    }[name]
    for field, value in expected.items():
        assert getattr(c, field) == value, field
    assert c.window == (WINDOW if c.sliding else 0)
    assert c.scale == pytest.approx(float(model.model.layers[0].self_attn.scaling))


def test_the_torch_lean_runner_matches_transformers(family, tokenizer):
    _, _, files, ref = family
    ours = LeanRunner(files["float32-dense"])
    assert ours.context_limit == ref.context_limit
    for seed in range(2):
        assert drive(ref, ours, len(tokenizer), seed, steps=30, limit=ref.context_limit, rel=1e-4) > 10


def test_each_extra_counts(family, tokenizer):
    """The comparison can fail: with the windows off, or a family's vectors zeroed, the logits move."""
    name, _, files, ref = family
    ours = LeanRunner(files["float32-dense"])
    changed = ours.residual_scale != 1.0 or not ours.pre_norms
    ours.residual_scale, ours.pre_norms = 1.0, True  # Granite's, OLMo 2's
    rotated = next(layer.rope for layer in ours.layers if layer.rope is not None)
    for layer in ours.layers:
        if layer.rope is None:  # SmolLM3's unrotated layers
            layer.rope, changed = rotated, True
        if layer.window:
            layer.window, changed = 0, True
        for vector in ("qkv_bias", "q_norm", "post_ffn_norm"):
            if getattr(layer, vector) is not None:
                setattr(layer, vector, torch.zeros_like(getattr(layer, vector)) + (vector != "qkv_bias"))
                changed = True
    if not changed:
        pytest.skip(f"{name}: its extras are in the rope table and the context (checked above)")
    rng = random.Random(1)
    ids = [rng.randrange(len(tokenizer)) for _ in range(3 * WINDOW)]
    a, b = ref.forward(ids, ref.new_cache()), ours.forward(ids, ours.new_cache())
    assert not close(b, a, 1e-2)


@pytest.mark.parametrize("runner", ["torch", "native"])
def test_drafts_are_checked_as_steps(family, tokenizer, runner):
    _, _, files, ref = family
    if runner == "native":
        require_kernel()
        from chatcli.engine.runners.native import NativeRunner

        ours = NativeRunner(files["float32-panels"])
    else:
        ours = LeanRunner(files["float32-dense"])
    rng = random.Random(2)
    prompt, draft = [rng.randrange(len(tokenizer)) for _ in range(2 * WINDOW)], [5, 9, 11, 13]
    caches = ref.new_cache(), ours.new_cache()
    ref.forward(prompt, caches[0]), ours.forward(prompt, caches[1])
    want, got = ref.verify(draft, caches[0]), ours.verify(draft, caches[1])  # [4, V]
    assert got.shape == want.shape
    for row in range(len(draft)):
        assert close(got[row], want[row], 1e-4)
    if runner == "native":  # and exactly what the steps one by one give
        steps = ours.new_cache()
        ours.forward(prompt, steps)
        one_by_one = [ours.forward([t], steps) for t in draft]
        assert all(np.array_equal(got[i], one_by_one[i]) for i in range(len(draft)))


@pytest.mark.parametrize("kv_dtype, rel", [("float32", 1e-4), ("bfloat16", 2e-2)])
def test_the_kernel_matches_transformers(family, tokenizer, kv_dtype, rel):
    require_kernel()
    from chatcli.engine.runners.native import NativeRunner

    _, _, files, ref = family
    native = NativeRunner(files["float32-panels"], kv_dtype=kv_dtype)
    assert drive(ref, native, len(tokenizer), 3, steps=30, limit=ref.context_limit, rel=rel) > 10


def test_the_kernels_int8_tracks_its_fp32(family):
    require_kernel()
    from chatcli.engine.runners.native import NativeRunner

    _, _, files, _ = family
    fp32, int8 = NativeRunner(files["float32-panels"]), NativeRunner(files["int8"])
    assert int8.quantized and int8.weight_bytes < fp32.weight_bytes / 3
    caches = fp32.new_cache(), int8.new_cache()
    for step in (list(range(3, 3 + 3 * WINDOW)), [5], [9], [11]):
        a, b = fp32.forward(step, caches[0]), int8.forward(step, caches[1])
        assert 0 < float(np.linalg.norm(a - b) / np.linalg.norm(a)) < 0.1  # quantized, and close


@pytest.mark.parametrize("kernel", [False, True])
def test_greedy_replies_match_transformers(family, tokenizer, tmp_path, kernel):
    if kernel:
        require_kernel()
    name, model, _, _ = family
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = LoadedModel(model, tokenizer, name, str(tmp_path), "cpu", "float32", folder=tmp_path)
    hf_engine = build_engine(loaded, runner="hf")
    lean_engine = build_engine(loaded, runner="lean", kv_dtype="float32", kernel=kernel)
    assert type(lean_engine.runner).__name__ == ("NativeRunner" if kernel else "LeanRunner")
    sessions = {e: e.new_session() for e in (hf_engine, lean_engine)}
    history: list[dict] = []
    for i, text in enumerate(["Hello, how are you?", "What is the capital of France?", "def main():"]):
        history.append({"role": "user", "content": text})
        a, b = (
            [ev for ev in engine.generate(history, session, GREEDY) if isinstance(ev, Finished)][0]
            for engine, session in sessions.items()
        )
        assert b.reply == a.reply and b.stats.prompt_tokens == a.stats.prompt_tokens
        history.append({"role": "assistant", "content": a.reply})
        if i == 1:  # an edit of the first message: the lean caches crop back to the shared prefix
            history[0] = {"role": "user", "content": "Hi there!"}
