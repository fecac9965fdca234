"""The chat screen's keys along its bottom line (`widgets/keybar.py`): the Footer's cells in one widget, its mouse
kept (a key under the pointer takes the hover colour, a click presses it) and the keys the focus gives. The cells
are the Footer's to the colour (tests/ui/test_snapshots.py's screens are unchanged)."""

from __future__ import annotations

from chatcli.ui.widgets.keybar import KeyBar
from tests.ui.conftest import make_app, ready


def line(bar: KeyBar) -> str:
    return "".join(segment.text for segment in bar.render_line(0)._segments)


async def test_the_bar_lists_the_screens_keys_and_a_click_presses_one():
    app = make_app()
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        bar = screen.query_one(KeyBar)
        text = line(bar)
        assert text.startswith(" ⏎ Send ") and " f2 Panels " in text and " ^q Quit " in text
        panels = text.index("f2 Panels")
        shown = screen.panels.display
        await pilot.click(KeyBar, offset=(panels + 1, 0))
        await pilot.pause()
        assert screen.panels.display != shown
        await pilot.click(KeyBar, offset=(len(text.rstrip()) + 2, 0))  # past the last key: nothing
        await pilot.pause()
        assert screen.panels.display != shown
        await pilot.press("f3")  # the sidebar's list takes the focus: the prompt's keys go
        await pilot.pause()
        assert " Send " not in line(bar) and " f2 Panels " in line(bar)


async def test_the_key_under_the_pointer_takes_the_hover_colour():
    app = make_app()
    async with app.run_test(size=(140, 45)) as pilot:
        await ready(pilot)
        bar = app.screen.query_one(KeyBar)
        at = line(bar).index("f2 Panels")

        def background(x: int):
            cells = [(s.style.bgcolor if s.style else None) for s in bar.render_line(0)._segments for _ in s.text]
            return cells[x]

        before = background(at)
        await pilot.hover(KeyBar, offset=(at + 1, 0))
        await pilot.pause()
        assert bar.hover is not None and background(at) != before
        await pilot.hover(KeyBar, offset=(0, -5))  # off the bar
        await pilot.pause()
        assert bar.hover is None and background(at) == before
