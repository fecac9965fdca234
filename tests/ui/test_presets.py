"""/preset in the TUI: the config file's [presets.NAME] (see tests/test_presets.py for the file and --preset)."""

from chatcli.cli import start_options
from tests.test_presets import CONFIG
from tests.ui.conftest import command, make_app, ready
from tests.ui.fake import FakeEngine


async def test_slash_preset_sets_the_system_prompt_and_sampling(tmp_path):
    (tmp_path / "config.toml").write_text(CONFIG)  # where the isolated dirs point CHATCLI_CONFIG

    app = make_app(FakeEngine(), start=start_options())
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await command(pilot, "/preset")
        assert "presets: coder, cold" in screen.pane.children[-1].render().plain
        await command(pilot, "/preset coder")
        said = screen.pane.children[-1].render().plain
        assert "temperature = 0.2; top-k = 10" in said  # the names the commands take, not the config's keys
        assert screen.conversation.system == "You write Python."
        assert screen.params.temperature == 0.2 and screen.params.top_k == 10
        await command(pilot, "/preset nope")
        assert "no preset 'nope'" in screen.pane.children[-1].render().plain
        assert screen.params.temperature == 0.2  # unchanged


async def test_a_preset_added_to_the_config_while_running_is_found(tmp_path):
    path = tmp_path / "config.toml"  # where the isolated dirs point CHATCLI_CONFIG
    path.write_text('system = "You are helpful."\n')
    app = make_app(FakeEngine(), start=start_options())
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        assert "no presets" in (await command(pilot, "/preset")).text
        path.write_text(CONFIG)  # edited while chatcli runs: read again at the next look
        assert (await command(pilot, "/preset")).text == "presets: coder, cold"
        assert (await command(pilot, "/preset coder")).text.startswith("preset coder: system prompt: You write Python.")
        assert screen.params.temperature == 0.2
        path.write_text(CONFIG + "[presets.broken]\ntemperature = 'hot'\n")  # a change that does not read
        note = await command(pilot, "/preset cold")
        assert screen.params.temperature == 0.0  # the values read before stay
        errors = [n.text for n in screen.pane.notes() if n.has_class("-error")]
        assert len(errors) == 1 and "config file changed but does not read" in errors[0] and "temperature" in errors[0]
        assert note.text.startswith("preset cold:")
        await command(pilot, "/preset cold")
        assert len([n for n in screen.pane.notes() if n.has_class("-error")]) == 1  # said once
