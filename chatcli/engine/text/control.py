"""Control tokens typed as text: what a user, a file or a tool wrote never becomes a control id.

Before a chat template renders, each control token's text (`<|im_end|>`, `<end_of_turn>`, …) in a
string the caller gave is put between MARK_START and MARK_END (`marked`); the tokenizer then encodes
each marked piece as text, none of its added tokens matched (`without_added_tokens`), and the rest as
usual (`ChatTokenizer.encode_marked`), as transformers' `sanitize_control_tokens` does.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

# Put around a control token's text found in what the caller gave, so that the encoder tells it from
# the template's own: private-use characters, dropped from the caller's strings first (transformers' own).
MARK_START, MARK_END = "\U000f0000", "\U000f0001"


def marked(value, control: Alternation):
    """`value` (the messages or tools, as given) with each control token's text in its strings, dict keys
    too, put between MARK_START and MARK_END; the marks the strings held dropped first, so that none
    can be forged (transformers' `mark_control_tokens`, which leaves keys as they are)."""
    if isinstance(value, str):
        if MARK_START in value or MARK_END in value:
            value = value.replace(MARK_START, "").replace(MARK_END, "")
        return control.sub(_mark, value) if control.search(value) else value
    if isinstance(value, dict):
        return {marked(k, control): marked(v, control) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [marked(v, control) for v in value]
    return value


def _mark(found: re.Match) -> str:
    return MARK_START + found.group() + MARK_END


def alternation(texts: Iterable[str]) -> re.Pattern:
    """Any of `texts`, the longest that matches where several do (so a token wins over one it holds);
    never matches where none.

    As a trie of their characters (`_trie_pattern`), not a flat `a|b|c…`: Python's regex engine tries a
    flat alternation's branches one by one at each position, and a vocabulary with thousands of control
    tokens (Gemma 3's `<unused…>`, gpt-oss's reserved ones) took seconds to compile and as long again for
    each message it searched."""
    trie: dict = {}
    for text in texts:
        if not text:
            continue
        node = trie
        for char in text:
            node = node.setdefault(char, {})
        node[""] = {}  # a text ends here
    return re.compile(_trie_pattern(trie) if trie else "(?!)")


def _trie_pattern(node: dict) -> str:
    """The regex of a trie node's continuations, the longer first: its children (each a distinct next
    character, so at most one applies), optional where a text also ends here (greedy: tried before
    ending)."""
    branches = [re.escape(char) + _trie_pattern(child) for char, child in sorted(node.items()) if char]
    if not branches:
        return ""
    if "" not in node:
        return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    return "(?:" + "|".join(branches) + ")?"


class Alternation:
    """`alternation(texts)`, compiled only once a string it is asked about holds the first two characters of
    one of them (`heads`): the search and substitution `marked` makes. A vocabulary padded with tens of
    thousands of tokens (a file's unused ids, all control tokens) made a pattern that took ~1 s of every
    start to compile, for messages that hold none of them."""

    def __init__(self, texts: Iterable[str]) -> None:
        self.texts = [text for text in texts if text]
        self.heads = {text[:2] for text in self.texts}

    @functools.cached_property
    def pattern(self) -> re.Pattern:
        return alternation(self.texts)

    def may_hold(self, value: str) -> bool:
        return any(head in value for head in self.heads)

    def search(self, value: str) -> re.Match | None:
        return self.pattern.search(value) if self.may_hold(value) else None

    def sub(self, replace, value: str) -> str:
        return self.pattern.sub(replace, value) if self.may_hold(value) else value


def without_added_tokens(tokenizer, text: str) -> list[int]:
    """`text` through a `tokenizers.Tokenizer`'s normalizer, pre-tokenizer and model, none of its added
    tokens matched (as transformers' `_encode_without_added_tokens`; the tokenizer's own
    `encode_special_tokens` switch would change it for every thread at once)."""
    if tokenizer.normalizer is not None:
        text = tokenizer.normalizer.normalize_str(text)
    splits = (
        [text] if tokenizer.pre_tokenizer is None else [s for s, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    )
    return [token.id for split in splits for token in tokenizer.model.tokenize(split)]
