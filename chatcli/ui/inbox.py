"""A streaming turn's events on their way from the turn's thread to the UI thread, in batches. Pure (no Textual).

The thread that reads `engine.generate` puts each event here. The chat screen takes what came at its
draw tick (10 Hz); only a turn's start, its first token and its end (`wake`) wake it at once, with a
message, where no wake-up is on its way already (the first token is drawn as it comes: TTFT on
screen). Posted one by one, at 300 tokens a second the UI thread dispatched 300 Textual messages a
second: a tenth of a core at 140x45 (`benchmarks/tui_speed.py`'s `ui cpu`), spent on nothing it
draws, since the reply is drawn at the ticks anyway.
"""

from __future__ import annotations

import threading


class Inbox:
    def __init__(self) -> None:
        self._items: list = []
        self._lock = threading.Lock()
        self._woken = False  # a wake-up is on its way and the screen has not taken the items since

    def put(self, item, wake: bool = False) -> bool:
        """Add `item`; True where the caller must wake the screen now: `wake` asked for it (the turn
        starts or ends), and no wake-up is on its way."""
        with self._lock:
            self._items.append(item)
            if not wake or self._woken:
                return False
            self._woken = True
            return True

    def take(self) -> list:
        """Everything put since the last take, in order; the next put with `wake` wakes the screen again."""
        with self._lock:
            items, self._items, self._woken = self._items, [], False
            return items
