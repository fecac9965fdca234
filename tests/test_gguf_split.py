"""A GGUF split into parts (`NAME-00001-of-0000N.gguf`, as llama.cpp's `llama-gguf-split` and gguf's writer
write them) loads and runs as one model from its first part (`weights.gguf_parts`): its header and tensors
are the unsplit file's, its greedy tokens the unsplit file's, its cache entries named by all its parts (a
part rewritten in place is converted again), and a later part or a part set with one missing is one line.
The files are a tiny random Llama of four layers as Q8_0, split by gguf's `split_max_tensors` into 3 parts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from chatcli.engine.load.build import load_engine
from chatcli.engine.load.options import LoadError, LoadOptions
from chatcli.engine.load.sources import resolve
from chatcli.engine.weights import gguf_convert
from chatcli.engine.weights.gguf_file import GGUFError, GGUFFile
from tests.gguf_models import write_gguf
from tests.gguf_runs import IDS
from tests.test_gguf_identity import DAY_AGO, llama
from tests.test_oneshot import one_error_line

CPU = LoadOptions(device="cpu", kv_dtype="float32")
PARTS = 3


@pytest.fixture(scope="module")
def model():
    return llama(layers=4)


@pytest.fixture(scope="module")
def files(model, tmp_path_factory) -> tuple[Path, Path]:
    """(the unsplit file, the split model's first part), each in a folder of its own."""
    top = tmp_path_factory.mktemp("split")
    (top / "whole").mkdir()
    (top / "split").mkdir()
    whole = write_gguf(model, top / "whole" / "tiny.gguf", "Q8_0")
    first = write_gguf(model, top / "split" / "tiny.gguf", "Q8_0", split_max_tensors=16)
    assert first.name == f"tiny-00001-of-0000{PARTS}.gguf"
    assert len(list(first.parent.iterdir())) == PARTS
    return whole, first


def split_copy(first: Path, where: Path) -> Path:
    """A copy of the split model's parts in `where` (the module's stay as they are); its first part."""
    where.mkdir(parents=True, exist_ok=True)
    for part in first.parent.iterdir():
        (where / part.name).write_bytes(part.read_bytes())
        os.utime(where / part.name, (DAY_AGO, DAY_AGO))
    return where / first.name


def greedy(engine, steps: int = 12) -> tuple[list[int], np.ndarray]:
    """The greedy tokens after a prefill of IDS, and the logits of every step: `[1 + steps, V]`."""
    runner = engine.runner
    cache = runner.new_cache()
    rows = [runner.verify(IDS, cache)[-1]]
    tokens = []
    for _ in range(steps):
        tokens.append(int(rows[-1].argmax()))
        rows.append(runner.verify([tokens[-1]], cache)[-1])
    return tokens, np.stack(rows)


def test_the_first_part_reads_as_the_unsplit_file(files):
    whole, first = (GGUFFile(p) for p in files)
    assert len({t.part for t in first.tensors.values()}) == PARTS  # every part holds some
    assert {k: v for k, v in first.fields.items() if not k.startswith("split.")}.keys() == whole.fields.keys()
    assert first.tensors.keys() == whole.tensors.keys()
    for name, t in whole.tensors.items():
        mine = first.tensors[name]
        assert (mine.shape, mine.type_name) == (t.shape, t.type_name)
        assert np.array_equal(first.read(mine, 0, mine.rows), whole.read(t, 0, t.rows)), name
    assert first.size > whole.size  # every part's bytes: three headers


def test_a_split_model_runs_token_for_token_as_its_unsplit_file(kernel, files, tmp_path, monkeypatch):
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    whole, first = files
    split = load_engine(str(first), CPU)
    unsplit = load_engine(str(whole), CPU)
    assert split.weights == unsplit.weights == "gguf Q8_0"  # its own blocks, on the kernel
    tokens, logits = greedy(split)
    want_tokens, want_logits = greedy(unsplit)
    assert tokens == want_tokens and np.array_equal(logits, want_logits)
    assert len(set(tokens)) > 1


def test_a_part_rewritten_in_place_is_converted_again(kernel, model, files, tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    first = split_copy(files[1], tmp_path / "model")
    before = greedy(load_engine(str(first), CPU))[1]
    entry = gguf_convert.meta_folder_for(first)
    other = llama(layers=4)
    torch.manual_seed(7)
    with torch.no_grad():
        for p in other.model.layers[3].mlp.parameters():
            p.copy_(torch.randn_like(p) * 4.0 * p.std())
    (tmp_path / "other").mkdir()
    changed = write_gguf(other, tmp_path / "other" / "tiny.gguf", "Q8_0", split_max_tensors=16)
    differ = [
        p.name for p in sorted(changed.parent.iterdir()) if p.read_bytes() != (first.parent / p.name).read_bytes()
    ]
    assert differ == [f"tiny-0000{PARTS}-of-0000{PARTS}.gguf"]  # the last part only: the first is as it was
    with open(first.parent / differ[0], "r+b") as f:  # the same inode and size
        f.write((changed.parent / differ[0]).read_bytes())
    os.utime(first.parent / differ[0], (DAY_AGO + 60, DAY_AGO + 60))

    after = greedy(load_engine(str(first), CPU))[1]
    assert gguf_convert.meta_folder_for(first) != entry and not entry.exists()  # the old bytes' entry: swept
    assert np.array_equal(after, greedy(load_engine(str(changed), CPU))[1]) and not np.allclose(before, after)


def test_a_later_part_or_a_missing_part_is_one_line(files, tmp_path):
    first = split_copy(files[1], tmp_path / "model")
    second = first.with_name(f"tiny-00002-of-0000{PARTS}.gguf")
    with pytest.raises(LoadError, match=f"tiny-00002-of-00003.gguf is part 2 of a model split into 3 files: run its "
                       f"first part, {first.name}"):  # fmt: skip
        resolve(str(second), True, lambda *_a: None)
    first.with_name(f"tiny-00003-of-0000{PARTS}.gguf").unlink()
    with pytest.raises(LoadError, match=r"part 3 \(tiny-00003-of-00003.gguf\) is missing from "):
        resolve(str(first), True, lambda *_a: None)
    with pytest.raises(GGUFError, match="tiny-00003-of-00003.gguf.*is missing"):
        GGUFFile(first)


def test_the_header_and_the_name_must_agree(files, tmp_path):
    first = split_copy(files[1], tmp_path / "model")
    renamed = first.rename(first.with_name("tiny.gguf"))  # a first part whose name lost its -00001-of-00003
    with pytest.raises(GGUFError, match="tiny.gguf: its header says it is part 1 of a model split into 3 files, but"):
        GGUFFile(renamed)
    whole = first.with_name(f"tiny-00002-of-0000{PARTS}.gguf")
    whole.write_bytes(files[0].read_bytes())  # an unsplit file in part 2's place
    first.with_name("tiny.gguf").rename(first)
    with pytest.raises(GGUFError, match="tiny-00002-of-00003.gguf: its header says it is not a part of a split model"):
        GGUFFile(first)


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "config.toml"), "CHATCLI_DATA_DIR": str(tmp_path / "data")}
    return subprocess.run([sys.executable, "-m", "chatcli", *args], capture_output=True, env=env, timeout=600,
                          stdin=subprocess.DEVNULL)  # fmt: skip


