"""Token log-probabilities as the front ends write them: the one-shot's `--json --logprobs N` and the
server's OpenAI layout (`choices[].logprobs.content[]`). The numbers come with each `Token` event
(`sampling.token_logprobs`: the distribution the id was drawn from); this module only names the
tokens: their text and their bytes (a token may hold part of a character)."""

from __future__ import annotations

import math

FLOOR = -9999.0  # OpenAI's stand-in for log 0 (JSON has no -inf)


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR


def entry(tokenizer, token_id: int, logprob: float, with_id: bool = False) -> dict:
    """{token, (id,) logprob, bytes} for one id."""
    out = {"token": tokenizer.decode([token_id], skip_special_tokens=False)}
    if with_id:
        out["id"] = token_id
    out["logprob"] = _finite(logprob)
    out["bytes"] = list(tokenizer.token_bytes(token_id))
    return out


def token_entry(tokenizer, event, top_key: str = "top_logprobs", with_id: bool = False) -> dict | None:
    """A `Token` event's entry with its alternatives under `top_key`, or None where it carries none. A
    server's token (no id: `Token.top_texts`) is named by its text, its bytes those of the text."""
    if event.logprob is None:
        return None
    if event.token_id < 0:
        if event.top_texts is None:  # the held-back text at a reply's end: no token of its own
            return None
        out = spelled(event.text, event.logprob)
        pairs = zip(event.top_texts, event.top_logprobs or (), strict=True)
        out[top_key] = [spelled(text, lp) for text, (_id, lp) in pairs]
        return out
    out = entry(tokenizer, event.token_id, event.logprob, with_id)
    out[top_key] = [entry(tokenizer, i, lp, with_id) for i, lp in event.top_logprobs or ()]
    return out


def spelled(text: str, logprob: float) -> dict:
    """{token, logprob, bytes} for a token known by its text only (a server's)."""
    return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}
