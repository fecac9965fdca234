"""A GGUF's cache entries are named by its bytes, never by its name and header (issue 51).

Two files of one name, shapes and types (so the same size and header) but other weights: the second
used to land on the first's entry, and once the first was gone, on a dequantized `float32-panels`
copy without a word. The files here are tiny Llamas of eight layers written as Q4_0, the second the
first with its layer 3 drawn again: equal in size, in their first and last MiB (what the old key
hashed), unequal in the middle. Each file gets its own entry and its own blocks (the logits of its
own `gguf` lean file); a file rewritten in place is converted again; an entry whose file is gone is
swept; a quantized GGUF run dequantized says so in one line; the identity is hashed once.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from chatcli.engine.load.build import load_engine
from chatcli.engine.load.options import LoadOptions
from chatcli.engine.weights import gguf_convert
from tests.gguf_models import write_gguf
from tests.gguf_runs import IDS

CPU = LoadOptions(device="cpu", kv_dtype="float32")  # the cache `own_blocks` keeps: logits compare exactly
MIB = 1 << 20
DAY_AGO = 1_700_000_000  # an mtime long past: the identity index records files this old


def llama(layers: int = 8):
    import transformers as t

    config = t.LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = t.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    return model.eval()


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """DIR1/big.gguf and DIR2/big.gguf: one header, one size, one first and last MiB; other weights."""
    top = tmp_path_factory.mktemp("pair")
    a = llama()
    b = copy.deepcopy(a)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in b.model.layers[3].parameters():
            if p.dim() > 1:
                p.copy_(4.0 * torch.randn_like(p) * p.std() / 4.0)
    (top / "DIR1").mkdir()
    (top / "DIR2").mkdir()
    first, second = write_gguf(a, top / "DIR1" / "big.gguf", "Q4_0"), write_gguf(b, top / "DIR2" / "big.gguf", "Q4_0")
    one, two = first.read_bytes(), second.read_bytes()
    assert len(one) == len(two) > 2 * MIB and one != two
    assert one[:MIB] == two[:MIB] and one[-MIB:] == two[-MIB:]  # what the key was made of
    return first, second


@pytest.fixture
def own_cache(kernel, tmp_path, monkeypatch) -> Path:
    """A cache of this test's own (the kernel, loaded from the session's, stays loaded)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(cache))
    return cache


def logits(engine) -> np.ndarray:
    runner = engine.runner
    return runner.verify(IDS[:6], runner.new_cache())


def own_blocks(path: Path, tmp_path: Path) -> np.ndarray:
    """The file's logits from its own blocks, read directly (no cache)."""
    from chatcli.engine.runners.native import NativeRunner
    from chatcli.engine.weights.gguf_lean import convert_gguf_lean
    from chatcli.engine.weights.lean_file import LeanWeights

    lean = tmp_path / f"own-{path.parent.name}.safetensors"
    convert_gguf_lean(path, lean, 128, "own")
    runner = NativeRunner(LeanWeights(lean, "gguf", "own"))
    return runner.verify(IDS[:6], runner.new_cache())


def copy_of(pair_file: Path, where: Path) -> Path:
    """A copy of one of the pair at `where` (the pair is the module's), with an mtime long past."""
    where.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pair_file, where)
    os.utime(where, (DAY_AGO, DAY_AGO))
    return where


def test_two_files_of_one_header_get_their_own_entries_and_blocks(own_cache, pair, tmp_path):
    one = copy_of(pair[0], tmp_path / "DIR1" / "big.gguf")
    two = copy_of(pair[1], tmp_path / "DIR2" / "big.gguf")
    want_one, want_two = own_blocks(one, tmp_path), own_blocks(two, tmp_path)
    first = load_engine(str(one), CPU)
    assert first.weights == "gguf Q4_0" and not getattr(first, "note", "")
    assert np.array_equal(logits(first), want_one)
    first_entry = gguf_convert.meta_folder_for(one)
    shutil.rmtree(one.parent)  # the issue's `rm -r DIR1`

    second = load_engine(str(two), CPU)
    assert second.weights == "gguf Q4_0" and not getattr(second, "note", "")  # its blocks, not float32-panels
    assert np.array_equal(logits(second), want_two) and not np.allclose(want_one, want_two)
    assert gguf_convert.meta_folder_for(two) != first_entry
    assert [p.name for p in (own_cache / "gguf").iterdir()] == [gguf_convert.meta_folder_for(two).name]
    assert not (own_cache / "converted").exists()  # no dequantized copy was made


@pytest.mark.parametrize("how", ["in place", "renamed over"])
def test_a_file_replaced_with_other_weights_is_converted_again(own_cache, pair, tmp_path, how):
    path = copy_of(pair[0], tmp_path / "model.gguf")
    assert np.array_equal(logits(load_engine(str(path), CPU)), own_blocks(pair[0], tmp_path))
    if how == "in place":  # the same inode and size
        with open(path, "r+b") as f:
            f.write(pair[1].read_bytes())
    else:
        os.replace(copy_of(pair[1], tmp_path / "new" / "model.gguf"), path)
    os.utime(path, (DAY_AGO + 60, DAY_AGO + 60))
    again = load_engine(str(path), CPU)
    assert again.weights == "gguf Q4_0"
    assert np.array_equal(logits(again), own_blocks(pair[1], tmp_path))
    assert len(list((own_cache / "gguf").iterdir())) == 1  # the first bytes' entry is swept: its file changed


