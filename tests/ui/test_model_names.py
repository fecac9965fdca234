"""/model's Tab in the TUI: beside the paths, `default`, the models on disk by name and the catalogue's."""

from tests.ui.conftest import make_app, ready


async def test_tab_after_model_completes_the_names_of_models(tmp_path, monkeypatch):
    from huggingface_hub import constants

    snapshot = tmp_path / "hf" / "models--someone--Tiny-GGUF" / "snapshots" / "0123"
    snapshot.mkdir(parents=True)
    (snapshot / "Tiny-Q8_0.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        prompt = (await ready(pilot)).prompt
        for typed, completed in [
            ("/model defa", "/model default "),
            ("/model hf.co/some", "/model hf.co/someone/Tiny-GGUF:Q8_0 "),
            ("/model llama3.2:1", "/model llama3.2:1b "),
        ]:
            prompt.load_text(typed)
            await pilot.press("tab")
            assert prompt.text == completed
