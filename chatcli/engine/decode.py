"""The decode loop: sample an id, feed it back, repeat (`DecodeLoop._decode`), with the drafts of prompt lookup
checked in one pass, and the loop started again after a looping call's string is taken back (`_rewind`).

`Engine` (engine.py) is a `DecodeLoop`: its turn takes the ids this yields, one at a time, and stops taking them
when the reply is done; the KV cache then holds the prompt and every id taken but the last.
"""

from __future__ import annotations

from collections.abc import Iterator

from chatcli.engine.kv.cache import KVCache
from chatcli.engine.runners.batched import CallDropped
from chatcli.engine.sample.lookup import PromptLookup
from chatcli.engine.sample.sampling import SamplingParams, pick
from chatcli.engine.stats import TurnStats


class DecodeLoop:
    def _decode(
        self, logits, cache: KVCache, params: SamplingParams, generator, stats: TurnStats, constraint=None, cancel=None
    ) -> Iterator[tuple]:
        """Sampled ids with their log-probabilities (or None; see `pick`), one at a time: sample,
        feed the id back, repeat. The caller stops taking ids when it is done. With `params.lookup`,
        each fed id may bring a draft (`PromptLookup`) that one `verify` pass checks; the ids the
        model agrees with come out without a forward of their own, and the cache drops the rest.
        A `constraint` masks each position's logits as its id is picked, so a drafted id the grammar
        refuses is rejected like any other. Nothing when prefill was cancelled (`logits` None); CallDropped
        where a step's call is dropped for `cancel` (`_call`: the cache then lacks the last id, as always)."""
        if logits is None:
            return
        drafts = self.lookup_for(params)
        lookup = PromptLookup(cache.ids) if drafts else None
        budget = params.max_tokens  # ids the caller can still take (its reply limit; an end-of-turn id ends it sooner)
        # After a wholly rejected draft, skip drafting for the next 1, 2, 4 … ids (a 5-position check costs ~1.9 steps).
        wait = backoff = 0
        token, scored = pick(logits, cache.ids, len(cache), params, generator, constraint)
        while True:
            yield token, scored
            budget -= 1
            draft: list[int] = []
            if lookup is not None:
                lookup.append(token)
                if wait:
                    wait -= 1
                else:
                    draft = lookup.draft(min(drafts, budget - 1, self.context_limit - len(cache) - 1))
            if not draft:
                logits = self._call([token], cache, cancel)  # [V]
                token, scored = pick(logits, cache.ids, len(cache), params, generator, constraint)
                continue
            base = len(cache)
            rows = self._call([token, *draft], cache, cancel, True)  # [1 + k, V]: row j predicts the id after draft[:j]
            stats.draft_tokens += len(draft)
            for j, guess in enumerate(draft):
                token, scored = pick(rows[j], cache.ids, base + 1 + j, params, generator, constraint, guess)
                if token != guess:
                    cache.crop(base + 1 + j)  # the draft's ids from here on were not the model's
                    break
                stats.accepted_tokens += 1
                lookup.append(guess)
                yield guess, scored
                budget -= 1
            else:
                token, scored = pick(rows[-1], cache.ids, len(cache), params, generator, constraint)
            if len(cache) == base + 1:  # nothing accepted
                backoff = min(2 * backoff or 1, 16)
                wait = backoff
            else:
                backoff = 0

    def _rewind(self, drop: int, kept: int, last: int, cache, params, generator, stats, constraint, cancel):
        """The decode loop again after a looping call's string: its last `drop` ids taken back from the
        grammar and the cache, which holds the `kept` ids (prompt and reply) but the `last`, fed now; the
        string closes at the next id. Nothing more where that call is dropped for `cancel`."""
        constraint.rewind(drop)
        cache.crop(kept - 1)
        try:
            logits = self._call([last], cache, cancel)  # [V]
        except CallDropped:
            logits = None
        return self._decode(logits, cache, params, generator, stats, constraint, cancel)