def test_from_the_command_line_the_first_part_answers_as_the_unsplit_file_and_a_missing_part_is_one_line(
    kernel, files, tmp_path
):
    first = split_copy(files[1], tmp_path / "model")
    ask = ("-p", "hi", "--temperature", "0", "--max-tokens", "8", "--json")
    split, whole = run_cli(tmp_path, "-m", str(first), *ask), run_cli(tmp_path, "-m", str(files[0]), *ask)
    assert split.returncode == whole.returncode == 0, split.stderr.decode() + whole.stderr.decode()
    assert json.loads(split.stdout)["reply"] == json.loads(whole.stdout)["reply"]
    later = run_cli(tmp_path, "-m", str(first.with_name("tiny-00002-of-00003.gguf")), "-p", "hi")
    assert later.returncode == 1 and "is part 2 of a model split into 3 files: run its first part" in one_error_line(
        later
    )
    first.with_name("tiny-00002-of-00003.gguf").unlink()
    missing = run_cli(tmp_path, "-m", str(first), "-p", "hi")
    assert missing.returncode == 1 and "part 2 (tiny-00002-of-00003.gguf) is missing" in one_error_line(missing)


@pytest.mark.parametrize("options", [{"runner": "hf"}, {"quantize": "none"}])
def test_a_split_model_through_transformers_is_one_line(files, tmp_path, monkeypatch, options):
    """transformers reads one file: given the first part it would read a third of the weights."""
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(LoadError, match="is split into 3 files, and only the compiled kernel reads a split model") as e:
        load_engine(str(files[1]), LoadOptions(device="cpu", kv_dtype="float32", **options))
    assert "\n" not in str(e.value) and not list((tmp_path / "cache" / "converted").glob("*"))  # nothing converted
