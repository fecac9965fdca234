"""The smaller TUI defects of issue 46: /settings and /help in columns (wrapped lines keep their
indent), /load's Tab offers what it loads, a bare setting command shows its value, /models in process
lists what /model takes, a /model error names the model once, a tool result that its status line
shows whole has no "click to show"."""

from textual.geometry import Region

from chatcli.chat.conversation import Message
from chatcli.config import Config
from chatcli.options import StartOptions
from tests.ui.conftest import command, make_app, ready, send, wait_for
from tests.ui.fake import FakeEngine


def shown(note) -> list[str]:
    """The note's lines as the screen draws them (its padding included)."""
    return [strip.text.rstrip() for strip in note.render_lines(Region(0, 0, *note.outer_size))]


async def test_settings_values_line_up_after_the_longest_name():
    app = make_app(FakeEngine())
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        note = await command(pilot, "/settings")
        await pilot.pause()
        lines = [line for line in shown(note) if line.strip()]
        starts = {len(line) - len(line[1:].split("  ", 1)[1].lstrip()) for line in lines}
        assert len(starts) == 1  # one column of values, the penalties' too
        assert any("frequency-penalty" in line for line in lines)
    app = make_app(FakeEngine())
    async with app.run_test(size=(40, 12)) as pilot:  # short values: beside their names at 40 columns too
        await ready(pilot)
        note = await command(pilot, "/settings")
        await pilot.pause()
        assert any(line.split() == ["frequency-penalty", "0"] for line in shown(note))


async def test_wrapped_help_lines_keep_their_indent():
    app = make_app(FakeEngine())
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        note = await command(pilot, "/help")
        await pilot.pause()
        rows = shown(note)
        column = rows[0].index("list every command")
        wrapped = [line for line in rows[: rows.index("")] if not line.lstrip().startswith("/")]
        assert wrapped  # some descriptions do not fit 80 columns
        assert all(len(line) - len(line.lstrip()) == column for line in wrapped)
    app = make_app(FakeEngine())
    async with app.run_test(size=(40, 12)) as pilot:  # too narrow for two columns: each under its command
        await ready(pilot)
        note = await command(pilot, "/help")
        await pilot.pause()
        rows = shown(note)
        assert rows[0].strip() == "/help" and rows[1].startswith("   list every command")


async def test_tab_after_load_offers_json_files_and_folders_only(tmp_path):
    (tmp_path / "chat.json").write_text("{}")
    (tmp_path / "chat.md").write_text("# not loadable")
    app = make_app(FakeEngine())
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot)
        screen.prompt.restore(f"/load {tmp_path}/ch")
        await pilot.press("tab")
        assert screen.prompt.text == f"/load {tmp_path}/chat.json "


async def test_a_setting_command_without_a_value_shows_the_value():
    app = make_app(FakeEngine())
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        note = await command(pilot, "/temp")
        assert not note.has_class("-error") and note.text == "temperature = 0.8 (/temp X sets it)"
        await command(pilot, "/seed 7")
        assert (await command(pilot, "/seed")).text.startswith("seed = 7 ")
        for bare in ("/top-k", "/top-p", "/min-p", "/max-tokens", "/repeat-penalty", "/lookup", "/logit-bias"):
            note = await command(pilot, bare)
            assert not note.has_class("-error") and " = " in note.text, bare


async def test_models_in_process_lists_what_model_takes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other.Q4_K_M.gguf").write_bytes(b"GGUF")
    (tmp_path / "notes.txt").write_text("not a model")
    app = make_app(FakeEngine(), start=StartOptions(config=Config(model="org/config-default")))
    async with app.run_test(size=(140, 45)) as pilot:
        await ready(pilot)
        note = await command(pilot, "/models")
        text = note.text
        assert "[fake-model]" in text and "org/config-default" in text and "other.Q4_K_M.gguf" in text
        assert "notes.txt" not in text and not note.has_class("-error")


async def test_a_model_error_names_the_model_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = make_app(FakeEngine())  # /model loads through the real loader: its own words
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        await command(pilot, "/model ./nope")
        await wait_for(pilot, lambda: screen.switching is None and screen.pane.notes()[-1].has_class("-error"))
        said = screen.pane.notes()[-1].text
        assert said.startswith("/model ./nope: ") and said.count("./nope") == 1 and "--model" not in said


async def test_a_short_tool_result_has_no_click_to_show_a_long_one_has():
    app = make_app(FakeEngine())
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "hi")
        call = {"id": "c1", "name": "add", "arguments": '{"a": 2}'}
        short = screen.pane.add_tool_call(call)
        long = screen.pane.add_tool_call(call)
        await pilot.pause()
        short.show(Message("tool", "5", tool_call={"id": "c1", "name": "add", "status": "ok"}))
        long.show(Message("tool", "line one\nline two", tool_call={"id": "c1", "name": "add", "status": "ok"}))
        await pilot.pause()
        assert not short.fold.display and str(short.state.render()) == "5"
        assert long.fold.display and "click to show" in long.fold.title
