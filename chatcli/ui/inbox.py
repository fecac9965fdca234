"""A streaming turn's events on their way from the turn's thread to the UI thread, in batches. Pure (no Textual).

The thread that reads `engine.generate` puts each event here, and wakes the chat screen (posts it a
message) only where the inbox was empty since the screen last looked; the screen then takes all that
came at once. Posted one by one, at 300 tokens a second the UI thread dispatched 300 Textual messages
a second: a tenth of a core at 140x45 (`benchmarks/tui_speed.py`'s `ui cpu`), spent on nothing it
draws. Now it is woken at most once per turn of its event loop, however fast the tokens come.
"""

from __future__ import annotations

import threading


class Inbox:
    def __init__(self) -> None:
        self._items: list = []
        self._lock = threading.Lock()
        self._woken = False  # a wake-up is on its way and the screen has not taken the items since

    def put(self, item) -> bool:
        """Add `item`; True where the caller must wake the screen (nothing else will)."""
        with self._lock:
            self._items.append(item)
            wake, self._woken = not self._woken, True
            return wake

    def take(self) -> list:
        """Everything put since the last take, in order; the next put wakes the screen again."""
        with self._lock:
            items, self._items, self._woken = self._items, [], False
            return items
