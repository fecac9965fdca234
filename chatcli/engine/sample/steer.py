"""Steering a held reply where its grammar cannot: numbers of bounded length, no call made twice, and
calls that end within the reply's budget.

Contract. A `Steer` follows one turn's held reply (the bytes of each id taken, `advance`) and narrows
the ids its grammar allows next (`narrow`):

- digits: each run of a number's digits (its integral part, fraction, exponent) is at most MAX_DIGITS
  long, llama.cpp's bounds (`[1-9] [0-9]{0,15}`, `[0-9]{1,16}` in its json-schema-to-grammar): else
  a small model writes `2000000…` until max_tokens. Strings are not numbers: their digits are free.
- duplicates: a call identical to one the reply already made is refused at the last id where the
  model could still write another; an id after which the grammar forces the rest of the duplicate
  (llguidance's fast-forward bytes) is refused with it.
- closing: with a budget (the least of max_tokens and the context left), a new call starts only with
  room for one half again as long as the longest made, else the reply ends; and in the budget's last
  `window` ids a call in progress closes at its next JSON boundary where its grammar allows (after a
  value the model finished: never inside a string or a number). A call that still runs out of room is
  dropped by its reader (`CallScanner.cut`), never returned cut.
- loops: a call's string whose last LOOP_IDS ids repeat a cycle of at most MAX_PERIOD ids (`loops.repeats`: a
  small model that writes `at 3pm at 3pm …` for ever) is `looping`: the decode loop takes the repeats back
  (`rewind`: the string kept to the end of the cycle's first time, `loops.excess`) and the string closes there
  (only ids that begin with `"` next), so the call ends whole where it would have run to the context's end.
- reasoning before a forced call (Harmony's analysis message, `think_end` its closing id): once the budget
  left is the call's room (`think_until` ids taken), the analysis closes at once, and a reply that has not
  opened one goes straight to the call.

It never narrows to nothing: where every id the grammar allows would be refused, the mask stands
(a duplicate that got through is dropped by the server). Where the calls' JSON begins is told by the
call syntax's literal text (`CallText`); a reply held to a response format is JSON from its first byte.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from chatcli.engine.sample.loops import LOOP_EVERY, LOOP_IDS, MAX_PERIOD, excess, repeats
from chatcli.engine.sample.tools import MAX_CALLS, CallText

MAX_DIGITS = 16
DIGITS = frozenset(b"0123456789")


class Vocab:
    """One tokenizer's ids by their bytes, for the lookups steering makes (built once per grammar)."""

    def __init__(self, tokenizer, vocab: int, stop_ids: list[int]) -> None:
        self.stop = np.zeros(vocab, dtype=bool)
        self.stop[stop_ids] = True
        special = [tokenizer.is_special_token(t) for t in range(vocab)]
        self.bytes = [b"" if special[t] else tokenizer.decode_bytes([t]) for t in range(vocab)]
        self.by_bytes: dict[bytes, list[int]] = {}
        for t, spelled in enumerate(self.bytes):
            if spelled:
                self.by_bytes.setdefault(spelled, []).append(t)
        order = sorted((b, t) for t, b in enumerate(self.bytes) if b)
        self.sorted = [b for b, _ in order]
        self.sorted_ids = np.array([t for _, t in order], dtype=np.int64)
        self.lead_digits = np.array([_lead_digits(b) for b in self.bytes], dtype=np.int64)
        # ids that close a container and open nothing: `}`, `]`, `}}`, `}\n` ...
        self.closers = np.array([b[:1] in (b"}", b"]") and not set(b'"{[,:') & set(b) for b in self.bytes])
        self.quotes = np.array([b[:1] == b'"' for b in self.bytes])  # ids that close a string (or begin one)

    def starting_with(self, prefix: bytes) -> np.ndarray:
        """The ids whose bytes begin with `prefix`."""
        lo = bisect.bisect_left(self.sorted, prefix)
        hi = bisect.bisect_left(self.sorted, prefix + b"\xff" * 8, lo)
        return self.sorted_ids[lo:hi]

    def prefixes(self, text: bytes) -> list[tuple[int, int]]:
        """(length, id) of each id whose bytes are a non-empty proper prefix of `text`."""
        return [(j, t) for j in range(1, len(text)) for t in self.by_bytes.get(text[:j], ())]


def _lead_digits(spelled: bytes) -> int:
    n = 0
    while n < len(spelled) and spelled[n] in DIGITS:
        n += 1
    return n


