"""Text the TUI shows: settings, stats, per-turn lines. Pure (no Textual)."""

from __future__ import annotations

from chatcli.engine import FinishReason, TurnStats, settings
from chatcli.errors import clip, shown


def human_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"  # a cache kept by a server
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def sampling_parts(params) -> list[tuple[str, int]]:
    """The header's settings, each with its rank (`fit_line`): those that declare a header label, what
    shapes a reply (lookup only changes its speed; /settings shows it)."""
    return [
        (f"{s.header} {s.show(getattr(params, name))}", HEADER_RANKS.get(s.header, LAST_RANK))
        for name, s in settings()
        if s.header is not None
    ]


def sampling_line(params) -> str:
    return " · ".join(text for text, _rank in sampling_parts(params))


# How much a part of a one-line bar matters: 0 is always shown (shortened last), the highest rank goes
# first where the line does not fit. The model's name (rank 0) is shortened, down to MIN_NAME, before
# a part ranked under WHOLE_NAME goes.
HEADER_RANKS = {"temp": 1, "max": 2, "top-k": 3, "top-p": 4, "min-p": 5, "rep": 8, "seed": 9}
ENGINE_RANKS = {"device": 6, "backend": 6, "template": 7, "weights": 10, "kernel": 11}
LAST_RANK = 9
WHOLE_NAME = 6
MIN_NAME = 16
PART, GROUP = " · ", " │ "


def fit_line(groups: list[list[tuple[str, int]]], width: int, name: bool = True) -> str:
    """One line of at most `width` characters from `groups` of (text, rank) parts, shown in their order
    (a group's parts joined by " · ", the groups by " │ "): where it does not fit, the part of the
    highest rank goes first (the last of them, of equal ranks); with `name`, the first part (the
    model's name) is shortened to MIN_NAME, with an ellipsis, before any part ranked under WHOLE_NAME
    goes. Parts of rank 0 stay; where they alone do not fit, the line is cut."""
    kept = [[[text, rank] for text, rank in group] for group in groups]
    head = kept[0][0] if name and kept and kept[0] else None
    whole = head[0] if head else ""

    def line() -> str:
        return GROUP.join(PART.join(text for text, _ in group) for group in kept if group)

    while len(line()) > width:
        ranked = [part for group in kept for part in group if part is not head]
        top = max((rank for _, rank in ranked), default=0)
        if head is not None and top < WHOLE_NAME and len(head[0]) > MIN_NAME:
            head[0] = clip(whole, max(MIN_NAME, len(head[0]) - (len(line()) - width)))
            continue
        if top < 1:  # nothing left to take away
            return clip(line(), width)
        doomed = [part for part in ranked if part[1] == top][-1]
        for group in kept:
            if any(part is doomed for part in group):
                group.remove(doomed)
    if head is not None and head[0] != whole:  # a part that went may have left room for more of the name
        head[0] = clip(whole, len(head[0]) + width - len(line()))
    return line()


def settings_rows(params, system: str | None, theme: str, model: str) -> list[tuple[str, str]]:
    """/settings: the model, every setting a slash command changes (by its user name), the theme and system prompt."""
    values = [(s.name, s.show(getattr(params, name))) for name, s in settings() if s.slash is not None]
    return [("model", model), *values, ("theme", theme), ("system", system if system else "(none)")]


def settings_lines(params, system: str | None, theme: str, model: str) -> list[str]:
    return listing_lines(settings_rows(params, system, theme, model))


def listing_lines(rows: list[tuple[str, str]]) -> list[str]:
    """(label, text) rows as lines, the texts in one column after the longest label."""
    width = max((len(label) for label, _ in rows), default=0)
    return [f"{label:<{width}}  {text}" for label, text in rows]


class Listing:
    """(label, text) rows as a rich renderable: each text beside its label in a column of its own,
    wrapped under itself (not under the labels), where the width leaves the texts `min_text` columns
    (short values need fewer than descriptions); narrower, each text under its label, indented.
    `tail`: a paragraph after the rows."""

    def __init__(self, rows: list[tuple[str, str]], tail: str = "", min_text: int = 24) -> None:
        self.rows, self.tail, self.min_text = rows, tail, min_text

    def __rich_console__(self, console, options):
        from rich.padding import Padding
        from rich.table import Table
        from rich.text import Text

        width = max((len(label) for label, _ in self.rows), default=0)
        if options.max_width >= width + 2 + self.min_text:
            grid = Table.grid(padding=(0, 2))
            grid.add_column(no_wrap=True, width=width)
            grid.add_column()
            for label, text in self.rows:
                grid.add_row(Text(shown(label)), Text(shown(text)))
            yield grid
        else:
            for label, text in self.rows:
                yield Text(shown(label))
                yield Padding(Text(shown(text)), (0, 0, 0, 2))
        if self.tail:
            yield Text("")
            yield Text(shown(self.tail))


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
