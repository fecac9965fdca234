"""/search TEXT in the TUI: ranked hits in a modal; Enter opens the conversation at the message."""

from textual.widgets import OptionList

from chatcli.ui.screens.search import SearchResults
from chatcli.ui.widgets.chat_pane import ReplyBox, UserMessage
from tests.ui.conftest import command, make_app, ready, send
from tests.ui.fake import FakeEngine


async def test_search_opens_the_conversation_at_the_hit():
    replies = {"pasta": "Boil the **spaghetti** for nine minutes.", "tea": "Steep green tea for two minutes."}
    app = make_app(FakeEngine(script=lambda text: replies[text.split()[-1]]))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "how to cook pasta")
        first = screen.conversation.id
        await pilot.press("ctrl+n")
        await send(pilot, "how to make tea")
        await command(pilot, "/search spaghetti minutes")
        results = app.screen
        assert isinstance(results, SearchResults) and len(results.hits) == 1
        assert results.hits[0].conversation_id == first and results.hits[0].index == 1
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is screen and screen.conversation.id == first
        hit = [w for w in screen.pane.query(ReplyBox) if w.has_class("-hit")]
        assert len(hit) == 1 and "spaghetti" in hit[0].markdown.source
        assert not any(w.has_class("-hit") for w in screen.pane.query(UserMessage))

        await command(pilot, "/search zebra")
        assert app.screen is screen and "no saved message holds 'zebra'" in screen.pane.children[-1].render().plain
        await command(pilot, "/search   ")
        assert "/search needs words" in screen.pane.children[-1].render().plain


async def test_a_message_in_a_branch_and_an_import_is_one_hit_naming_them(tmp_path):
    replies = {"pasta": "Boil the **spaghetti** for nine minutes.", "tea": "Steep green tea.", "coffee": "Brew it."}
    app = make_app(FakeEngine(script=lambda text: replies[text.split()[-1]]))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "how to cook pasta")
        await send(pilot, "and tea")
        root = screen.conversation
        await command(pilot, "/edit 3")  # the first exchange shared with a new branch
        await send(pilot, "and coffee")
        branch = screen.conversation
        assert branch.parent_id == root.id
        export = tmp_path / "pasta.json"
        await command(pilot, "/switch 2")
        await command(pilot, f"/save {export}")
        await command(pilot, f"/load {export}")  # an import: every message copied
        imported = screen.conversation
        assert imported.id not in (root.id, branch.id)

        await command(pilot, "/search spaghetti")
        results = app.screen
        assert isinstance(results, SearchResults) and len(results.hits) == 1  # not three times
        hit = results.hits[0]
        assert (hit.conversation_id, hit.index) == (root.id, 1)
        assert [(c.conversation_id, c.kind) for c in hit.copies] == [(branch.id, "branch"), (imported.id, "import")]
        shown = str(results.query_one(OptionList).get_option_at_index(0).prompt)
        assert "also in: ⑂ branch 'how to cook pasta' #2, import 'how to cook pasta' #2" in shown
        assert "1 message (2 copies folded under them)" in str(results.query_one("#query").render())
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is screen and screen.conversation.id == root.id  # Enter opens the original
