"""A GGUF's header, config and tokenizer read by chatcli itself (gguf_file, gguf_meta).

The header reader must give what gguf's own `GGUFReader` gives (every key's value, every tensor's
type, shape and offset); the tokenizer built from the metadata the ids llama.cpp gives on the same
file (its split for each `tokenizer.ggml.pre`, its whole-word rule, its special tokens: ids
llama-cpp-python 0.3.36 gave, written in; `benchmarks/tokenizer_ids.py` compares with llama.cpp
itself) and the ids transformers' GGUF converter gives, on a multilingual text, a prompt and a chat;
the config the hyperparameters transformers reads.
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
    from tokenizers import Regex, pre_tokenizers
    from transformers import AutoTokenizer

    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    assert gguf_meta.save(GGUFFile(embedded), ours)
    converted = AutoTokenizer.from_pretrained(str(embedded.parent), gguf_file=embedded.name)
    # transformers splits a "smollm" file with GPT-2's regex alone; llama.cpp puts every digit apart
    # first (" ١٢٣" is " ", "١", ...): theirs gets llama.cpp's split, the rest is transformers' own
    converted.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"\p{N}"), "isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    converted.save_pretrained(theirs)
    a, b = FolderTokenizer(ours), FolderTokenizer(theirs)
    assert a.encode(TEXT) == b.encode(TEXT) and len(a.encode(TEXT)) > 50
    assert a.encode_prompt(TEXT) == b.encode_prompt(TEXT)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXT}]
    assert a.encode_chat(chat) == b.encode_chat(chat)
    ids = a.encode(TEXT)
    assert a.decode(ids) == b.decode(ids) and a.decode(ids, skip_special_tokens=False) == b.decode(ids, False)
    assert a.stop_ids == b.stop_ids and a.vocab_size == b.vocab_size


# A byte-level vocabulary small enough to read: the 256 bytes (id = the byte), then what the merges
# make (256 "Ġw" ... 269 "¿t"), a word no merge makes (270), then tokens matched whole: unknown,
# user-defined and control, two spelled outside the byte-level alphabet, as DeepSeek's are
MERGES = ["Ġ w", "o r", "l d", "Ġw or", "Ġ 1", "1 2", "3 4", "12 3", "4 5", "Ġ +", "' s", "i t", "' Å", "¿ t"]
WHOLE = [("Ġworld", 1), ("<unk>", 2), ("<think>", 4), ("x y", 4), ("<｜tool▁sep｜>", 4), ("<｜User｜>", 3)]
WHOLE += [("<|endoftext|>", 3)]
SPECIAL_TEXT = "<｜User｜>hi<think>x y<unk> <｜tool▁sep｜>it<|endoftext|>"
# (tokenizer.ggml.pre, None: no such key, text, the ids llama.cpp gives: llama-cpp-python 0.3.36,
# Llama(vocab_only=True).tokenize(text, add_bos=False, special=True) on `tiny_vocab_gguf(pre)`)
LLAMA_CPP_IDS = [
    ("gpt-2", "12345", [261, 262, 53]),
    ("gpt-2", " 12 a +b it's", [260, 50, 32, 97, 265, 98, 32, 267, 266]),
    # default: punctuation runs apart, then GPT-2's split, then numbers, then three digits at a time
    ("default", "12345", [263, 264]),
    ("default", " 12 a +b it's", [32, 261, 32, 97, 32, 43, 98, 32, 267, 39, 115]),
    (None, "12345 a +b", [263, 264, 32, 97, 32, 43, 98]),
    ("smollm", "12345 12 a +b", [49, 50, 51, 52, 53, 32, 49, 50, 32, 97, 265, 98]),  # every digit alone
    ("refact", "12345 12 a +b", [49, 50, 51, 52, 53, 32, 49, 50, 32, 97, 265, 98]),  # Granite 3.x's: smollm's split
    ("refact", "x'ſt x'St", [120, 39, 197, 269, 32, 120, 39, 83, 116]),
    ("qwen2", "12345 12", [49, 50, 51, 52, 53, 32, 49, 50]),
    ("llama-bpe", "12345 12", [263, 264, 32, 261]),
    # llama3's ignore_merges: a word that is a token is that token, whatever the merges make
    ("llama-bpe", "hello world", [104, 101, 108, 108, 111, 270]),
    ("llama3", " world", [270]),
    ("smaug-bpe", "hello world", [104, 101, 108, 108, 111, 259, 258]),
    ("qwen2", "hello world", [104, 101, 108, 108, 111, 259, 258]),
    # contractions are 's or 'S, no Unicode case folding: "'ſt" is one piece ("'Å" "¿t"), not "'ſ" "t"
    ("llama-bpe", "x'ſt x'St", [120, 268, 269, 32, 120, 39, 83, 116]),
    ("qwen2", "x'ſt", [120, 268, 269]),
    ("gpt-2", SPECIAL_TEXT, [275, 104, 105, 272, 273, 271, 32, 274, 267, 276]),
    ("qwen2", SPECIAL_TEXT, [275, 104, 105, 272, 273, 271, 32, 274, 267, 276]),
]


def tiny_vocab_gguf(path: Path, pre: str | None) -> Path:
    """A GGUF of `MERGES` and `WHOLE` whose `tokenizer.ggml.pre` is `pre` (None: no such key), with a
    llama's hyperparameters, no tensors (llama.cpp reads its vocabulary with vocab_only)."""
    from chatcli.engine.text.tokenize import byte_level

    spelling = {b: c for c, b in byte_level().items()}
    tokens, types = [spelling[b] for b in range(256)], [1] * 256
    for merge in MERGES:
        tokens.append(merge.replace(" ", ""))
        types.append(1)
    for token, kind in WHOLE:
        tokens.append(token)
        types.append(kind)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(("pre", "text", "ids"), LLAMA_CPP_IDS)
def test_the_tokenizer_gives_llama_cpps_ids(tmp_path, pre, text, ids):
    tok = gguf_meta.build_tokenizer(GGUFFile(tiny_vocab_gguf(tmp_path / "vocab.gguf", pre)))
    assert tok.encode(text, add_special_tokens=False).ids == ids
    assert tok.decode(ids, skip_special_tokens=False) == text


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
