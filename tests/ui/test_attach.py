"""/file PATH in the TUI: a text file goes before the next message (as `-f` does on the one-shot),
and Tab completes paths, themes and presets, cycling where several fit."""

from chatcli.chat.attach import read_attachment, with_attachments
from tests.ui.conftest import command, make_app, ready, send
from tests.ui.fake import FakeEngine


async def test_a_file_goes_before_the_next_message_only(tmp_path):
    code = tmp_path / "add.py"
    code.write_text("def add(a, b):\n    return a + b\n")
    engine = FakeEngine()
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        note = await command(pilot, f"/file {code}")
        assert not note.has_class("-error") and note.text.startswith(f"attached {code} (2 lines)")
        assert (await command(pilot, "/file")).text == f"attached to your next message: {code} (2 lines)"
        await send(pilot, "What does it do?")
        sent = engine.calls[-1]["messages"][-1]["content"]
        assert sent == with_attachments("What does it do?", [read_attachment(str(code))])
        assert screen.conversation.messages[0].content == sent  # saved as the model got it
        await send(pilot, "And now?")
        assert engine.calls[-1]["messages"][-1]["content"] == "And now?"  # one message only
        await command(pilot, f"/file {code}")
        assert (await command(pilot, "/file off")).text == "dropped 1 attached file" and not screen.attachments
        assert (await command(pilot, "/file off")).text == "no file attached"  # not "dropped 0"


async def test_a_file_that_cannot_be_attached_is_an_inline_error(tmp_path):
    (tmp_path / "blob").write_bytes(b"\x00\x01\x02")
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        bad = [(tmp_path / "blob", "not a text file"), (tmp_path, "is a folder"), ("nope.txt", "cannot read")]
        for arg, words in bad:
            note = await command(pilot, f"/file {arg}")
            assert note.has_class("-error") and words in note.text and "\n" not in note.text
        assert screen.attachments == []


async def test_tab_completes_paths_and_values_and_cycles(tmp_path, monkeypatch):
    (tmp_path / "notes.md").write_text("x")
    (tmp_path / "notebook").mkdir()
    (tmp_path / "readme.txt").write_text("y")
    monkeypatch.chdir(tmp_path)
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        prompt = screen.prompt
        prompt.load_text("/file re")
        await pilot.press("tab")
        assert prompt.text == "/file readme.txt "  # the one match, and a space
        prompt.load_text("/file no")
        await pilot.press("tab")
        assert prompt.text == "/file note"  # what both share
        await pilot.press("tab")
        assert prompt.text == "/file notebook/"  # then each in turn
        await pilot.press("tab")
        assert prompt.text == "/file notes.md"
        await pilot.press("tab")
        assert prompt.text == "/file notebook/"
        (tmp_path / "tiny.gguf").write_bytes(b"GGUF")
        prompt.load_text("/model ti")
        await pilot.press("tab")
        assert prompt.text == "/model tiny.gguf "  # /model takes a .gguf or a folder: paths complete
        prompt.load_text("/theme hi")
        await pilot.press("tab")
        assert prompt.text.startswith("/theme high") and prompt.text.split()[1] in app.theme_names()
        assert prompt.cursor_location == prompt.document.end
