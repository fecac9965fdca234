"""A reply's text as its ids come, and the events a call's string holds back.

Contract. `ReplyText.push(id)` runs an id through the detokenizer and the stop strings and returns its new text
(the reply's `ids` and `texts`, one piece an id). `release(token, hold)` gives the `Token` events the caller may
send now: none while `hold` (the reply is inside a string of a held call, whose last ids the engine may still take
back: a loop in it, `chatcli.engine.sample.loops`), then every event held, in order. `drop(count)` takes back the
last `count` ids, all of them held: their events and text go, and the detokenizer and the stop strings read the
kept ids again, so the next id's text follows the kept ones'. `flush()` gives what is held at the end, `finish()`
the text the detokenizer and the stop strings still held (also kept in `texts`), and `reply` is the whole text.
"""

from __future__ import annotations

from collections.abc import Callable


class ReplyText:
    def __init__(self, detokenizer: Callable[[], object], stop_filter: Callable[[], object]) -> None:
        self._detokenizer, self._stop_filter = detokenizer, stop_filter
        self.detok, self.stops = detokenizer(), stop_filter()
        self.ids: list[int] = []
        self.texts: list[str] = []
        self.held: list = []  # `chatcli.engine.events.Token`s

    def push(self, token_id: int) -> str:
        text = self.stops.push(self.detok.push(token_id))
        self.ids.append(token_id)
        self.texts.append(text)
        return text

    def release(self, token, hold: bool) -> list:
        self.held.append(token)
        return [] if hold else self.flush()

    def drop(self, count: int) -> None:
        if not 0 < count <= len(self.held):
            raise ValueError(f"cannot take back {count} ids with {len(self.held)} held")
        del self.held[-count:], self.ids[-count:], self.texts[-count:]
        self.detok, self.stops = self._detokenizer(), self._stop_filter()
        for token_id in self.ids:
            self.stops.push(self.detok.push(token_id))

    def flush(self) -> list:
        held, self.held = self.held, []
        return held

    def finish(self) -> str:
        if self.stops.stopped:
            return ""
        tail = self.stops.push(self.detok.finish()) + self.stops.finish()
        if tail:
            self.texts.append(tail)
        return tail

    @property
    def reply(self) -> str:
        return "".join(self.texts)
