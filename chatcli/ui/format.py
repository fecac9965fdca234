"""Text the TUI shows: settings, stats, per-turn lines. Pure (no Textual)."""

from __future__ import annotations

from chatcli.engine import FinishReason, TurnStats, settings


def human_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"  # a cache kept by a server
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def sampling_line(params) -> str:
    """The header's settings: those that declare a header label, what shapes a reply (lookup only
    changes its speed; /settings shows it)."""
    return " · ".join(f"{s.header} {s.show(getattr(params, name))}" for name, s in settings() if s.header is not None)


def settings_lines(params, system: str | None, theme: str, model: str) -> list[str]:
    """/settings: the model, every setting a slash command changes (by its user name), the theme and system prompt."""
    values = [(s.name, s.show(getattr(params, name))) for name, s in settings() if s.slash is not None]
    rows = [("model", model), *values, ("theme", theme), ("system", system if system else "(none)")]
    return [f"{label:<14} {value}" for label, value in rows]


def stats_lines(stats: TurnStats) -> list[str]:
    """Every field of a turn's stats, one per line, in readable units (the unit in the value, not
    the name: `total 6555 ms`, where --json says `total_s`)."""
    lines = []
    for key, value in stats.to_dict().items():
        name = key.removesuffix("_tok_s").removesuffix("_s").removesuffix("_bytes").replace("_", " ")
        if value is None:
            text = "n/a"
        elif key.endswith("_s") and not key.endswith("tok_s"):
            text = f"{value * 1000:.0f} ms"
        elif key.endswith("tok_s"):
            text = f"{value:.1f} tok/s"
        elif key.endswith("bytes"):
            text = human_bytes(value)
        else:
            text = str(value)
        lines.append(f"{name:<18} {text}")
    return lines


def drafts_text(stats: TurnStats, lookup: int | None) -> str:
    """The drafts row: how many prompt-lookup drafts the model kept this turn (`lookup` None: a
    server drafted, or not: what its usage says)."""
    if lookup == 0:
        return "off"
    if stats.draft_tokens:
        return f"{stats.accepted_tokens} of {stats.draft_tokens} kept"
    return "n/a" if lookup is None else "none"


ENDINGS = {
    FinishReason.CANCELLED: "⏹ stopped",
    FinishReason.LENGTH: "… cut at the token limit",
    FinishReason.ERROR: "⚠ cut off",
}


def reply_note(finish_reason: str | None, stats: TurnStats | None, error: str | None = None) -> str:
    """The line under a reply: how it ended (and why, for a stream cut off), its length and speed."""
    note = ENDINGS.get(finish_reason, "")
    if error:
        note = f"{note}: {error}"
    if stats is None:
        return note
    summary = f"{stats.completion_tokens} tokens · {stats.decode_tok_s:.1f} tok/s"
    return f"{note} · {summary}" if note else summary


def turn_line(index: int, stats: TurnStats) -> str:
    return f"{index:>3}. {stats.ttft_s * 1000:5.0f} ms {stats.decode_tok_s:6.1f} tok/s"  # turns, not messages: no #