def test_entries_whose_file_is_gone_or_inconsistent_are_swept(own_cache, pair, tmp_path):
    from chatcli.engine import verify_model_files

    gone = copy_of(pair[0], tmp_path / "gone" / "big.gguf")
    load_engine(str(gone), CPU)
    entry = gguf_convert.meta_folder_for(gone)
    lean = [p for p in (own_cache / "lean").iterdir() if p.name.startswith(entry.name)]
    assert entry.is_dir() and lean
    shutil.rmtree(gone.parent)
    broken = own_cache / "converted" / "other-0123456789abcdef"  # a folder whose manifest cannot be read
    broken.mkdir(parents=True)
    (broken / gguf_convert.MANIFEST).write_text("{not json")
    (broken / "model.safetensors").write_bytes(b"w" * 4096)

    kept = copy_of(pair[1], tmp_path / "kept" / "big.gguf")
    verify_model_files(str(kept))  # `pull --verify` sweeps first, as a start does
    assert not entry.exists() and not any(p.exists() for p in lean) and not broken.exists()


def test_a_quantized_gguf_run_dequantized_says_why_in_one_line(own_cache, pair, tmp_path):
    path = copy_of(pair[0], tmp_path / "big.gguf")
    torch_runner = load_engine(str(path), CPU, kernel=False)
    assert torch_runner.weights == "float32-dense"
    note = torch_runner.note
    assert "Q4_0" in note and "float32-dense" in note and "--quantize none" in note and "\n" not in note
    asked = load_engine(str(path), LoadOptions(device="cpu", quantize="none"))
    assert asked.weights == "float32-panels" and asked.note == ""  # asked for: nothing to say


def test_the_one_shot_says_it_on_stderr_and_names_the_weights_in_json(pair, tmp_path):
    env = {**os.environ, "CHATCLI_KERNEL": "off", "CHATCLI_CACHE_DIR": str(tmp_path / "cache")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    path = copy_of(pair[0], tmp_path / "big.gguf")
    done = subprocess.run(
        [sys.executable, "-m", "chatcli", "-m", str(path), "-p", "Hi", "--max-tokens", "1", "--json", "--no-save"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["weights"] == "float32-dense"
    warnings = [line for line in done.stderr.splitlines() if line.startswith("chatcli: warning:")]
    assert len(warnings) == 1 and "Q4_0" in warnings[0] and "CHATCLI_KERNEL=off" in warnings[0], done.stderr


def test_the_identity_is_hashed_once_and_remembered_across_starts(tmp_path, monkeypatch):
    from chatcli.engine.weights import identity as ident

    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "x.gguf"
    path.write_bytes(os.urandom(3 * MIB))
    os.utime(path, (DAY_AGO, DAY_AGO))
    digest = ident.identity(path)
    hashed = []
    monkeypatch.setattr(ident, "_seen", {})  # a new process
    monkeypatch.setattr(ident, "file_digest", lambda p: hashed.append(p) or "rehashed")
    assert ident.identity(path) == digest and hashed == []
    with open(path, "r+b") as f:  # other bytes, the size kept, a new mtime
        f.write(b"other")
    os.utime(path, (DAY_AGO + 1, DAY_AGO + 1))
    assert ident.identity(path) == "rehashed" and hashed == [path]


def test_a_new_file_on_a_removed_ones_inode_with_its_size_and_mtime_is_hashed_again(tmp_path, monkeypatch):
    """The filesystem hands a removed file's inode to the next file it makes, and a copy can carry the old
    one's size and mtime (this module's `copy_of`, `cp -p`): its ctime is new, so it is not taken for the old."""
    from chatcli.engine.weights import identity as ident

    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "x.gguf"
    path.write_bytes(os.urandom(3 * MIB))
    os.utime(path, (DAY_AGO, DAY_AGO))
    old = ident.identity(path)
    was = path.stat()
    real_stat = Path.stat

    def reused(self, *args, **kwargs):  # the next file's stat: the old inode, size and mtime, a new ctime
        st = real_stat(self, *args, **kwargs)
        if self.name != "new.gguf":
            return st
        fields = list(st)
        fields[1], fields[2], fields[6], fields[8] = was.st_ino, was.st_dev, was.st_size, int(DAY_AGO)
        return os.stat_result(fields, {"st_mtime_ns": was.st_mtime_ns, "st_ctime_ns": was.st_ctime_ns + 10**9})

    new = tmp_path / "new.gguf"
    new.write_bytes(os.urandom(3 * MIB))
    monkeypatch.setattr(Path, "stat", reused)
    assert ident.stat_key(new.stat()) != ident.stat_key(was)  # (only the ctime tells them apart)
    assert ident.known(new) is None and ident.identity(new) != old
    monkeypatch.setattr(ident, "_seen", {})  # a new process: the index alone
    assert ident.identity(new) != old


def test_a_file_still_being_written_is_not_remembered(tmp_path, monkeypatch):
    """Its mtime within RACY_S of the hash: a write in the same timestamp tick would keep the stat."""
    from chatcli.engine.weights import identity as ident

    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "fresh.gguf"
    path.write_bytes(os.urandom(4096))
    ident.identity(path)
    monkeypatch.setattr(ident, "_seen", {})
    assert ident.known(path) is None
