"""Per-turn statistics: one dataclass shared by every front end (TUI, one-shot, bench, server)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class TurnStats:
    prompt_tokens: int | None = 0  # tokens of the templated prompt (None: a server that did not say: a stopped stream)
    cached_tokens: int | None = 0  # of those, reused from the KV cache (None: a server that does not say)
    prefill_tokens: int | None = 0  # of those, computed in this turn's prefill (None: not known)
    completion_tokens: int = 0  # tokens sampled for the reply
    ttft_s: float = 0.0  # submit to first token
    prefill_tok_s: float | None = 0.0  # None: not measurable (a remote server's prefill)
    decode_tok_s: float = 0.0  # tokens after the first, per second of decode
    total_s: float = 0.0
    kv_cache_bytes: int | None = 0  # None: the cache is a server's
    context_tokens: int = 0  # tokens held in the cache at the end of the turn
    context_limit: int = 0
    truncated_turns: int = 0  # earlier turns dropped to fit the context
    draft_tokens: int = 0  # ids proposed by prompt lookup (--lookup) and verified
    accepted_tokens: int = 0  # of those, the ones the model agreed with
    note: str = ""  # what the user should know about this turn, e.g. a damaged saved KV cache ("" none)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def unread(cls, total_s: float, context_tokens: int, kv_cache_bytes: int, context_limit: int, note: str = ""):
        """A turn stopped while its conversation was templated: no prompt read, the cache as it was."""
        unknown = dict(prompt_tokens=None, cached_tokens=None, prefill_tokens=None, prefill_tok_s=None)
        return cls(**unknown, total_s=total_s, kv_cache_bytes=kv_cache_bytes, context_tokens=context_tokens,
                   context_limit=context_limit, note=note)  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> TurnStats:
        """Stats saved with a reply (`to_dict`), by any version: unknown keys are left out, missing ones
        take their defaults (0, the note "")."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def summary(self) -> str:
        """The one-line summary printed by `--stats`."""
        prefill = "n/a" if self.prefill_tok_s is None else f"{self.prefill_tok_s:.0f} tok/s"
        return (
            f"ttft {self.ttft_s * 1000:.0f} ms · prefill {prefill} "
            f"· decode {self.decode_tok_s:.1f} tok/s · {self.completion_tokens} tokens "
            f"· cached {known(self.cached_tokens)}/{known(self.prompt_tokens)} prefilled {known(self.prefill_tokens)}"
            + (f" · drafts kept {self.accepted_tokens}/{self.draft_tokens}" if self.draft_tokens else "")
            + (f" · dropped {self.truncated_turns} turns" if self.truncated_turns else "")
            + (f" · {self.note}" if self.note else "")
        )


def known(value) -> str:
    """A figure, or "n/a" where the engine could not know it."""
    return "n/a" if value is None else str(value)
