"""Egress: token ids → text pieces, as they are decoded.

`IncrementalDetokenizer` uses the offset algorithm (as in text-generation-inference
and vLLM): each step decodes a short window of ids twice — with and without the
newest ids — and emits the difference. A piece is held back while the window ends in
U+FFFD (a multi-byte character split across tokens). `finish()` emits whatever the
full decode has beyond what was streamed, less the U+FFFD a character the ids leave
unfinished decodes to (a reply cut by max_tokens mid-emoji: its last bytes, read with the
tokenizer's `token_bytes`, begin a UTF-8 sequence they do not end): the pieces concatenate to
`tokenizer.decode(ids, skip_special_tokens=True)` but for that one character — whole
characters only; the bytes of one not finished are held back, never replaced.

`StopStringFilter` sits after it: it holds back any tail that could be the start of a
stop string, and reports the text before a stop string once one appears.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Protocol

REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""
        self._prefix_offset = 0  # window start: ids before it are settled
        self._read_offset = 0  # ids before it have been emitted

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """Add one id; return the new text it completes (often '', never a partial character)."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self.ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT):
            return ""
        if not new_text.startswith(prefix_text):
            return ""  # the window re-tokenised its start; wait for finish() to settle it
        piece = new_text[len(prefix_text) :]
        # The ids just emitted become the left context of the next window
        # (decoders that strip a leading space need one token before it).
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.ids)
        self.emitted += piece
        return piece

    def finish(self) -> str:
        """Flush: the rest of the full decode, so the stream equals `decode(ids)`, but for the U+FFFD
        at its end that stands for the bytes of a character the ids leave unfinished (`_unfinished`);
        a U+FFFD the model wrote, or bytes that can never be a character, stay as decoded."""
        full = self._decode(self.ids)
        if full.endswith(REPLACEMENT) and self._unfinished():
            full = full[: -len(REPLACEMENT)]
        if full.startswith(self.emitted):
            rest = full[len(self.emitted) :]
        else:  # cannot happen for byte-level BPE or SentencePiece; never emit twice
            rest = ""
        self.emitted += rest
        return rest

    def _unfinished(self) -> bool:
        """The ids' last bytes begin a UTF-8 sequence they do not end (a lead byte, then fewer continuation
        bytes than it announces). Without the tokenizer's `token_bytes`, a final U+FFFD is taken for one."""
        token_bytes = getattr(self.tokenizer, "token_bytes", None)
        if token_bytes is None:
            return True
        tail = b""
        for token_id in reversed(self.ids):  # the last 4 bytes at least: the longest sequence
            tail = token_bytes(token_id) + tail
            if len(tail) >= 4:
                break
        return unfinished_utf8(tail)


def unfinished_utf8(data: bytes) -> bool:
    """`data` ends inside a UTF-8 character: bytes that begin one, which more bytes could complete (Python's
    incremental decoder holds them back; a byte that can never begin one, as 0xC0 or a lone continuation
    byte, is an error it replaces at once)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(data)
    return bool(decoder.getstate()[0])


class StopStringFilter:
    """Streams text through, holding back what could begin a stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text, once one has

    def push(self, text: str) -> str:
        if self.stopped:
            return ""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out
        hits = [(i, s) for i, s in ((self.pending.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])
            out = self.pending[:at]
            self.pending = ""
            self.stopped = True
            return out
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold :]
        return out

    def finish(self) -> str:
        """The held-back tail, once no more text can follow."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out
