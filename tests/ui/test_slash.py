import tomllib

import pytest

from chatcli.chat.commands import COMMANDS
from chatcli.engine.sample.sampling import SamplingParams
from chatcli.options import StartOptions
from chatcli.ui.format import sampling_line
from chatcli.ui.widgets.chat_pane import ReplyBox, UserMessage
from tests.ui.conftest import command, make_app, ready, send, wait_for
from tests.ui.fake import FakeEngine


@pytest.mark.parametrize(
    "line, field, value, shown",
    [
        ("/temp 0.3", "temperature", 0.3, "temperature = 0.3"),
        ("/temperature 0", "temperature", 0.0, "temperature = 0"),
        ("/top-k 7", "top_k", 7, "top-k = 7"),
        ("/top-p 0.5", "top_p", 0.5, "top-p = 0.5"),
        ("/min-p 0.2", "min_p", 0.2, "min-p = 0.2"),
        ("/max-tokens 99", "max_tokens", 99, "max-tokens = 99"),
        ("/repeat-penalty 1.3", "repeat_penalty", 1.3, "repeat-penalty = 1.3"),
        ("/seed 5", "seed", 5, "seed = 5"),
        ("/lookup 0", "lookup", 0, "lookup = 0"),
    ],
)
async def test_setting_commands_confirm_and_change_neither_history_nor_cache(line, field, value, shown):
    engine = FakeEngine()
    app = make_app(engine)
    async with app.run_test(size=(160, 30)) as pilot:  # wide enough for the whole header
        screen = await ready(pilot)
        await send(pilot, "hi")
        before_msgs = list(screen.conversation.messages)
        before_ids = list(screen.session.cache.ids)
        note = await command(pilot, line)
        assert note.text == shown and not note.has_class("-error")
        assert getattr(screen.params, field) == value
        assert screen.conversation.messages == before_msgs
        assert screen.session.cache.ids == before_ids
        assert sampling_line(screen.params) in str(screen.info.render())  # the header shows the new value
        await send(pilot, "next")
        assert getattr(engine.calls[-1]["params"], field) == value  # the next turn uses it


async def test_seed_off_and_bad_values_change_nothing():
    app = make_app(start=StartOptions(params=SamplingParams(seed=3, top_p=0.9)))
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        note = await command(pilot, "/seed off")
        assert note.text == "seed = off" and screen.params.seed is None
        for line, fragment in [("/top-p 1.5", "top-p must be in (0, 1]"), ("/top-k many", "not a whole number")]:
            note = await command(pilot, line)
            assert note.has_class("-error") and fragment in note.text
        assert screen.params.top_p == 0.9 and screen.params.top_k == SamplingParams().top_k


async def test_a_value_the_model_refuses_changes_nothing():
    from chatcli.engine import InvalidParameter

    class SmallVocabulary(FakeEngine):  # the engine's check, as the real one says it (tested in test_server_fields)
        def check_params(self, params) -> None:
            if any(t >= 1000 for t, _ in params.logit_bias):
                raise InvalidParameter("logit-bias: token id 99999999 is past the vocabulary (ids 0 to 999)")

    app = make_app(SmallVocabulary())
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        note = await command(pilot, "/logit-bias 99999999=5")
        assert note.has_class("-error") and note.text.startswith("/logit-bias: token id 99999999 is past")
        assert screen.params.logit_bias == ()


async def test_unknown_command_names_the_nearest():
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        note = await command(pilot, "/tmep 0.5")
        assert note.has_class("-error")
        assert note.text == "unknown command /tmep — did you mean /temp?"


async def test_help_lists_every_command():
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        note = await command(pilot, "/help")
        for spec in COMMANDS:
            assert f"/{spec.name}" in note.text and spec.help in note.text


