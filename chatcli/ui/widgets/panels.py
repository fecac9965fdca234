"""The stats panels: live numbers of the streaming turn, a context gauge, a decode-speed
sparkline and the last turns. The screen calls `show(...)` at most once per UI tick.

Below `NARROW_BELOW` columns (the screen's `-narrow` class) the panels fold to `StatusLine`, one
line of the turn's figures above the prompt; F2 (the `-toggled` class on both) swaps them."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import ProgressBar, Sparkline

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


class PanelText(Widget):
    """Lines of the panel in one widget: a title, label / value rows, or the recent turns. A widget a row
    (two Statics in a Horizontal each) made the panel 40 widgets, and every frame of the screen lays out and
    composes every widget it has: the panel shown cost a streaming reply's frames a quarter of their time.
    Its parts take their styles from component classes (the themes' `.panel-text--label`, `--value`)."""

    COMPONENT_CLASSES = {"panel-text--title", "panel-text--label", "panel-text--value", "panel-text--text"}
    DEFAULT_CSS = """
    PanelText { height: auto; }
    PanelText > .panel-text--title { text-style: bold; }
    PanelText > .panel-text--label { color: $text-muted; }
    PanelText > .panel-text--value { color: $accent; text-style: bold; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.lines: tuple = ()

    def show(self, lines: tuple) -> None:
        """`lines`: ("title", text), ("row", label, value) or ("text", text); drawn again only where they
        changed, and without a layout of the screen where their count did not."""
        if lines != self.lines:
            layout = len(lines) != len(self.lines)
            self.lines = lines
            self.refresh(layout=layout)

    def render(self) -> Text:
        style = self.get_component_rich_style
        text = Text(no_wrap=True, overflow="crop", end="")
        for n, (kind, *parts) in enumerate(self.lines):
            if n:
                text.append("\n")
            if kind == "row":
                text.append(parts[0].ljust(LABEL_WIDTH), style("panel-text--label"))
                text.append(parts[1], style("panel-text--value"))
            else:
                text.append(parts[0], style(f"panel-text--{kind}"))
        return text


LABEL_WIDTH = 10


class StatsPanel(VerticalScroll):
    DEFAULT_CSS = """
    StatsPanel { width: 34; height: 1fr; padding: 0 1; background: $panel; border-left: vkey $primary 40%; }
    Screen.-wide StatsPanel.-toggled { display: none; }
    Screen.-narrow StatsPanel { display: none; }
    Screen.-narrow StatsPanel.-toggled { display: block; }
    StatsPanel ProgressBar { height: 1; margin-left: 10; }
    StatsPanel ProgressBar Bar { width: 1fr; }
    StatsPanel Sparkline { height: 3; margin-top: 1; }
    """
    SCOPED_CSS = False  # the rules above look at the screen's width class
    can_focus = False

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {key: "–" for key, _ in ROWS + POOL_ROWS}
        self.turn, self.cache, self.pool, self.history = PanelText(), PanelText(), PanelText(), PanelText()
        self.gauge = ProgressBar(total=1, show_eta=False, show_percentage=True)
        self.spark = Sparkline([], summary_function=max)
        self.turns: list[str] = []
        self.status = StatusLine()  # the screen puts it above the prompt
        self.status.figures(self.values)
        self._draw()

    def compose(self) -> ComposeResult:
        yield self.turn  # "This turn": its rows down to the context's, the gauge, then the KV cache's
        yield self.gauge
        yield self.cache
        yield self.spark
        yield self.pool
        yield self.history

    def _draw(self) -> None:
        rows = [("row", label, self.values[key]) for key, label in ROWS]
        at = next(i for i, (key, _) in enumerate(ROWS) if key == "context") + 1
        self.turn.show((("text", ""), ("title", "This turn"), *rows[:at]))
        self.cache.show(tuple(rows[at:]))
        pool = [("row", label, self.values[key]) for key, label in POOL_ROWS]
        self.pool.show((("text", ""), ("title", "Cache pool"), *pool))
        turns = [("text", line) for line in self.turns[-HISTORY_TURNS:]] or [("text", "–")]
        self.history.show((("text", ""), ("title", "Recent turns"), *turns))

    def show(self, **values: str) -> None:
        """Set some rows; the panel is drawn again only where a text changed."""
        changed = False
        for key, text in values.items():
            if self.values.get(key) != text:
                self.values[key] = text
                changed = True
        if changed:
            self._draw()
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
        self.turns = list(lines)
        self._draw()

    def reset(self) -> None:
        self.show(**{key: "–" for key, _ in ROWS})
        self.set_speeds([])
