"""The stats panels: live numbers of the streaming turn, a context gauge, a decode-speed
sparkline and the last turns. The screen calls `show(...)` at most once per UI tick.

Below `NARROW_BELOW` columns (the screen's `-narrow` class) the panels fold to `StatusLine`, one
line of the turn's figures above the prompt; F2 (the `-toggled` class on both) swaps them."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import ProgressBar, Sparkline, Static

from chatcli.ui.widgets.line import FittedLine

ROWS = (
    ("ttft", "TTFT"),
    ("prefill", "prefill"),
    ("decode", "decode"),
    ("tokens", "tokens"),
    ("prompt", "prompt"),
    ("drafts", "drafts"),
    ("context", "context"),
    ("kv", "KV cache"),
)
POOL_ROWS = (
    ("resident", "resident"),
    ("pool", "pool"),
)
HISTORY_TURNS = 5


SPARK_MIN = 8  # decode-speed points before the sparkline draws

# The status bar's parts: (the panel row, its text, its rank: the highest goes first where the line
# does not fit)
STATUS_PARTS = (
    ("decode", "{}", 1),
    ("ttft", "TTFT {}", 2),
    ("tokens", "{} tok", 3),
    ("context", "ctx {}", 4),
    ("prefill", "prefill {}", 5),
    ("kv", "KV {}", 6),
    ("prompt", "prompt {}", 7),
    ("drafts", "drafts {}", 8),
)


class StatusLine(FittedLine):
    """The panels' figures in one line, where the panels are folded (a narrow terminal, or F2)."""

    DEFAULT_CSS = """
    StatusLine { background: $panel; color: $text-muted; }
    Screen.-wide StatusLine { display: none; }
    Screen.-wide StatusLine.-toggled { display: block; }
    Screen.-narrow StatusLine.-toggled { display: none; }
    """
    SCOPED_CSS = False  # the rules above look at the screen's width class

    def figures(self, values: dict[str, str]) -> None:
        parts = [(text.format(values[key]), rank) for key, text, rank in STATUS_PARTS if values[key] != "–"]
        self.show([parts + [("F2 panels", 10)]])


class StatsPanel(VerticalScroll):
    DEFAULT_CSS = """
    StatsPanel { width: 34; height: 1fr; padding: 0 1; background: $panel; border-left: vkey $primary 40%; }
    StatsPanel .label { color: $text-muted; }
    StatsPanel .value { color: $accent; }
    Screen.-wide StatsPanel.-toggled { display: none; }
    Screen.-narrow StatsPanel { display: none; }
    Screen.-narrow StatsPanel.-toggled { display: block; }
    StatsPanel .row { height: 1; }
    StatsPanel .label { width: 10; }
    StatsPanel .value { width: 1fr; }
    StatsPanel .title { margin-top: 1; text-style: bold; }
    StatsPanel ProgressBar { height: 1; margin-left: 10; }
    StatsPanel ProgressBar Bar { width: 1fr; }
    StatsPanel Sparkline { height: 3; margin-top: 1; }
    StatsPanel #history { height: auto; }
    """
    SCOPED_CSS = False  # the rules above look at the screen's width class
    can_focus = False

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {key: "–" for key, _ in ROWS + POOL_ROWS}
        self._value_widgets: dict[str, Static] = {}
        self.gauge = ProgressBar(total=1, show_eta=False, show_percentage=True)
        self.spark = Sparkline([], summary_function=max)
        self.history = Static("–", id="history", markup=False)
        self.status = StatusLine()  # the screen puts it above the prompt
        self.status.figures(self.values)

    def compose(self) -> ComposeResult:
        yield Static("This turn", classes="title")
        yield from self._rows(ROWS, after={"context": self.gauge})
        yield self.spark
        yield Static("Cache pool", classes="title")
        yield from self._rows(POOL_ROWS)
        yield Static("Recent turns", classes="title")
        yield self.history

    def _rows(self, rows, after: dict | None = None) -> ComposeResult:
        """A label/value row per key; `after` puts a widget below the row of its key."""
        for key, label in rows:
            value = Static(self.values[key], classes="value", markup=False)
            self._value_widgets[key] = value
            with Horizontal(classes="row"):
                yield Static(label, classes="label")
                yield value
            if after and key in after:
                yield after[key]

    def show(self, **values: str) -> None:
        """Set some rows; a row's widget is only touched when its text changes."""
        changed = False
        for key, text in values.items():
            if self.values.get(key) != text:
                self.values[key] = text
                self._value_widgets[key].update(text, layout=False)  # one line, fixed size: no reflow
                changed = True
        if changed:
            self.status.figures(self.values)

    def set_context(self, used: int, limit: int) -> None:
        """Tokens in the cache against the model's context (a limit of 0: a server that does not say)."""
        self.show(context=f"{used} / {limit}" if limit > 0 else f"{used} / n/a")
        self.gauge.update(total=max(limit, 1), progress=min(used, max(limit, 1)))

    def set_pool(self, resident: str, used: str) -> None:
        """Conversations whose KV cache is in memory, and the bytes they take of the budget."""
        self.show(resident=resident, pool=used)

    def set_speeds(self, rates: list[float]) -> None:
        """The decode speed over the reply; drawn from SPARK_MIN points on (a handful, scaled to the
        panel's width, draw a solid block that says nothing)."""
        self.spark.data = list(rates) if len(rates) >= SPARK_MIN else []  # the widget buckets them into its width

    def set_turns(self, lines: list[str]) -> None:
        """ "Recent turns": the last HISTORY_TURNS of `lines` (one per turn of the conversation on screen)."""
        self.history.update("\n".join(lines[-HISTORY_TURNS:]) or "–")

    def reset(self) -> None:
        self.show(**{key: "–" for key, _ in ROWS})
        self.set_speeds([])
