"""The slash handlers see the chat screen only through `SlashTarget`, and `ChatScreen` implements it."""

import inspect

from chatcli.ui.screens import slash
from chatcli.ui.screens.chat import ChatScreen
from chatcli.ui.screens.confirm import Confirm
from chatcli.ui.screens.search import SearchResults
from chatcli.ui.screens.slash_target import SlashTarget
from tests.ui.conftest import command, make_app, ready, send, wait_for
from tests.ui.fake import FakeEngine

SETTABLE = {"top_logprobs"}  # the one attribute a handler may set (the rest changes through methods)


def members() -> set[str]:
    methods = {
        n for n, v in vars(SlashTarget).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))
    }
    return methods | set(SlashTarget.__annotations__)


class OnlyTheTarget:
    """The chat screen seen through `SlashTarget` alone: anything else a handler touches is an error."""

    def __init__(self, screen: ChatScreen) -> None:
        object.__setattr__(self, "_screen", screen)
        object.__setattr__(self, "used", set())

    def __getattr__(self, name: str):
        if name not in members():
            raise AttributeError(f"a slash handler used screen.{name}, which SlashTarget does not list")
        self.used.add(name)
        return getattr(self._screen, name)

    def __setattr__(self, name: str, value) -> None:
        if name not in SETTABLE:
            raise AttributeError(f"a slash handler set screen.{name}; SlashTarget lets it set only {SETTABLE}")
        self.used.add(name)
        setattr(self._screen, name, value)


def test_the_protocol_lists_what_the_handlers_need_and_no_widget():
    assert {"note", "open_screen", "load_model", "copy_text", "conversation", "params", "set_params"} <= members()
    assert not members() & {"app", "pane", "panels", "prompt", "sidebar", "tokens", "info", "loading_line", "mount"}


async def test_every_command_runs_through_the_protocol_alone(tmp_path, monkeypatch):
    """Each command, typed as a user would, reaches the screen only through `OnlyTheTarget`."""
    seen: list[OnlyTheTarget] = []
    real = slash.run_command

    async def through_the_target(screen, text):
        seen.append(OnlyTheTarget(screen))
        await real(seen[-1], text)

    monkeypatch.setattr(slash, "run_command", through_the_target)
    other = FakeEngine()
    other.name = "other-model"
    app = make_app(FakeEngine(), remember=False, model_factory=lambda name, status: other)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        assert isinstance(screen, SlashTarget)
        for name in members():  # the same kind of member, with the same parameters
            want, got = getattr(SlashTarget, name, None), getattr(ChatScreen, name, None)
            if callable(want):
                assert inspect.iscoroutinefunction(want) == inspect.iscoroutinefunction(got), name
                assert list(inspect.signature(want).parameters) == list(inspect.signature(got).parameters), name

        await send(pilot, "hello there")
        lines = ["/help", "/temp 0.3", "/system Be brief.", "/system", "/settings", "/stats", "/backend", "/models"]
        lines += ["/theme", "/theme light", "/branches", "/rename Greeting", "/copy", "/tokens", "/top-logprobs 3"]
        lines += ["/seed 7"]  # the /retry below then says its reply will be the same (a notice)
        for line in [*lines, "/tokens", "/preset", f"/save {tmp_path}/c.json", "/file", "/tools"]:
            assert not (await command(pilot, line)).has_class("-error"), line
        for line in ("/top-k x", "/preset nope", "/switch 9", "/edit 7", "/theme plaid"):
            assert (await command(pilot, line)).has_class("-error"), line
        assert screen.params.temperature == 0.3 and screen.top_logprobs == 3 and app.chat_theme == "light"
        await command(pilot, "/retry")
        await wait_for(pilot, lambda: not screen.busy and screen.turns_done == 2)
        await command(pilot, "/undo")
        assert screen.conversation.messages == []
        await send(pilot, "again")
        await command(pilot, "/edit 1")
        assert screen.editing == 0
        await pilot.press("escape")
        await command(pilot, "/search again")
        assert isinstance(app.screen, SearchResults)
        await pilot.press("enter")
        await pilot.pause()
        for line in ("/clear", "/new", "/switch 1", f"/load {tmp_path}/c.json", "/model", "/model other"):
            assert not (await command(pilot, line)).has_class("-error"), line
        await wait_for(pilot, lambda: screen.engine is other)
        await command(pilot, "/delete")
        assert isinstance(app.screen, Confirm)
        await pilot.press("y")
        await pilot.pause()
        assert screen.pane.notes()[-1].text.startswith("deleted: ")
        await command(pilot, "/quit")
    assert app.return_code == 0
    used = set().union(*(target.used for target in seen))
    assert used == members(), f"SlashTarget lists what no handler uses: {members() - used}"
