"""A tokenizer a first start has just built and written (`text.built`) is taken as it is by the FolderTokenizer that
follows, once, and only while its file is the one written."""

from __future__ import annotations

import json

from tokenizers import Tokenizer, models, pre_tokenizers

from chatcli.engine.text.built import keep_built
from chatcli.engine.text.tokenize import FolderTokenizer


def saved(folder, extra: dict | None = None):
    tok = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2, **(extra or {})}, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"clean_up_tokenization_spaces": False}))
    return tok


def test_a_kept_tokenizer_is_taken_once_and_reads_the_same(tmp_path):
    tok = saved(tmp_path / "model")
    keep_built(tmp_path / "model" / "tokenizer.json", tok)
    first = FolderTokenizer(tmp_path / "model")
    assert first.backend is tok
    second = FolderTokenizer(tmp_path / "model")
    assert second.backend is not tok
    assert second.backend.encode("ab a").ids == first.backend.encode("ab a").ids == [2, 0]


def test_a_file_written_again_is_read_not_taken(tmp_path):
    tok = saved(tmp_path / "model")
    keep_built(tmp_path / "model" / "tokenizer.json", tok)
    (tmp_path / "model" / "tokenizer.json").unlink()
    saved(tmp_path / "model", {"c": 3})  # another file in its place
    assert FolderTokenizer(tmp_path / "model").backend is not tok
