"""`chatcli models` and `chatcli rm` for GGUF files used by their path (`-m PATH`): chatcli holds only the
cache it made from them, listed with its size and removed by that path; the file itself is never removed."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from chatcli.engine.load import library
from chatcli.engine.load.options import LoadError
from tests.test_hub import fake_hub, gguf_bytes  # noqa: F401 - the fixture, used by name

pytestmark = pytest.mark.usefixtures("fake_hub")


def converted(tmp_path, name: str, seed: int = 0, types="Q8_0"):
    """A tiny Llama's GGUF at tmp_path/models/NAME whose metadata folder chatcli made (as a start does), and a lean
    folder made from that folder (3 MiB of weights); (the file, its folders)."""
    from chatcli.engine.weights.gguf_convert import meta_folder
    from chatcli.engine.weights.lean_file import SOURCE_FILE
    from chatcli.paths import cache_dir
    from tests.gguf_models import tiny, write_gguf

    path = tmp_path / "models" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(tiny("llama", False, seed=seed), path, types)
    meta = meta_folder(path)
    lean = cache_dir() / "lean" / f"{meta.name}-0123abcd"
    lean.mkdir(parents=True)
    (lean / SOURCE_FILE).write_text(str(meta.resolve()))
    (lean / "weights.safetensors").write_bytes(os.urandom(3 << 20))
    return path, [meta, lean]


def folder_bytes(folders) -> int:
    return sum(p.stat().st_size for folder in folders for p in folder.rglob("*") if p.is_file())


def test_a_file_used_by_its_path_is_listed_with_its_cache(tmp_path):
    path, folders = converted(tmp_path, "mine.Q8_0.gguf")
    from tests.gguf_models import Q4_K_M

    other, _ = converted(tmp_path, "other.gguf", seed=1, types=Q4_K_M)  # no tag in its name: its header's
    listed = {e.name: e for e in library.local_models()}
    entry = listed[str(path)]
    assert entry.local and entry.repo is None and entry.path == str(path) and entry.file == "mine.Q8_0.gguf"
    assert (entry.size, entry.quant, entry.architecture) == (path.stat().st_size, "Q8_0", "llama")
    assert entry.cache == folder_bytes(folders) > 3 << 20
    assert listed[str(other)].local and listed[str(other)].quant == "Q4_K_M" and not listed["default"].local
    assert str(path) in library.model_names()  # /model completes it

    out = CliRunner().invoke(library_cli("models"), [])
    row = next(line for line in out.output.splitlines() if line.startswith(str(path)))
    assert "mine.Q8_0.gguf" in row and "Q8_0" in row and f"{entry.context:,}" in row and "3 MiB" in row
    assert json.loads(CliRunner().invoke(library_cli("models"), ["--json"]).output)[-1]["cache"] > 0


def test_a_file_chatcli_holds_no_cache_of_is_not_listed(tmp_path):
    """Its folder gone (swept, removed), or the file's bytes changed since (its identity, remembered anew, is not
    the folder's): nothing of the cache is the file's."""
    from chatcli.engine.weights.identity import identity

    gone, folders = converted(tmp_path, "gone.gguf")
    for folder in folders:
        for p in sorted(folder.rglob("*"), reverse=True):
            p.unlink()
        folder.rmdir()
    changed, _ = converted(tmp_path, "changed.gguf", seed=2)
    changed.write_bytes(gguf_bytes("llama", 512, seed=3))  # not a model: only its identity matters here
    identity(changed)  # a start of the changed file remembers its new identity
    names = {e.name for e in library.local_models()}
    assert str(gone) not in names and str(changed) not in names


def test_rm_by_path_removes_the_cache_and_keeps_the_file(tmp_path):
    path, folders = converted(tmp_path, "keep.gguf")
    kept, kept_folders = converted(tmp_path, "kept.gguf", seed=1)
    before = path.read_bytes()
    out = CliRunner().invoke(library_cli("rm"), [str(path)])
    assert out.exit_code == 0, out.output
    assert out.output.startswith(f"removed chatcli's cache of {path}: 2 folders (") and "the file stays" in out.output
    assert path.read_bytes() == before and not any(f.exists() for f in folders)
    assert all(f.exists() for f in kept_folders) and str(kept) in {e.name for e in library.local_models()}
    with pytest.raises(LoadError, match="holds no cache made from this file"):
        library.remove_model(str(path))
    again = CliRunner().invoke(library_cli("rm"), [str(path)])  # the UserError: chatcli's main prints its one line
    assert "never removes the file itself" in str(again.exception) and path.exists()


def library_cli(name: str):
    from chatcli.models import models_command, rm_command

    return {"models": models_command, "rm": rm_command}[name]


def test_a_split_file_used_by_its_path_is_listed_once_with_every_parts_size(tmp_path):
    from chatcli.engine.weights.gguf_convert import meta_folder
    from tests.gguf_models import tiny, write_gguf

    (tmp_path / "models").mkdir()
    first = write_gguf(tiny("llama", False, seed=4), tmp_path / "models" / "split.gguf", "Q8_0", split_max_tensors=4)
    parts = sorted(first.parent.glob("split-*.gguf"))
    assert len(parts) > 1 and first == parts[0]
    meta_folder(first)
    (entry,) = [e for e in library.local_models() if e.local and e.path.startswith(str(tmp_path))]  # not a part
    assert entry.name == str(first) and entry.files == tuple(p.name for p in parts)
    assert entry.size == sum(p.stat().st_size for p in parts) > first.stat().st_size
    out = CliRunner().invoke(library_cli("models"), [])
    assert f"(+{len(parts) - 1} more parts)" in out.output