async def test_system_prompt_set_shown_and_sent():
    engine = FakeEngine()
    app = make_app(engine, start=StartOptions(system="Be brief."))
    async with app.run_test() as pilot:
        await ready(pilot)
        assert (await command(pilot, "/system")).text == "system prompt: Be brief."
        assert (await command(pilot, "/system You are a pirate.")).text == "system prompt set: You are a pirate."
        await send(pilot, "ahoy")
        assert engine.calls[-1]["messages"][0] == {"role": "system", "content": "You are a pirate."}


async def test_settings_and_stats():
    app = make_app()
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        assert (await command(pilot, "/stats")).has_class("-error")  # no turn yet
        await command(pilot, "/temp 0.25")
        settings = (await command(pilot, "/settings")).text
        column = len("frequency-penalty") + 2  # the values after the longest name
        assert "temperature".ljust(column) + "0.25" in settings and "theme".ljust(column) + "dark" in settings
        assert "fake-model" in settings
        await send(pilot, "hi")
        stats = (await command(pilot, "/stats")).text
        assert "completion tokens  3" in stats and "ttft               50 ms" in stats
        assert "kv cache" in stats and len(stats.splitlines()) == len(screen.last_stats.to_dict())


async def test_clear_starts_an_empty_conversation_with_a_new_session():
    app = make_app()
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "hi")
        old_session = screen.session
        await command(pilot, "/clear")
        assert screen.conversation.messages == []
        assert screen.session is not old_session and len(screen.session.cache) == 0
        assert not screen.pane.query(UserMessage) and not screen.pane.query(ReplyBox)
        await send(pilot, "fresh")
        assert [m.content for m in screen.conversation.messages] == ["fresh", "You said: **fresh**"]


async def test_retry_regenerates_the_last_reply_reusing_the_cache():
    replies = iter(["first answer", "second answer"])
    engine = FakeEngine(script=lambda _t: next(replies))
    app = make_app(engine)
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "question")
        prompt_ids = engine.tokenizer.encode_chat([{"role": "user", "content": "question"}])
        await command(pilot, "/retry")
        await wait_for(pilot, lambda: screen.turns_done == 2)
        await pilot.pause()
        assert [m.content for m in screen.conversation.messages] == ["question", "second answer"]
        assert [b.markdown.source for b in screen.pane.query(ReplyBox)] == ["second answer"]
        assert engine.calls[-1]["cached"] == len(prompt_ids) - 1  # everything up to the reply is reused
        assert (await command(pilot, "/undo")).text.startswith("removed the last exchange")
        assert (await command(pilot, "/retry")).text == "nothing to retry"


async def test_retry_with_a_fixed_seed_says_it_gives_the_same_reply_and_keeps_the_exchange_together():
    replies = iter(["first answer", "second answer", "third answer"])
    app = make_app(FakeEngine(script=lambda _t: next(replies)))
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        await command(pilot, "/seed 42")
        await send(pilot, "question")
        await command(pilot, "/retry")
        await wait_for(pilot, lambda: screen.turns_done == 2 and not screen.busy)
        said = [n.message for n in app._notifications]
        assert any("seed 42 is fixed: /retry gives the same reply" in m for m in said)
        await command(pilot, "/seed off")
        await command(pilot, "/retry")
        await wait_for(pilot, lambda: screen.turns_done == 3 and not screen.busy)
        assert [n.message for n in app._notifications] == said  # no fixed seed: nothing to say
        shown = [type(w).__name__ for w in screen.pane.children][-3:]
        assert shown == ["UserMessage", "ReplyBox", "Note"]  # the question and its reply, then "seed = off"
        assert screen.pane.children[-1].text == "seed = off"
        assert screen.pane.children[-2].markdown.source == "third answer"


