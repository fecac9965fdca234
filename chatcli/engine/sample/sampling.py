"""Sampling: fp32 logits → next token id, in numpy (no torch: every runner's logits come as numpy).

The order is fixed and matches llama.cpp's sampler chain: logit bias → penalties (repetition, then
OpenAI's presence and frequency, over the last `repeat_last_n` context ids) → temperature →
top-k → top-p → min-p. Temperature 0 is greedy argmax (after the
repetition penalty). Every stage works on a `[V]` float32 array; the candidates that
survive are kept with their probabilities, most likely first, ties in id order.
"""

from __future__ import annotations

import numpy as np

from chatcli.engine.params import InvalidParameter, SamplingParams  # noqa: F401 - re-exported


def new_generator(seed: int | None = None) -> np.random.Generator:
    """A random generator: seeded (reproducible), or from fresh entropy."""
    return np.random.default_rng(seed)


def apply_repetition_penalty(logits: np.ndarray, recent_ids, penalty: float) -> np.ndarray:
    """CTRL-style penalty on tokens already in the context: divide positive logits, multiply negative ones."""
    recent = np.asarray(recent_ids, dtype=np.int64)
    if penalty == 1.0 or recent.size == 0:
        return logits
    seen = logits[recent]  # [R]
    out = logits.copy()
    out[recent] = np.where(seen > 0, seen / np.float32(penalty), seen * np.float32(penalty))
    return out


HOTTEST = 1e30  # any temperature past it gives the same uniform draw (1e300 would overflow float32)


CHUNKS = 1024  # top_k_ids: the vocabulary's chunks whose maxima bound the k-th largest logit from below


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest logits and of every tie with the k-th, in id order (0 < k < V).

    A partition of a 262K vocabulary (Gemma 3's) took 1.5 ms a token, an eighth of a 270M model's step.
    The k-th largest of the maxima of n ≥ k chunks is a lower bound of the k-th largest logit (those k maxima
    are k logits at least as large), so the logits at or above it hold every one of the top k, and only
    the chunks whose maximum reaches it hold any: one vectorised pass over the vocabulary, then a partition
    over those few."""
    vocab = logits.shape[0]
    chunks = max(CHUNKS, k)
    if vocab < 4 * chunks:
        kth = logits[np.argpartition(logits, vocab - k)[vocab - k :]].min()
        return np.flatnonzero(logits >= kth)
    width = vocab // chunks
    grid = logits[: width * chunks].reshape(width, chunks)  # group j: the ids j, j + chunks, j + 2 chunks, …
    maxima = grid.max(axis=0)  # [chunks]
    bound = np.partition(maxima, chunks - k)[chunks - k]
    groups = np.flatnonzero(maxima >= bound)  # k of them or a few more: only they hold logits at the bound
    rows, at = np.nonzero(grid[:, groups] >= bound)
    tail = np.flatnonzero(logits[width * chunks :] >= bound) + width * chunks
    few = np.sort(np.concatenate([rows * chunks + groups[at], tail]))
    if few.size > k:
        values = logits[few]
        kth = values[np.argpartition(values, few.size - k)[few.size - k :]].min()
        few = few[values >= kth]
    return few


def candidates(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """[V] penalised logits → (probabilities [K], their token ids [K]) after temperature, top-k,
    top-p and min-p, most likely first. With top-k on, only those K (and ties with the k-th) are
    sorted and normalised, like llama.cpp's sampler chain: ~0.08 ms a token over 49k ids."""
    vocab = logits.shape[0]
    if 0 < params.top_k < vocab:
        ids = top_k_ids(logits, params.top_k)  # a temperature keeps the order: chosen before it scales
    else:
        ids = np.arange(vocab)
    scaled = logits[ids] / np.float32(min(params.temperature, HOTTEST))
    order = np.lexsort((ids, -scaled))  # value descending, ties in id order
    ids, values = ids[order], scaled[order]
    exp = np.exp(values - values[0])
    probs = exp / exp.sum()
    if params.top_p < 1.0:
        # Drop a token when the tokens before it already reach top_p; the top token always stays.
        drop = (np.cumsum(probs) - probs) >= params.top_p
        drop[0] = False
        probs[drop] = 0.0
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs[0]] = 0.0
    return probs / probs.sum(), ids


def logits_to_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """[V] penalised logits → [V] probabilities after temperature, top-k, top-p and min-p."""
    probs, ids = candidates(np.asarray(logits, dtype=np.float32), params)
    out = np.zeros(len(logits), dtype=probs.dtype)
    out[ids] = probs
    return out


def _draw(probs: np.ndarray, generator: np.random.Generator) -> int:
    """An index drawn with probability `probs` (which sum to 1; zeros are never drawn)."""
    cumulative = np.cumsum(probs)
    at = int(np.searchsorted(cumulative, generator.random() * cumulative[-1], side="right"))
    return min(at, len(probs) - 1)


def sample(logits, params: SamplingParams, generator: np.random.Generator | None = None, recent_ids=None) -> int:
    """[V] logits → one token id."""
    logits = _penalised(logits, params, recent_ids)
    if params.temperature == 0.0:
        return int(np.argmax(logits))
    probs, ids = candidates(logits, params)
    return int(ids[_draw(probs, generator or new_generator())])


