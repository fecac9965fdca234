"""The chat pane shelves the messages far above the view (`ChatPane.reshelve`), and the Markdown blocks there of
the first reply it shows: they leave the layout, one `Shelf` of their height stands in their place, and what is
on screen, the scroll range and every shown message's place stay as they were; they come back when scrolled
near, on a new width, and for a search hit."""

from textual.widgets import OptionList

from chatcli.ui.widgets.chat_pane import ReplyBox, UserMessage
from chatcli.ui.widgets.shelf import Shelf
from tests.ui.conftest import command, make_app, ready, send
from tests.ui.fake import FakeEngine

REPLY = "\n\n".join(
    [f"Paragraph {i} of the answer, long enough to wrap once or twice at this width." for i in range(4)]
    + ["```python\nfor i in range(3):\n    print(i)\n```"]
)


async def long_chat(pilot, turns: int = 12):
    """The chat pane with `turns` saved question-and-reply pairs, laid out, scrolled to the bottom."""
    screen = await ready(pilot)
    for n in range(turns):
        screen.pane.add_user(f"question {n}")
        screen.pane.add_saved_reply(f"Answer {n}.\n\n{REPLY}", "saved", 2 * n + 2)
    screen.pane.follow()
    await pilot.pause()
    await pilot.pause()
    return screen.pane


def screen_text(app) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


def places(pane) -> dict:
    """Each shown message's region in the pane's virtual space, and the scroll range."""
    shown = {id(w): tuple(w.virtual_region) for w in pane.children if w.display and not isinstance(w, Shelf)}
    return {"shown": shown, "virtual": tuple(pane.virtual_size), "max_y": pane.max_scroll_y}


async def test_far_messages_are_shelved_and_nothing_near_the_view_moves():
    async with make_app().run_test(size=(100, 30)) as pilot:
        pane = await long_chat(pilot)
        pane.unshelve()
        await pilot.pause()
        before, text = places(pane), screen_text(pilot.app)
        pane.reshelve()
        await pilot.pause()
        shelf = pane.messages.shelf
        assert len(pane.shelved) >= 10 and shelf is not None and shelf.styles.height.value > 0
        assert all(not w.display for w in pane.shelved)  # out of the layout
        after = places(pane)
        assert after["virtual"] == before["virtual"] and after["max_y"] == before["max_y"]
        assert after["shown"] and all(before["shown"][k] == v for k, v in after["shown"].items())
        assert screen_text(pilot.app) == text
        newest = [w for w in pane.children if isinstance(w, (UserMessage, ReplyBox))][-2:]
        assert all(w.display for w in newest)  # the turn's question and reply never are

        pane.anchor(False)  # the user scrolls to the start: they come back
        pane.scroll_home(animate=False)
        for _ in range(3):
            await pilot.pause()
        assert pane.scroll_y == 0 and len(pane.shelved) < 2
        top = places(pane)
        first = next(w for w in pane.children if isinstance(w, UserMessage))
        assert first.display and top["shown"][id(first)] == before["shown"][id(first)]
        assert top["virtual"] == before["virtual"]


async def test_a_new_width_measures_every_message_again():
    async with make_app().run_test(size=(100, 30)) as pilot:
        pane = await long_chat(pilot)
        pane.reshelve()
        await pilot.pause()
        assert pane.shelved
        await pilot.resize_terminal(70, 30)  # narrower: the replies wrap into more lines
        for _ in range(4):
            await pilot.pause()
        shelved = places(pane)
        assert pane.shelved  # shelved again, at the new heights
        pane.unshelve()
        await pilot.pause()
        await pilot.pause()
        every = places(pane)
        assert shelved["virtual"] == every["virtual"] and shelved["max_y"] == every["max_y"]
        assert all(every["shown"][k] == v for k, v in shelved["shown"].items())


async def test_a_search_hit_on_a_shelved_message_is_shown_and_scrolled_to():
    app = make_app(FakeEngine(script=lambda text: f"Reply to {text}.\n\n{REPLY}"))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "the zebra question")
        for n in range(8):
            await send(pilot, f"question {n}")
        await pilot.pause()
        pane = screen.pane
        zebra = next(w for w in pane.children if isinstance(w, UserMessage) and "zebra" in w.text)
        assert zebra in pane.shelved  # a turn's end shelved it
        await command(pilot, "/search zebra")
        assert isinstance(app.screen.query_one(OptionList), OptionList)
        await pilot.press("enter")
        for _ in range(3):
            await pilot.pause()
        assert zebra.display and zebra.has_class("-hit")
        assert pane.scroll_y <= zebra.virtual_region.y < pane.scroll_y + pane.size.height  # in view


async def test_a_long_reply_above_the_view_keeps_only_its_last_blocks_in_the_layout():
    long = "\n\n".join(f"Paragraph {i} of a very long answer, wrapping once or twice at this width." for i in range(60))
    async with make_app().run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        pane = screen.pane
        screen.pane.add_user("a long question")
        box = screen.pane.add_saved_reply(long, "saved", 2)
        screen.pane.add_user("a short one")
        screen.pane.add_saved_reply("A short answer.", "saved", 4)
        pane.follow()
        await pilot.pause()
        await pilot.pause()
        pane.unshelve()
        await pilot.pause()
        before, text = places(pane), screen_text(pilot.app)
        pane.reshelve()
        await pilot.pause()
        assert box.display and box not in pane.shelved  # the reply reaches near the view: shown
        assert len(box.blocks.hidden) > 20 and all(not b.display for b in box.blocks.hidden)
        assert box.blocks.shelf is not None and box.blocks.shelf.styles.height.value > 0
        after = places(pane)
        assert after["virtual"] == before["virtual"]
        assert all(before["shown"][k] == v for k, v in after["shown"].items()) and id(box) in after["shown"]
        assert screen_text(pilot.app) == text
        pane.anchor(False)  # scrolled up to its start: its blocks come back, where they were
        pane.scroll_home(animate=False)
        for _ in range(3):
            await pilot.pause()
        assert box.blocks.hidden == [] and places(pane)["virtual"] == before["virtual"]


async def test_a_reshelve_that_comes_once_the_pane_is_gone_does_nothing(monkeypatch):
    """A call after a refresh can come once the pane has left the DOM (benchmarks/tui_speed.py's app, closing): it
    shelved into a pane no longer attached, and Textual raised MountError out of the app."""
    from chatcli.ui.widgets.chat_pane import ChatPane

    async with make_app().run_test(size=(100, 30)) as pilot:
        pane = await long_chat(pilot)
        pane.unshelve()
        await pilot.pause()
        monkeypatch.setattr(ChatPane, "is_attached", property(lambda _self: False))  # as it is once detached
        pane.reshelve()  # MountError before
        monkeypatch.undo()
        assert not pane.shelved
