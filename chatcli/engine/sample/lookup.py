"""Prompt-lookup drafting: guess the next tokens from the conversation itself.

A reply often repeats spans of its context: code being edited, a quoted passage, names,
a list it is reformatting. `PromptLookup` finds the newest earlier place where the last
few ids of the context occurred and proposes the ids that followed there (the method of
transformers' `prompt_lookup_num_tokens` and llama.cpp's `llama-lookup`). The engine then
checks every drafted id with one forward of all of them (`ModelRunner.verify`) and keeps
those the model would have produced itself, so the reply is the same as without drafting
(greedy), or drawn from the same distribution (sampling; see `sampling.accept_draft`).

Pure Python, no torch: an index from each n-gram (n = `MIN_NGRAM`..`MAX_NGRAM`) to the
position after its newest occurrence, updated in O(1) per id.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_NGRAM = 3  # the longest suffix looked up; longer matches are rarer and no more precise here
MIN_NGRAM = 2  # one-id matches propose mostly wrong drafts, and a wrong draft costs a wider forward


class PromptLookup:
    def __init__(self, ids: Iterable[int] = (), max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> None:
        self.ids: list[int] = []
        self.sizes = range(max_ngram, min_ngram - 1, -1)  # longest first
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> position of the id that followed it, newest
        self.extend(ids)

    def __len__(self) -> int:
        return len(self.ids)

    def append(self, token: int) -> None:
        ids = self.ids
        end = len(ids)  # where `token` goes: the n-grams ending just before it now have a continuation
        for n in self.sizes:
            if end >= n:
                self.index[tuple(ids[end - n : end])] = end
        ids.append(token)

    def extend(self, ids: Iterable[int]) -> None:
        for token in ids:
            self.append(token)

    def draft(self, limit: int) -> list[int]:
        """Up to `limit` ids that followed the newest earlier occurrence of the longest matching suffix."""
        ids = self.ids
        if limit <= 0:
            return []
        for n in self.sizes:
            if len(ids) > n:
                start = self.index.get(tuple(ids[-n:]))
                if start is not None:
                    return ids[start : start + limit]
        return []
