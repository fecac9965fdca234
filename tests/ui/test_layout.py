"""The layout at 140x45, 80x24 and 40x12: a one-line header at every width (the least important parts
go first), the panels folded to a one-line status bar below 100 columns, the chat keeping its lines on a
short terminal, and code blocks that scroll sideways rather than wrap mid-token."""

from types import SimpleNamespace

import pytest
from textual.widgets._markdown import MarkdownFence

from chatcli.engine.sample.sampling import SamplingParams
from chatcli.options import StartOptions
from chatcli.ui.format import fit_line
from chatcli.ui.widgets.chat_pane import ReplyBox
from chatcli.ui.widgets.keybar import KeyBar
from tests.ui.conftest import make_app, ready, send
from tests.ui.fake import FakeEngine

CODE = """Here:

```python
def reverse_string(text):
    return text[::-1]

print(reverse_string("Hello World"), reverse_string("a longer line than the narrowest pane holds"))
```
"""


def embedded_like() -> FakeEngine:
    """The fake engine under the embedded model's names: the header they made wrap at 140 columns."""
    engine = FakeEngine(script=lambda _t: CODE)
    engine.name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    engine.weights = "gguf Q4_1+Q8_0"
    engine.runner = SimpleNamespace(device="cpu", dtype="float32", kernel="avx512")
    return engine


def header(screen) -> str:
    return str(screen.info.render())


@pytest.mark.parametrize("size", [(140, 45), (80, 24), (40, 12)])
async def test_the_header_is_one_line_at_every_width(size):
    app = make_app(embedded_like(), start=StartOptions(params=SamplingParams(max_tokens=60)))
    async with app.run_test(size=size) as pilot:
        screen = await ready(pilot)
        await pilot.pause()
        text = header(screen)
        assert screen.info.size.height == 1 and "\n" not in text
        assert len(text) <= size[0] - 2  # inside its padding: nothing cut at the edge
        assert text.startswith("SmolLM2-135M-In") and "temp 0.8" in text  # the model and the temperature stay
        if size[0] == 140:
            assert "seed off" in text and "kernel avx512" not in text  # the least important part went first


def test_fit_line_takes_the_least_important_part_first():
    groups = [[("a-long-model-name-here", 0), ("cpu", 6), ("kernel x", 11)], [("temp 1", 1), ("seed off", 9)]]
    assert fit_line(groups, 80) == "a-long-model-name-here · cpu · kernel x │ temp 1 · seed off"
    assert fit_line(groups, 50) == "a-long-model-name-here · cpu │ temp 1 · seed off"
    assert fit_line(groups, 33) == "a-long-model-name-here │ temp 1"
    assert fit_line(groups, 25) == "a-long-model-na… │ temp 1"  # the name shortened before temp goes
    assert fit_line(groups, 17) == "a-long-model-nam…"
    assert fit_line(groups, 8) == "a-long-…"
    assert fit_line([[("1 tok/s", 1), ("TTFT 2 ms", 2)]], 10, name=False) == "1 tok/s"


async def test_below_100_columns_the_panels_fold_to_a_status_line():
    app = make_app(embedded_like())
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "code please")
        assert not screen.panels.display and screen.panels.status.display
        assert screen.pane.size.width >= 76  # the chat has the width (the panels took 36 of 80)
        status = str(screen.panels.status.render())
        assert screen.panels.status.size.height == 1 and "tok/s" in status and "TTFT" in status
        await pilot.press("f2")  # the panels instead
        assert screen.panels.display and not screen.panels.status.display
    app = make_app(embedded_like())
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        assert screen.panels.display and not screen.panels.status.display
        await pilot.press("f2")  # hidden on a wide terminal: the status line stands for them
        assert not screen.panels.display and screen.panels.status.display


async def test_a_short_terminal_keeps_its_lines_for_the_chat():
    app = make_app(embedded_like())
    async with app.run_test(size=(40, 12)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "code please")
        assert screen.pane.size.height >= 8  # 5 were left: a two-line header, a boxed prompt, the footer
        assert screen.prompt.size.height == 1 and not screen.query_one(KeyBar).display
        assert "temp" in header(screen)  # the settings are not cut away whole
    app = make_app(embedded_like())
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        assert screen.prompt.outer_size.height == 3 and screen.query_one(KeyBar).display


@pytest.mark.parametrize("size", [(80, 24), (140, 45)])
async def test_a_code_block_scrolls_sideways_instead_of_wrapping(size):
    app = make_app(embedded_like())
    async with app.run_test(size=size) as pilot:
        screen = await ready(pilot)
        await send(pilot, "code please")
        fence = screen.pane.query(ReplyBox).last().query_one(MarkdownFence)
        lines = [line.rstrip() for line in str(fence.query_one("Label").render()).splitlines() if line.strip()]
        long_line = (
            'print(reverse_string("Hello World"), reverse_string("a longer line than the narrowest pane holds"))'
        )
        assert long_line in lines  # whole, on one line
        assert fence.max_scroll_x > 0 and fence.scrollbar_size_horizontal == 1  # a scrollbar says there is more
