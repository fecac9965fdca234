"""Sampling: fp32 logits → next token id.

The order is fixed and matches llama.cpp's sampler chain: repetition penalty →
temperature → top-k → top-p → min-p. Temperature 0 is greedy argmax (after the
repetition penalty). Every stage works on a `[V]` float32 tensor; masked entries
are set to -inf so the softmax at the end gives them probability 0.
"""

from __future__ import annotations

import math

import torch

from chatcli.engine.params import InvalidParameter, SamplingParams  # noqa: F401 - re-exported


def apply_repetition_penalty(logits: torch.Tensor, recent_ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty on tokens already in the context: divide positive logits, multiply negative ones."""
    if penalty == 1.0 or recent_ids.numel() == 0:
        return logits
    seen = logits.gather(0, recent_ids)  # [R]
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(0, recent_ids, seen)


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[V] penalised logits → [V] probabilities after temperature, top-k, top-p and min-p."""
    logits = logits / params.temperature
    if 0 < params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, stable=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens before it already reach top_p; the top token always stays.
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= params.top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)  # back to vocab order
        logits = logits.masked_fill(drop, -math.inf)
    probs = logits.softmax(-1)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
        probs = probs / probs.sum()
    return probs


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    recent_ids: torch.Tensor | None = None,
) -> int:
    """[V] logits (any float dtype) → one token id."""
    logits = logits.float()
    if recent_ids is not None and params.repeat_penalty != 1.0:
        logits = apply_repetition_penalty(logits, recent_ids, params.repeat_penalty)
    if params.temperature == 0.0:
        return int(torch.argmax(logits))
    probs = logits_to_probs(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator))
