"""The GGUF conversion cache: atomic writes, validation, rebuilds (with a stand-in converter)."""

from __future__ import annotations

import os

import pytest

from chatcli.engine.weights import gguf_convert as convert


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(os.urandom(3 << 20))
    calls = []

    def fake_save(src, out, status=lambda _m: None):
        calls.append(src)
        (out / "model.safetensors").write_bytes(b"w" * 4096)
        (out / "config.json").write_text("{}")

    def fake_metadata(src, out, status=lambda _m: None):
        (out / "config.json").write_text("{}")
        return {"direct": "a stand-in"}

    monkeypatch.setattr(convert, "save_converted", fake_save)
    monkeypatch.setattr(convert, "save_metadata", fake_metadata)
    return path, calls


def test_converts_once_then_reuses(fake_gguf):
    path, calls = fake_gguf
    first = convert.converted_folder(path)
    second = convert.converted_folder(path)
    assert first == second and len(calls) == 1
    assert (first / convert.MANIFEST).is_file()
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temp folder left behind


def test_truncated_file_is_rebuilt(fake_gguf):
    path, calls = fake_gguf
    folder = convert.converted_folder(path)
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(100)
    assert not convert.is_valid(folder)
    convert.converted_folder(path)
    assert len(calls) == 2 and convert.is_valid(folder)


def test_same_size_corruption_is_caught_by_hash(fake_gguf):
    path, calls = fake_gguf
    folder = convert.converted_folder(path)
    target = folder / "model.safetensors"
    target.write_bytes(b"x" * 4096)  # same size, new mtime, other bytes
    assert not convert.is_valid(folder)
    convert.converted_folder(path)
    assert len(calls) == 2 and (folder / "model.safetensors").read_bytes() == b"w" * 4096


def test_touched_but_intact_file_stays_valid(fake_gguf):
    path, calls = fake_gguf
    folder = convert.converted_folder(path)
    os.utime(folder / "model.safetensors", ns=(1, 1))
    assert convert.is_valid(folder)


def test_missing_or_garbled_manifest_is_rebuilt(fake_gguf):
    path, calls = fake_gguf
    folder = convert.converted_folder(path)
    (folder / convert.MANIFEST).write_text("{not json")
    convert.converted_folder(path)
    assert len(calls) == 2 and convert.is_valid(folder)


def test_conversion_killed_midway_leaves_no_cache(fake_gguf, monkeypatch):
    path, _ = fake_gguf

    def dies(src, out, status=lambda _m: None):
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "save_converted", dies)
    with pytest.raises(KeyboardInterrupt):
        convert.converted_folder(path)
    folder = convert.folder_for(path)
    assert not folder.exists() and list(folder.parent.iterdir()) == []


def test_key_follows_file_identity(fake_gguf):
    path, _ = fake_gguf
    before = convert.gguf_key(path)
    with open(path, "r+b") as f:
        f.write(b"changed")
    assert convert.gguf_key(path) != before


def test_flipped_bytes_with_the_mtime_put_back_pass_a_start_but_not_verify(fake_gguf):
    from chatcli.engine import verify_model_files

    path, calls = fake_gguf
    convert.meta_folder(path)
    folder = convert.converted_folder(path)
    target = folder / "model.safetensors"
    st = target.stat()
    target.write_bytes(b"x" * 4096)  # same size, other bytes, the mtime put back
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert convert.is_valid(folder)  # the start's rule: size and mtime
    checks = {c.path.relative_to(folder.parent.parent).as_posix(): c.problem for c in verify_model_files(str(path))}
    assert checks[f"converted/{folder.name}/config.json"] == "" and checks[f"gguf/{folder.name}/config.json"] == ""
    assert "BLAKE3" in checks[f"converted/{folder.name}/model.safetensors"]
    assert not folder.exists()  # removed: converted again when a load needs it
    assert convert.converted_folder(path) == folder and len(calls) == 2 and target.read_bytes() == b"w" * 4096
    assert all(c.ok for c in verify_model_files(str(path))) and len(calls) == 2


def test_a_real_conversion_draws_no_progress_bars(tmp_path, capfd):
    """transformers' "Loading weights" and "Writing model shards" bars filled a stderr that was a log
    file; the conversion's progress goes to the status line instead."""
    from tests.gguf_models import tiny, write_gguf

    path = write_gguf(tiny("llama", True), tmp_path / "tiny.gguf", "F32")
    said: list[str] = []
    convert.save_converted(path, tmp_path / "out", said.append)
    assert (tmp_path / "out" / "config.json").is_file() and said
    err = capfd.readouterr().err
    assert "it/s" not in err and "%|" not in err, err[-300:]


def test_a_metadata_folder_of_an_older_chatcli_is_made_again(tmp_path):
    """Its tokenizer's split and its verdict on reading the file directly may be out of date: a
    folder without this version's `metadata` mark is written again, not reused."""
    import json

    from tests.gguf_models import tiny, write_gguf

    path = write_gguf(tiny("llama", True), tmp_path / "tiny.gguf", "Q8_0")
    folder = convert.meta_folder(path)
    manifest = json.loads((folder / convert.MANIFEST).read_text())
    assert manifest["metadata"] == convert.METADATA and manifest["direct"] is None
    manifest.pop("metadata")
    manifest["direct"] = "architecture 'llama'"  # what an older chatcli might have said
    (folder / convert.MANIFEST).write_text(json.dumps(manifest))
    assert convert.recorded_direct_reason(convert.meta_folder(path)) is None
    assert json.loads((folder / convert.MANIFEST).read_text())["metadata"] == convert.METADATA
