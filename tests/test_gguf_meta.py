"""A GGUF's header, config and tokenizer read by chatcli itself (gguf_file, gguf_meta).

The header reader must give what gguf's own `GGUFReader` gives (every key's value, every tensor's
type, shape and offset); the tokenizer built from the metadata the ids transformers' GGUF converter
gives, on a multilingual text, a prompt and a chat; the config the hyperparameters transformers reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatcli.engine.text.tokenize import FolderTokenizer
from chatcli.engine.weights import gguf_meta
from chatcli.engine.weights.gguf_file import GGUFError, GGUFFile

gguf = pytest.importorskip("gguf")

TEXT = (
    "Hello, world! Ça va? 日本語のテキスト 12345 6789012 don't  I'LL <|im_start|>user\n😀 ünïcödé\t\ttabs   "
    "spaces <|endoftext|> Привет, мир! 你好，世界 ١٢٣ émoji👍🏽 x=a_b+c;\r\n  indented\n\n\nend"
)


@pytest.fixture(scope="module")
def embedded():
    from tests.conftest import embedded_path

    return Path(embedded_path())


def test_the_header_is_what_ggufs_reader_reads(embedded):
    mine, theirs = GGUFFile(embedded), gguf.GGUFReader(str(embedded))
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        value, got = field.contents(), mine.fields[key]
        assert (list(value) == list(got)) if isinstance(value, list) else value == got, key
    assert len(mine.tensors) == len(theirs.tensors)
    for t in theirs.tensors:
        ours = mine.tensors[t.name]
        assert (ours.type_name, ours.offset, ours.n_bytes) == (t.tensor_type.name, t.data_offset, t.n_bytes)
        assert ours.shape == tuple(int(d) for d in t.shape)


def test_a_cut_file_is_one_clear_error(embedded, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(embedded.read_bytes()[: 1 << 20])
    with pytest.raises(GGUFError, match="truncated"):
        GGUFFile(cut)
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(GGUFError, match="not a GGUF"):
        GGUFFile(tmp_path / "not.gguf")


def test_the_tokenizer_gives_transformers_ids(embedded, tmp_path):
    from transformers import AutoTokenizer

    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    assert gguf_meta.save(GGUFFile(embedded), ours)
    AutoTokenizer.from_pretrained(str(embedded.parent), gguf_file=embedded.name).save_pretrained(theirs)
    a, b = FolderTokenizer(ours), FolderTokenizer(theirs)
    assert a.encode(TEXT) == b.encode(TEXT) and len(a.encode(TEXT)) > 50
    assert a.encode_prompt(TEXT) == b.encode_prompt(TEXT)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXT}]
    assert a.encode_chat(chat) == b.encode_chat(chat)
    ids = a.encode(TEXT)
    assert a.decode(ids) == b.decode(ids) and a.decode(ids, skip_special_tokens=False) == b.decode(ids, False)
    assert a.stop_ids == b.stop_ids and a.vocab_size == b.vocab_size


def test_the_config_has_the_hyperparameters_transformers_reads(embedded, tmp_path):
    from transformers import AutoConfig

    assert gguf_meta.save(GGUFFile(embedded), tmp_path)
    ours = json.loads((tmp_path / "config.json").read_text())
    theirs = AutoConfig.from_pretrained(str(embedded.parent), gguf_file=embedded.name)
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "vocab_size", "tie_word_embeddings",
                "bos_token_id", "eos_token_id"):  # fmt: skip
        assert ours[key] == getattr(theirs, key), key
    assert ours["rms_norm_eps"] == pytest.approx(theirs.rms_norm_eps, rel=1e-12)
    assert ours["rope_theta"] == theirs.rope_parameters["rope_theta"]


def test_a_tokenizer_it_does_not_know_is_left_to_transformers(tmp_path):
    path = tmp_path / "sp.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")  # SentencePiece
    w.add_token_list(["<unk>", "<s>", "</s>", "▁a"])
    w.add_tensor("token_embd.weight", gguf.np.zeros((4, 32), dtype=gguf.np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert gguf_meta.save(GGUFFile(path), tmp_path) is False
    assert not (tmp_path / "tokenizer.json").exists()
