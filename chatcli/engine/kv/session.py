"""A conversation's state in the engine: its KV cache and the random generator its replies draw from.

The engine makes one per conversation (`Engine.new_session`), the pool keeps them between turns
and forks them (`kv.pool`), and a saved cache replaces a session's (`Engine.restore_session`).
"""

from __future__ import annotations

from chatcli.engine.kv.cache import KVCache
from chatcli.engine.params import SamplingParams
from chatcli.engine.sample.sampling import new_generator


class Session:
    """The engine's state for one conversation: its KV cache and its random generator, and a note
    for the user that its next turn's stats carry (`TurnStats.note`: e.g. a damaged saved cache)."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.generator = new_generator()
        self._seeded = False
        self.note = ""

    def take_note(self) -> str:
        """The note for this turn's stats, once: the turn after it carries none."""
        note, self.note = self.note, ""
        return note

    def generator_for(self, params: SamplingParams):
        """A seed makes each turn reproducible on its own: the generator restarts from it every turn."""
        if params.seed is not None:
            self.generator = new_generator(params.seed)
        elif self._seeded:
            self.generator = new_generator()  # seeding switched off: back to fresh randomness
        self._seeded = params.seed is not None
        return self.generator