async def test_undo_removes_the_last_exchange_and_crops_the_cache():
    engine = FakeEngine()
    app = make_app(engine)
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "one")
        await send(pilot, "two")
        note = await command(pilot, "/undo")
        assert [m.content for m in screen.conversation.messages] == ["one", "You said: **one**"]
        kept = engine.tokenizer.encode_chat(screen.conversation.for_template())
        assert len(screen.session.cache) == len(kept) - 1  # all but the reopened assistant turn
        assert screen.session.cache.ids == kept[:-1]
        assert f"cache keeps {len(kept) - 1} tokens" in note.text
        assert [u.text for u in screen.pane.query(UserMessage)] == ["one"]
        await send(pilot, "three")
        assert engine.calls[-1]["cached"] == len(kept) - 1
        await command(pilot, "/undo")
        await command(pilot, "/undo")
        assert screen.conversation.messages == [] and len(screen.session.cache) == 0
        assert (await command(pilot, "/undo")).text == "nothing to undo"


async def test_history_commands_wait_for_a_streaming_reply():
    engine = FakeEngine(hold_at=1)
    app = make_app(engine)
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        await send(pilot, "go", wait=False)
        await wait_for(pilot, lambda: screen.live.tokens == 1)
        for line in ("/clear", "/retry", "/undo"):
            note = await command(pilot, line)
            assert note.has_class("-error") and "press Esc" in note.text
        assert (await command(pilot, "/temp 0.1")).text == "temperature = 0.1"  # settings still work
        engine.release.set()
        await wait_for(pilot, lambda: screen.turns_done == 1)
        assert engine.calls[-1]["params"].temperature == SamplingParams().temperature  # snapshot per turn


async def test_theme_switches_lists_and_is_remembered(isolated_dirs):
    config = isolated_dirs / "config.toml"
    config.write_text('# my settings\nmodel = "x.gguf"\n\n[sampling]\ntemperature = 0.5\n', encoding="utf-8")
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        assert app.chat_theme == "dark" and app.has_class("-theme-dark")
        listing = (await command(pilot, "/theme")).text
        for name in ("[dark]", "light", "high-contrast", "nord", "textual-dark"):
            assert name in listing
        assert (await command(pilot, "/theme light")).text == "theme = light"
        assert app.has_class("-theme-light") and not app.has_class("-theme-dark")
        assert app.theme == "textual-light"
        assert (await command(pilot, "/theme nord")).text == "theme = nord"
        assert app.theme == "nord" and not app.has_class("-theme-light")
        note = await command(pilot, "/theme plaid")
        assert note.has_class("-error") and "unknown theme 'plaid'" in note.text
        assert app.chat_theme == "nord"
    text = config.read_text(encoding="utf-8")
    assert tomllib.loads(text) == {"theme": "nord", "model": "x.gguf", "sampling": {"temperature": 0.5}}
    assert "# my settings" in text


async def test_start_theme_comes_from_the_flag_then_the_config():
    from chatcli.config import Config

    app = make_app(start=StartOptions(theme=None, config=Config(theme="high-contrast")))
    async with app.run_test() as pilot:
        await ready(pilot)
        assert app.chat_theme == "high-contrast" and app.theme == "chatcli-high-contrast"
    app = make_app(start=StartOptions(theme="light", config=Config(theme="high-contrast")))
    async with app.run_test() as pilot:
        await ready(pilot)
        assert app.chat_theme == "light"


@pytest.mark.parametrize("line", ["/quit", "/exit", "/bye"])
async def test_quit_commands_leave(line):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await command(pilot, line)
        await pilot.pause()
    assert app.return_code == 0 and not app.is_running


async def test_a_builtin_theme_still_styles_errors():
    app = make_app(start=StartOptions(theme="nord"), remember=False)
    async with app.run_test() as pilot:
        await ready(pilot)
        note = await command(pilot, "/nope")
        from textual.color import Color

        want, got = Color.parse(app.current_theme.error), note.styles.color
        assert max(abs(a - b) for a, b in zip(want.rgb, got.rgb, strict=True)) <= 2  # the theme's error colour


def test_every_command_has_a_handler_and_every_handler_a_command():
    from chatcli.ui.screens.slash import HANDLERS

    actions = {spec.name for spec in COMMANDS if spec.field is None}
    assert set(HANDLERS) == actions
