"""Sampling settings: the values every front end passes to the engine, validated on creation.

Pure data (no torch), so the command line can check values before anything heavy is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace


MAX_LOOKUP = 16  # drafted tokens per verifying pass; past a few, a draft is rarely accepted to its end


class InvalidParameter(ValueError):
    """A sampling value outside its range; the message names the value and the range."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0.0 disables
    repeat_penalty: float = 1.0  # 1.0 disables
    repeat_last_n: int = 64  # how many recent context tokens the penalty looks at
    max_tokens: int = 1024
    seed: int | None = None
    stop: tuple[str, ...] = ()
    lookup: int = 4  # draft up to this many tokens by prompt lookup, verified in one pass (0 disables)

    def __post_init__(self) -> None:
        check = _check
        check(math.isfinite(self.temperature) and self.temperature >= 0, "temperature", self.temperature, ">= 0")
        check(self.top_k >= 0, "top-k", self.top_k, ">= 0 (0 disables it)")
        check(math.isfinite(self.top_p) and 0 < self.top_p <= 1, "top-p", self.top_p, "in (0, 1]")
        check(math.isfinite(self.min_p) and 0 <= self.min_p <= 1, "min-p", self.min_p, "in [0, 1]")
        check(
            math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0,
            "repeat-penalty",
            self.repeat_penalty,
            "> 0 (1 disables it)",
        )
        check(self.repeat_last_n >= 0, "repeat-last-n", self.repeat_last_n, ">= 0")
        check(self.max_tokens >= 1, "max-tokens", self.max_tokens, ">= 1")
        check(0 <= self.lookup <= MAX_LOOKUP, "lookup", self.lookup, f"in [0, {MAX_LOOKUP}] (0 disables it)")
        if any(not s for s in self.stop):
            raise InvalidParameter("stop strings must not be empty")

    def with_(self, **changes) -> SamplingParams:
        """A copy with some values changed, validated like the original."""
        return replace(self, **changes)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def _check(ok: bool, name: str, value, expected: str) -> None:
    if not ok:
        raise InvalidParameter(f"{name} must be {expected}, got {value}")
