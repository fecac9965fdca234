"""A reply's text as its ids come, and the events a call's string holds back.

Contract. `ReplyText.push(id)` runs an id through the detokenizer and the stop strings and returns its new text
(kept in `texts`, one piece an id). `release(token, hold)` gives the `Token` events the caller may send now: none
while `hold` (the reply is inside a string of a held call, whose last ids the engine may still take back: a loop
in it, `chatcli.engine.sample.loops`), then every event held, in order. `drop(count, kept)` takes back the last
`count` ids, all of them held: their events and text go, and the detokenizer and the stop strings read the
reply's `kept` ids again, so the next id's text follows the kept ones'. `flush()` gives what is held at the end.
"""

from __future__ import annotations

from collections.abc import Callable


class ReplyText:
    def __init__(self, detokenizer: Callable[[], object], stop_filter: Callable[[], object]) -> None:
        self._detokenizer, self._stop_filter = detokenizer, stop_filter
        self.detok, self.stops = detokenizer(), stop_filter()
        self.texts: list[str] = []
        self.held: list = []  # `chatcli.engine.events.Token`s

    def push(self, token_id: int) -> str:
        text = self.stops.push(self.detok.push(token_id))
        self.texts.append(text)
        return text

    def release(self, token, hold: bool) -> list:
        self.held.append(token)
        return [] if hold else self.flush()

    def drop(self, count: int, kept: list[int]) -> None:
        if not 0 < count <= len(self.held):
            raise ValueError(f"cannot take back {count} ids with {len(self.held)} held")
        del self.held[-count:], self.texts[-count:]
        self.detok, self.stops = self._detokenizer(), self._stop_filter()
        for token_id in kept:
            self.stops.push(self.detok.push(token_id))

    def flush(self) -> list:
        held, self.held = self.held, []
        return held