def accept_draft(
    logits, draft_id: int, params: SamplingParams, generator: np.random.Generator | None = None, recent_ids=None
) -> int:
    """The id at a drafted position: `draft_id` where the model agrees, else the model's own pick.

    Greedy: the argmax, whatever was drafted. Sampling: keep the draft with probability
    p(draft), else draw from p with the draft removed. That is speculative sampling with a
    draft that is sure of its guess: the id comes out with exactly `sample`'s distribution,
    P(draft) = p(draft) and P(x) = (1 - p(draft)) · p(x) / (1 - p(draft)) = p(x) for any other x.
    """
    logits = _penalised(logits, params, recent_ids)
    if params.temperature == 0.0:
        return int(np.argmax(logits))
    generator = generator or new_generator()
    probs, ids = candidates(logits, params)
    at = np.flatnonzero(ids == draft_id)
    kept = float(probs[at[0]]) if at.size else 0.0  # a draft outside the candidates has p = 0
    if kept > 0.0 and generator.random() < kept:
        return draft_id
    if at.size:
        probs = probs.copy()
        probs[at[0]] = 0.0
    if float(probs.sum()) <= 0.0:  # p(draft) == 1: the draw above cannot miss, but rounding can
        return draft_id
    return int(ids[_draw(probs, generator)])


def token_logprobs(
    logits, token: int, params: SamplingParams, top: int = 0, recent_ids=None
) -> tuple[float, list[tuple[int, float]]]:
    """(log p(token), the `top` most likely ids with their log p, most likely first) under the
    distribution `sample` draws the id from: after the repetition penalty, temperature, top-k,
    top-p and min-p (an id they cut has log p -inf and is never listed). Greedy (temperature 0)
    picks the argmax of the penalised logits: its distribution is their softmax at temperature 1."""
    logits = _penalised(logits, params, recent_ids)
    if params.temperature == 0.0:
        shifted = logits.astype(np.float64) - float(logits.max())
        logp = shifted - np.log(np.exp(shifted).sum())  # [V]
        order = np.argpartition(-logp, min(top, len(logp) - 1))[:top] if top else np.array([], np.int64)
        order = order[np.lexsort((order, -logp[order]))]
        return float(logp[token]), [(int(i), float(logp[i])) for i in order if logp[i] > -np.inf]  # masked ids: never
    probs, ids = candidates(logits, params)  # most likely first
    at = np.flatnonzero(ids == token)
    chosen = float(np.log(probs[at[0]])) if at.size and probs[at[0]] > 0 else float("-inf")
    kept = [(int(i), float(np.log(p))) for i, p in zip(ids[:top], probs[:top], strict=True) if p > 0]
    return chosen, kept


def apply_presence_frequency(logits: np.ndarray, recent_ids, presence: float, frequency: float) -> np.ndarray:
    """OpenAI's penalties: logit[j] -= presence · [j seen] + frequency · count(j)."""
    recent = np.asarray(recent_ids, dtype=np.int64)
    if (presence == 0.0 and frequency == 0.0) or recent.size == 0:
        return logits
    ids, counts = np.unique(recent, return_counts=True)
    out = logits.copy()
    out[ids] -= np.float32(presence) + np.float32(frequency) * counts.astype(np.float32)
    return out


def needs_recent_ids(params: SamplingParams) -> bool:
    """Any penalty that reads the recent ids is on."""
    return params.repeat_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0


def _penalised(logits, params: SamplingParams, recent_ids) -> np.ndarray:
    logits = np.asarray(logits, dtype=np.float32)
    if params.logit_bias:  # first, as OpenAI and llama.cpp add it to the raw logits
        ids = np.array([t for t, _ in params.logit_bias if t < len(logits)], dtype=np.int64)
        if ids.size:
            logits = logits.copy()
            logits[ids] += np.array([b for t, b in params.logit_bias if t < len(logits)], dtype=np.float32)
    if recent_ids is not None and params.repeat_penalty != 1.0:
        logits = apply_repetition_penalty(logits, recent_ids, params.repeat_penalty)
    if recent_ids is not None:
        logits = apply_presence_frequency(logits, recent_ids, params.presence_penalty, params.frequency_penalty)
    return logits


def pick(logits, ids: list[int], end: int, params: SamplingParams, generator, constraint, draft=None):
    """The decode loop's step: the next id after `ids[:end]`, sampled, or the drafted id kept or replaced
    (`accept_draft`), with its log-probabilities where `params.logprobs` asks (`token_logprobs`; a
    drafted position's distribution is the one a single step would sample from), else None. Under a
    `constraint` (a turn's grammar state) the ids its grammar refuses are masked first, and the id
    picked advances it."""
    if constraint is not None:
        logits = constraint.mask(logits)
    recent = None
    if needs_recent_ids(params) and params.repeat_last_n > 0:
        recent = ids[max(0, end - params.repeat_last_n) : end]
    if draft is None:
        token = sample(logits, params, generator, recent)
    else:
        token = accept_draft(logits, draft, params, generator, recent)
    scored = None if params.logprobs is None else token_logprobs(logits, token, params, params.logprobs, recent)
    if constraint is not None:
        constraint.advance(token)
    return token, scored
