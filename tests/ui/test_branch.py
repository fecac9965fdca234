"""/edit N and F9: an earlier message edited becomes a new branch; the old one stays, and the
shared prefix comes from the KV cache (the tiny real engine)."""

from chatcli.engine.kv.prefix import common_prefix
from chatcli.engine.sample.sampling import SamplingParams
from chatcli.options import StartOptions
from tests.ui.conftest import command, make_app, ready, send


def start():
    return StartOptions(params=SamplingParams(temperature=0, max_tokens=5))


def last_note(screen) -> str:
    return screen.pane.notes()[-1].text


async def test_edit_an_earlier_message_into_a_branch(tiny_engine):
    app = make_app(tiny_engine, start=start())
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "Hello")
        await send(pilot, "Tell me more")
        root = screen.conversation
        old_ids = list(screen.session.cache.ids)
        await command(pilot, "/edit 3")  # message #3, as the screen numbers it: the second of yours
        assert screen.prompt.text == "Tell me more" and screen.editing == 2
        await pilot.press("escape")
        await command(pilot, "/edit 2")
        assert "#2 is not one of your messages here (#1, #3)" in last_note(screen) and screen.editing is None
        await command(pilot, "/edit 3")
        await send(pilot, "What else")
        branch = screen.conversation
        assert branch.id != root.id and branch.parent_id == root.id and branch.fork_at == 2
        assert [m.content for m in branch.messages[:2]] == [m.content for m in root.messages[:2]]
        assert branch.messages[2].content == "What else" and len(root.messages) == 4  # the old branch stays
        target = tiny_engine.tokenizer.encode_chat(branch.for_template()[:-1])
        shared = common_prefix(old_ids, target)
        stats = screen.last_stats
        assert stats.cached_tokens == shared > 0 and stats.prefill_tokens == len(target) - shared
        saved = screen.chats.store.load(branch.id)
        assert (saved.parent_id, saved.fork_at, len(saved.messages)) == (root.id, 2, 4)

        await command(pilot, "/branches")
        listing = last_note(screen)
        assert "root" in listing and "⑂ branch at #3" in listing and listing.count("\n") == 2
        titles = [str(option.prompt).split("\n")[0] for option in screen.sidebar.list._options]
        assert any("⑂#3 " in t for t in titles) and not all("⑂" in t for t in titles)  # told apart from its root
        await command(pilot, "/switch 2")
        assert screen.conversation.id == root.id
        await send(pilot, "And then")
        assert screen.last_stats.cached_tokens == len(old_ids)  # its own cache was kept

        await pilot.press("f9")
        assert screen.prompt.text == "And then"
        await pilot.press("!")  # the cursor is after the text: typing adds to its end
        assert screen.prompt.text == "And then!"
        await pilot.press("escape")
        assert screen.editing is None and screen.prompt.text == "" and "Edit cancelled" in last_note(screen)


async def test_edit_refusals_are_inline(tiny_engine):
    app = make_app(tiny_engine, start=start())
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await ready(pilot)
        await command(pilot, "/edit")
        assert "no message of yours to edit yet" in last_note(screen)
        await send(pilot, "Hello")
        await command(pilot, "/edit 5")
        assert "#5 is not one of your messages here (#1)" in last_note(screen)
        await command(pilot, "/edit two")
        assert "takes the number (#N) of one of your messages" in last_note(screen)
        await command(pilot, "/branches")
        assert "no branches" in last_note(screen)
