"""What the bench measures through the engine itself (`Engine.generate`, as users get it)."""

from __future__ import annotations

import math
import os
import time

from chatcli.bench.errors import BenchError
from chatcli.bench.prompts import DECODE_PROMPT, EDIT_PROMPT, QUALITY_PROMPTS, TEXT, filler
from chatcli.engine.engine import Engine
from chatcli.engine.events import Finished, Token
from chatcli.engine.kv.prefix import reusable_prefix
from chatcli.engine.sample.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, lookup=0)  # plain decode steps


def load(model, options, threads, progress) -> Engine:
    """The engine a bench measures (`LoadOptions` `options`), its kernel's team `threads` wide where given,
    its load steps said as `progress` lines; a load error as a `BenchError`."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadError

    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the kernel's team
    try:
        progress("loading the model")
        return load_engine(model, options, status=lambda text, *_a, **_k: progress(text))
    except LoadError as exc:
        raise BenchError(str(exc)) from None


def run_turn(engine: Engine, messages: list[dict], session, max_tokens: int, lookup: int = 0):
    """One greedy turn; returns the `Finished` event and the wall time to the first token."""
    done = None
    first = None
    t0 = time.perf_counter()
    for event in engine.generate(messages, session, GREEDY.with_(max_tokens=max_tokens, lookup=lookup)):
        if first is None and isinstance(event, Token):
            first = time.perf_counter() - t0
        if isinstance(event, Finished):
            done = event
    assert done is not None
    return done, first


def warm_up(engine: Engine) -> None:
    run_turn(engine, [{"role": "user", "content": "Hi"}], engine.new_session(), 2)


def decode(engine: Engine, max_tokens: int) -> dict:
    messages = [{"role": "user", "content": DECODE_PROMPT}]
    done, _ = run_turn(engine, messages, engine.new_session(), max_tokens)
    s = done.stats
    return {
        "prompt_ids": engine.tokenizer.encode_chat(messages),
        "decode_tok_s": s.decode_tok_s,
        "ttft_s": s.ttft_s,
        "completion_tokens": s.completion_tokens,
        "finish_reason": done.finish_reason,
    }


def lookup(engine: Engine, max_tokens: int, drafts: int, repeat: int = 1) -> list[dict]:
    """Greedy decode with and without prompt-lookup drafting, on the decode prompt and on an edit
    (a reply that repeats its prompt); the best rate of `repeat` runs each."""
    rows = []
    for name, prompt in (("story", DECODE_PROMPT), ("code edit", EDIT_PROMPT)):
        messages = [{"role": "user", "content": prompt}]
        runs = {}
        for n in (0, drafts):
            runs[n] = max(
                (run_turn(engine, messages, engine.new_session(), max_tokens, n)[0] for _ in range(repeat)),
                key=lambda done: done.stats.decode_tok_s,
            )
        off, on = runs[0], runs[drafts]
        rows.append(
            {
                "prompt": name,
                "lookup": drafts,
                "off_tok_s": off.stats.decode_tok_s,
                "on_tok_s": on.stats.decode_tok_s,
                "completion_tokens": on.stats.completion_tokens,
                "draft_tokens": on.stats.draft_tokens,
                "accepted_tokens": on.stats.accepted_tokens,
                "same_reply": on.reply == off.reply,
            }
        )
    return rows


def prefill(engine: Engine, tokens: int) -> dict:
    """A fresh conversation whose one message templates to about `tokens` tokens; one reply token."""
    budget = max(8, min(tokens, engine.context_limit - 16))
    text = filler(engine.tokenizer, budget)
    messages = [{"role": "user", "content": text}]
    ids = engine.tokenizer.encode_chat(messages)
    while len(ids) > budget and len(text) > 8:  # the template adds a few tokens: trim to fit
        text = text[: int(len(text) * budget / len(ids)) - 1]
        messages = [{"role": "user", "content": text}]
        ids = engine.tokenizer.encode_chat(messages)
    done, _ = run_turn(engine, messages, engine.new_session(), 1)
    s = done.stats
    return {"prompt_ids": ids, "prefill_tokens": s.prefill_tokens, "prefill_tok_s": s.prefill_tok_s, "ttft_s": s.ttft_s}


def turns(engine: Engine, count: int, user_tokens: int, reply_tokens: int, repeat: int = 1) -> list[dict]:
    """`count` user turns in one conversation; each also timed again from an empty cache.

    With `repeat` > 1 each turn runs that many times from the same cached prefix (the
    cache is cropped back to it; greedy, so the reply is the same) and the recompute too;
    the best TTFT of each is kept.
    """
    session = engine.new_session()
    messages: list[dict] = []
    rows = []
    for turn in range(1, count + 1):
        messages.append({"role": "user", "content": filler(engine.tokenizer, user_tokens, f"Turn {turn}.")})
        target, _ = engine.fit_prompt(messages, GREEDY.with_(max_tokens=reply_tokens))
        keep = session.cache.reachable(reusable_prefix(session.cache.ids, target))
        ttfts = []
        for r in range(repeat):
            session.cache.crop(keep)
            done, _ = run_turn(engine, messages, session, reply_tokens if r == repeat - 1 else 1)
            ttfts.append(done.stats.ttft_s)
        s = done.stats
        recompute = min(run_turn(engine, messages, engine.new_session(), 1)[0].stats.ttft_s for _ in range(repeat))
        rows.append(
            {
                "turn": turn,
                "context_tokens": s.prompt_tokens,
                "cached_tokens": s.cached_tokens,
                "prefill_tokens": s.prefill_tokens,
                "ttft_s": min(ttfts),
                "ttft_recompute_s": recompute,
                "completion_tokens": s.completion_tokens,
                "truncated_turns": s.truncated_turns,
            }
        )
        messages.append({"role": "assistant", "content": done.reply})
    return rows


def greedy_answers(engine: Engine, max_tokens: int) -> list[str]:
    return [
        run_turn(engine, [{"role": "user", "content": p}], engine.new_session(), max_tokens)[0].reply
        for p in QUALITY_PROMPTS
    ]


def perplexity(engine: Engine, max_tokens: int = 256) -> tuple[float, int]:
    """Perplexity of the runner on the fixed text, fed one token at a time (the decode path)."""
    import numpy as np

    ids = engine.tokenizer.encode(TEXT)[: min(max_tokens, engine.context_limit)]
    runner = engine.runner
    cache = runner.new_cache()
    nll = 0.0
    for i in range(len(ids) - 1):
        logits = runner.forward([ids[i]], cache).astype(np.float64)  # [V]
        top = logits.max()
        nll -= float(logits[ids[i + 1]] - top - np.log(np.exp(logits - top).sum()))
    return math.exp(nll / max(1, len(ids) - 1)), len(ids)


def quality(engine: Engine, reference: Engine, max_tokens: int) -> dict:
    """Greedy answers and perplexity of `engine` against the fp32 `reference` on the same weights."""
    ours, theirs = greedy_answers(engine, max_tokens), greedy_answers(reference, max_tokens)
    ppl, n = perplexity(engine)
    ppl_ref, _ = perplexity(reference)
    return {
        "prompts": [
            {"prompt": p, "reference": b, "answer": a, "identical": a == b}
            for p, a, b in zip(QUALITY_PROMPTS, ours, theirs, strict=True)
        ],
        "perplexity": ppl,
        "perplexity_reference": ppl_ref,
        "perplexity_ratio": ppl / ppl_ref if ppl_ref else None,
        "perplexity_tokens": n,
    }