class Steer:
    """One held reply's steering (see the module's contract). `calls`: the call syntax's text where the
    reply may make calls (None: a response format's JSON only); `json_first`: a reply that begins with
    `{` is the response format's JSON, not calls (Hermes calls beside a format); `several`: more than one
    call may be made; `limit`: the reply's budget in ids (None: no closing); `window`: its last ids,
    where a call closes at its next boundary; `think_end`: the id that closes the reasoning a forced call
    may begin with (Harmony's `<|end|>`), taken once `think_until` ids are."""

    def __init__(
        self,
        vocab: Vocab,
        calls: CallText | None = None,
        json_first: bool = False,
        several: bool = False,
        limit: int | None = None,
        window: int = 0,
        think_end: int | None = None,
        think_until: int = 0,
    ) -> None:
        self.args = (vocab, calls, json_first, several, limit, window, think_end, think_until)  # `rewind` starts again
        self.vocab = vocab
        self.think_end, self.think_until = think_end, think_until
        self.text = calls
        self.json_first = json_first
        self.several = several
        self.limit = limit
        self.window = window
        self.reply = bytearray()
        self.lexed = 0  # bytes of `reply` the JSON lexer has read (from where the JSON begins)
        self.active = calls is None  # the lexer reads the reply (a format's JSON: from its first byte)
        self.decided = calls is None  # whether (and where) the reply's JSON begins is known
        self.call_mode = False  # the JSON is calls (else a response format's value)
        self.depth = 0
        self.in_string = self.escape = False
        self.run = 0  # digits in a row: the number's current part
        self.call_start = -1  # where the JSON of the call in progress begins (-1: none)
        self.made: list[bytes] = []  # each call's JSON, as written
        self.last_end = 0  # where the last call's JSON ended
        self.end_taken = 0  # ids taken when it ended
        self.longest = 0  # the most ids a call took (from the end of the one before)
        self.taken = 0
        self.string_ids: list[int] = []  # the ids of the call's string being written (its last ones)
        self.ids: list[int] = []  # every id taken
        self.closing = False  # the string in progress closes at the next id (`rewind`)

    # -- following the reply -----------------------------------------------------------------

    def advance(self, token: int) -> None:
        self.ids.append(token)
        self.taken += 1
        self.reply += self.vocab.bytes[token]
        if not self.decided:
            self._decide()
        if self.active:
            for i in range(self.lexed, len(self.reply)):
                self._lex(i, self.reply[i])
            self.lexed = len(self.reply)
        self.closing = self.closing and self.in_string
        if self.call_mode and self.in_string:
            self.string_ids.append(token)
            del self.string_ids[: -(LOOP_IDS + 2 * MAX_PERIOD)]  # a loop seen (a look every LOOP_EVERY) and its start
        elif self.string_ids:
            self.string_ids = []

    @property
    def looping(self) -> bool:
        """The call's string has repeated one cycle of at most MAX_PERIOD ids over its last LOOP_IDS (looked
        at every LOOP_EVERY ids)."""
        return self.taken % LOOP_EVERY == 0 and repeats(self.string_ids)

    @property
    def in_call_string(self) -> bool:
        return self.call_mode and self.in_string

    def excess(self) -> int:
        """The ids a `looping` string wrote past its loop's first cycle (`loops.excess`)."""
        return excess(self.string_ids)

    def rewind(self, count: int) -> None:
        """Forget the last `count` ids (a looping string's repeats); the string they were in closes next."""
        kept = self.ids[: len(self.ids) - count]
        self.__init__(*self.args)
        for token in kept:
            self.advance(token)
        self.closing = self.in_string

    def _decide(self) -> None:
        """Where the calls' JSON begins: after the syntax's opening text (anywhere, for Hermes: its text
        holds no markup), or at the first byte of a reply that opens as a call does."""
        text, reply = self.text, bytes(self.reply)
        if self.json_first and reply[:1] == b"{" and text.anywhere:
            self.decided = self.active = True  # the format's JSON, not calls
        elif text.anywhere:
            found = reply.find(text.start)
            if found >= 0:
                self.decided = self.active = self.call_mode = True
                self.lexed = found + len(text.start)
        elif reply:
            self.decided = True
            self.active = self.call_mode = reply[:1] in (b"{", b"[")

    def _lex(self, i: int, byte: int) -> None:
        if self.in_string:
            if self.escape:
                self.escape = False
            elif byte == 0x5C:  # backslash
                self.escape = True
            elif byte == 0x22:
                self.in_string = False
            return
        self.run = self.run + 1 if byte in DIGITS else 0
        if byte == 0x22:
            self.in_string = True
        elif byte in b"{[":
            self.depth += 1
            if byte == 0x7B and self.call_mode and self.depth == self.text.depth + 1:
                self.call_start = i
        elif byte in b"}]":
            self.depth -= 1
            if byte == 0x7D and self.call_mode and self.depth == self.text.depth and self.call_start >= 0:
                self._made(i + 1)

    def _made(self, end: int) -> None:
        self.made.append(bytes(self.reply[self.call_start : end]))
        self.longest = max(self.longest, self.taken - self.end_taken)
        self.last_end, self.end_taken, self.call_start = end, self.taken, -1

    # -- narrowing ---------------------------------------------------------------------------

    def narrow(self, allowed: np.ndarray, matcher) -> np.ndarray:
        """`allowed` ([vocab] bool, the grammar's) less the ids steering refuses; never empty."""
        if not self.active:
            return self._thinking(allowed)
        if self.closing and (allowed & self.vocab.quotes).any():  # after a rewind: the string closes here
            return allowed & self.vocab.quotes
        refused = np.zeros_like(allowed)
        if self.run and not self.in_string:
            refused |= self.vocab.lead_digits > MAX_DIGITS - self.run
        if self.call_mode and self.made and self.several:
            self._duplicates(allowed, matcher, refused)
        kept = allowed & ~refused
        if not kept.any():
            return allowed
        return self._closing(kept)

    def _thinking(self, allowed: np.ndarray) -> np.ndarray:
        """Before a forced call, once only its room is left: the reasoning's closing id where the grammar takes
        it, else (its channel not opened yet) only ids on the way to the call's opening text."""
        if self.think_end is None or self.decided or self.taken < self.think_until:
            return allowed
        if allowed[self.think_end]:
            keep = np.zeros_like(allowed)
            keep[self.think_end] = True
            return keep
        opening = self.text.start
        toward = [t for t in np.flatnonzero(allowed) if self._toward(self.vocab.bytes[t], opening)]
        if not toward:
            return allowed
        keep = np.zeros_like(allowed)
        keep[toward] = True
        return keep

    @staticmethod
    def _toward(spelled: bytes, opening: bytes) -> bool:
        return bool(spelled) and (opening.startswith(spelled) or spelled.startswith(opening))

    def _duplicates(self, allowed: np.ndarray, matcher, refused: np.ndarray) -> None:
        """Refuse the ids that would complete a call already made (its JSON again, after `between`)."""
        tail = bytes(self.reply[self.last_end :])
        for made in set(self.made):
            again = self.text.between + made
            if len(tail) >= len(again) or not again.startswith(tail):
                continue
            rest = again[len(tail) :]
            refused[self.vocab.starting_with(rest)] = True
            for j, token in self.vocab.prefixes(rest):
                if allowed[token] and _forced_to(matcher, token, rest[:j], rest):
                    refused[token] = True

    def _closing(self, allowed: np.ndarray) -> np.ndarray:
        """Within the budget: no new call without room for one; near its end, a call closes at the
        next JSON boundary its grammar allows."""
        if self.limit is None or not self.call_mode:
            return allowed
        left = self.limit - self.taken  # ids still allowed, this one among them
        keep = None
        if self.depth == self.text.depth and self.made and self.call_start < 0:  # between calls
            if len(self.made) >= MAX_CALLS or not self.several or left < math.ceil(1.5 * self.longest) + 2:
                keep = self._ending(allowed)
        elif self.depth > self.text.depth and left <= self.window and self._boundary():
            keep = allowed & self.vocab.closers
        return keep if keep is not None and keep.any() else allowed

    def _ending(self, allowed: np.ndarray) -> np.ndarray | None:
        """The ids that go on with the syntax's closing text (then end the reply), not into another call."""
        tail = bytes(self.reply[self.last_end :])
        end = self.text.end
        if not end.startswith(tail):
            return None  # another call has begun
        rest = end[len(tail) :]
        keep = np.zeros_like(allowed)
        if not rest:
            return allowed & self.vocab.stop
        for ids in (self.vocab.by_bytes.get(rest[:j], ()) for j in range(1, len(rest) + 1)):
            keep[list(ids)] = True
        return allowed & keep

    def _boundary(self) -> bool:
        """The call's last byte ends a value the model wrote whole (a string, an object, an array, a
        literal), so it may close here."""
        if self.in_string or self.run:
            return False
        reply = self.reply
        return reply[-1:] in (b'"', b"}", b"]") or reply.endswith((b"true", b"false", b"null"))


def _forced_to(matcher, token: int, spelled: bytes, rest: bytes) -> bool:
    """After `token` (its bytes `spelled`, a prefix of `rest`), the grammar forces the rest of `rest`."""
    step = matcher.deep_copy()
    if not step.consume_token(token):
        return False
    return (spelled + step.compute_ff_bytes()).startswith(rest)
