"""Embeddings: each text's final hidden states (`ModelRunner.hidden_states`, after the final norm) pooled
into one vector and normalised (L2), as llama.cpp's embedding mode does (`Engine.embed`).

Pooling as the GGUF says (`{arch}.pooling_type`: 1 mean, 2 the first token's (CLS), 3 the last token's, as
Qwen3-Embedding's), else the mean: a chat model's own pooled states. `dimensions` keeps a vector's first N
values, normalised again (Matryoshka-trained embedding models, Qwen3-Embedding's): only for a model whose
GGUF says its pooling (an embedding model); a chat model's states have no such order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

MEAN, CLS, LAST = "mean", "cls", "last"
POOLING_TYPES = {1: MEAN, 2: CLS, 3: LAST}  # llama.cpp's enum llama_pooling_type


class EmbeddingError(ValueError):
    """An input the model cannot embed (empty, past the context), or `dimensions` it does not allow;
    `index` names the input, None for `dimensions`."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


@dataclass
class Embeddings:
    vectors: list[np.ndarray]  # one per text, fp32, unit length
    tokens: int  # the texts' tokens, all together
    pooling: str  # MEAN, CLS or LAST


@functools.lru_cache(maxsize=8)
def pooling_of(source: str) -> tuple[str, bool]:
    """How a model's states are pooled, and whether its file says so (an embedding model's GGUF)."""
    if not source.endswith(".gguf"):
        return MEAN, False
    from chatcli.engine.weights.gguf_file import GGUFError, GGUFFile

    try:
        fields = GGUFFile(source).fields
    except (OSError, GGUFError):
        return MEAN, False
    kind = fields.get(f"{fields.get('general.architecture')}.pooling_type")
    return (POOLING_TYPES[int(kind)], True) if kind is not None and int(kind) in POOLING_TYPES else (MEAN, False)


def normalized(vector: np.ndarray) -> np.ndarray:
    return vector / max(float(np.linalg.norm(vector)), 1e-12)


def pooled(states: np.ndarray, how: str) -> np.ndarray:
    """One unit vector of a sequence's hidden states `[S, D]`."""
    vector = states.mean(0) if how == MEAN else states[0] if how == CLS else states[-1]
    return normalized(vector.astype(np.float32))


def embed(engine, texts: list[str], dimensions: int | None = None, truncate: bool = False) -> Embeddings:
    """`texts` through `engine`'s runner (each a raw prompt, as the tokenizer reads one), pooled; an input past
    the context is cut to it where `truncate`, else refused (`EmbeddingError`)."""
    how, declared = pooling_of(getattr(engine, "source", "") or "")
    if dimensions is not None and not declared:
        raise EmbeddingError("dimensions: this model's embeddings are its pooled chat states, which cannot be cut")
    limit, batch = engine.context_limit, []
    for i, text in enumerate(texts):
        ids = engine.tokenizer.encode_prompt(text)
        if not ids:
            raise EmbeddingError(f"input {i} is empty (and the tokenizer adds no start token)", i)
        if len(ids) > limit and not truncate:
            raise EmbeddingError(f"input {i} is {len(ids)} tokens; the model's context is {limit}", i)
        batch.append(ids[:limit])
    vectors = [pooled(states, how) for states in engine.runner.hidden_states(batch)]
    if dimensions is not None:
        width = len(vectors[0]) if vectors else 0
        if not 1 <= dimensions <= width:
            raise EmbeddingError(f"dimensions must be in [1, {width}] for this model, got {dimensions}")
        vectors = [normalized(v[:dimensions]) for v in vectors]
    return Embeddings(vectors, sum(len(ids) for ids in batch), how)
