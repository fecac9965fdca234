"""Embeddings from the engine (issue 48): each runner's final hidden states (after the final norm, its
weight included) are a plain transformers forward's `last_hidden_state`, batched or alone; `Engine.embed`
pools them as the GGUF says (mean, CLS, last token) or by the mean, normalised; `dimensions` only where the
model is an embedding model; an input past the context is refused, or cut where asked."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from chatcli.engine import EmbeddingError
from tests.conftest import require_kernel

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello, how are you today?", "café"]


def reference(model, ids: list[int]) -> np.ndarray:
    """A plain forward's final hidden states (transformers' decoder, after its final norm)."""
    with torch.no_grad():
        return model.model(input_ids=torch.tensor([ids])).last_hidden_state[0].float().numpy()


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


@pytest.fixture(scope="module")
def normed(tmp_path_factory):
    """The tiny Llama with a final norm that is not ones (a weight folded into the lean files' head)."""
    from chatcli.engine.load.hf import LoadOptions, load
    from tests.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer))
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.25, 2.0)
    folder = tmp_path_factory.mktemp("tiny-normed")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return load(str(folder), LoadOptions(device="cpu"))


@pytest.fixture(params=["hf", "lean", "native"])
def engine(request, normed):
    from chatcli.engine.load.hf import build_engine

    if request.param == "native":
        require_kernel()
    runner = "hf" if request.param == "hf" else "lean"
    return build_engine(normed, runner=runner, kv_dtype="float32", kernel=request.param == "native")


def test_each_runners_hidden_states_are_a_plain_forwards(engine, normed):
    batch = [engine.tokenizer.encode_prompt(t) for t in TEXTS]
    together = engine.runner.hidden_states(batch)
    for ids, states in zip(batch, together, strict=True):
        want = reference(normed.model, ids)
        assert states.shape == want.shape and states.dtype == np.float32
        np.testing.assert_allclose(states, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(engine.runner.hidden_states([ids])[0], states, rtol=1e-5, atol=1e-5)  # alone


def test_embed_pools_by_the_mean_and_normalises(engine, normed):
    done = engine.embed(TEXTS)
    batch = [engine.tokenizer.encode_prompt(t) for t in TEXTS]
    assert done.pooling == "mean" and done.tokens == sum(map(len, batch))
    for ids, vector in zip(batch, done.vectors, strict=True):
        np.testing.assert_allclose(vector, unit(reference(normed.model, ids).mean(0)), rtol=1e-4, atol=1e-5)
        assert abs(np.linalg.norm(vector) - 1) < 1e-5
    with pytest.raises(EmbeddingError, match="dimensions"):  # a chat model's states: no Matryoshka order
        engine.embed(TEXTS[:1], dimensions=8)


def test_an_input_past_the_context_is_refused_or_cut(tiny_lean):
    long = "The quick brown fox jumps over the lazy dog. " * 60
    with pytest.raises(EmbeddingError, match="input 1 is .* tokens; the model's context is 256") as caught:
        tiny_lean.embed(["short", long])
    assert caught.value.index == 1
    cut = tiny_lean.embed(["short", long], truncate=True)
    assert cut.tokens == len(tiny_lean.tokenizer.encode_prompt("short")) + tiny_lean.context_limit


@pytest.fixture(scope="module")
def embedding_gguf(tmp_path_factory):
    """A Qwen3-shaped model (Qwen3-Embedding's shape) as a GGUF whose metadata says its pooling."""
    from tests.gguf_models import rewrite_gguf, tiny, write_gguf

    model = tiny("qwen3", tied=True, seed=3)
    folder = tmp_path_factory.mktemp("embedding-gguf")
    plain = write_gguf(model, folder / "plain.gguf")
    files = {}
    for kind, code in (("last", 3), ("cls", 2)):
        fields = {"qwen3.pooling_type": (code, gguf.GGUFValueType.UINT32)}
        files[kind] = rewrite_gguf(plain, folder / f"qwen3-embedding-{kind}.gguf", fields)
    return model, files


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
def test_a_gguf_says_how_its_states_are_pooled(embedding_gguf, kernel, request):
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions

    if kernel:
        require_kernel()
    else:
        request.getfixturevalue("no_kernel")
    model, files = embedding_gguf
    for kind, path in files.items():
        engine = load_engine(str(path), LoadOptions(device="cpu", kv_dtype="float32"))  # exact attention
        done = engine.embed(TEXTS)
        assert done.pooling == kind
        for text, vector in zip(TEXTS, done.vectors, strict=True):
            states = reference(model, engine.tokenizer.encode_prompt(text))
            np.testing.assert_allclose(vector, unit(states[-1] if kind == "last" else states[0]), atol=2e-4)
        cut = engine.embed(TEXTS, dimensions=32)  # Matryoshka: the first values, normalised again
        for whole, short in zip(done.vectors, cut.vectors, strict=True):
            assert short.shape == (32,) and np.allclose(short, unit(whole[:32]), atol=1e-6)
        with pytest.raises(EmbeddingError, match=r"dimensions must be in \[1, 256\]"):
            engine.embed(TEXTS, dimensions=1000)
