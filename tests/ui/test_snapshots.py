"""Snapshots of the main screen after one exchange, in each shipped theme (deterministic: fake engine, fixed stats)."""

import pytest

from chatcli.options import StartOptions
from chatcli.ui.themes import shipped_themes
from tests.ui.conftest import make_app, ready, send
from tests.ui.fake import FakeEngine

REPLY = """## Reversing a list

Use slicing:

```python
def reverse(items):
    return items[::-1]
```

- works on **any** sequence
- returns a copy"""


def test_the_three_themes_are_shipped():
    assert {"dark", "light", "high-contrast"} <= set(shipped_themes())


@pytest.mark.parametrize("theme", sorted(shipped_themes()))
def test_main_screen_snapshot(theme, snap_compare):
    engine = FakeEngine(script=lambda _t: REPLY, token_s=lambda n: 1 / (30 + 4 * (n % 6)))
    start = StartOptions(theme=theme, cache_budget_bytes=512 << 20)  # not the RAM-based default: same on every machine
    app = make_app(engine, start=start, remember=False)

    async def run_before(pilot):
        screen = await ready(pilot)
        screen.prompt.cursor_blink = False
        await send(pilot, "How do I reverse a list in Python?")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(110, 34), run_before=run_before)


def test_token_inspector_snapshot(snap_compare):
    """The inspector over a scripted turn: cached and prefilled prompt tokens, reply tokens by probability."""
    import math

    from chatcli.ui.widgets.tokens import Piece

    engine = FakeEngine(script=lambda _t: "Paris.")
    start = StartOptions(theme="dark", cache_budget_bytes=512 << 20)
    app = make_app(engine, start=start, remember=False)
    prompt = [
        Piece(i, text, "cached" if i < 3 else "prefilled")
        for i, text in enumerate(["<s>", "user", "\n", "Capital", "?"])
    ]
    reply = [
        Piece(10, "Paris", "reply", math.log(0.93), [(10, "Paris", math.log(0.93)), (11, "Lyon", math.log(0.04))]),
        Piece(12, ".", "reply", math.log(0.31), [(13, "!", math.log(0.52)), (12, ".", math.log(0.31))]),
        Piece(14, "\n", "reply", math.log(0.02), [(2, "</s>", math.log(0.97))]),
    ]

    async def run_before(pilot):
        screen = await ready(pilot)
        screen.prompt.cursor_blink = False
        await pilot.press("f4")
        screen.tokens.show_turn(prompt + reply, recorded=True)
        screen.tokens.action_move(1)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(110, 34), run_before=run_before)
