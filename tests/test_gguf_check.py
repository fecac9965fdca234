"""Crafted GGUFs (`gguf_check`): each refused in one line naming the field and its value, before any weight is read.

Each file is a tiny llama's F32 GGUF written again with one field or tensor changed (`rewrite_gguf`):
zero dims and heads, a block count of 10^6, an architecture that is a number, a NaN epsilon, a
negative rope base, a shape the dims do not give. The one-shot (`chatcli -m bad.gguf -p hi`) says
one line and exits non-zero; in process, the load fails with that line while reading a tensor's
bytes would fail the test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from chatcli.engine import LoadError
from chatcli.engine.load.build import load_engine
from chatcli.engine.weights.gguf_check import check_header
from chatcli.engine.weights.gguf_file import GGUFError, GGUFFile
from tests.gguf_models import rewrite_gguf, tiny, write_gguf

gguf = pytest.importorskip("gguf")
T = gguf.GGUFValueType

# name: (what changes, the line's expected words)
CASES = {
    "zero heads": (
        {"fields": {"llama.attention.head_count": (0, T.UINT32)}},
        "llama.attention.head_count is 0, not a whole number above 0",
    ),
    "zero width": (
        {"fields": {"llama.embedding_length": (0, T.UINT32)}},
        "llama.embedding_length is 0, not a whole number above 0",
    ),
    "a million blocks": (
        {"fields": {"llama.block_count": (1_000_000, T.UINT32)}},
        "llama.block_count is 1000000 but the file has tensors for 2 blocks",
    ),
    "a block missing": (
        {"fields": {"llama.block_count": (3, T.UINT32)}},
        "llama.block_count is 3 but the file has tensors for 2 blocks",
    ),
    "architecture a number": (
        {"fields": {"general.architecture": (5, T.UINT32)}},
        "general.architecture is 5, not an architecture's name",
    ),
    "NaN epsilon": (
        {"fields": {"llama.attention.layer_norm_rms_epsilon": (float("nan"), T.FLOAT32)}},
        "llama.attention.layer_norm_rms_epsilon is nan, not a finite number above 0",
    ),
    "negative rope base": (
        {"fields": {"llama.rope.freq_base": (-10000.0, T.FLOAT32)}},
        "llama.rope.freq_base is -10000.0, not a finite number above 0",
    ),
    "context a string": (
        {"fields": {"llama.context_length": ("long", T.STRING)}},
        "llama.context_length is 'long', not a whole number above 0",
    ),
    "heads not in groups": (
        {"fields": {"llama.attention.head_count_kv": (3, T.UINT32)}},
        "llama.attention.head_count 4 is not a multiple of llama.attention.head_count_kv 3",
    ),
    "a shape the dims do not give": (
        {"tensors": {"blk.1.attn_q.weight": np.zeros((128, 256), np.float32)}},
        "blk.1.attn_q.weight is [256, 128] but llama.embedding_length 256 and llama.attention.head_count 4 x "
        "head dim 64 make it [256, 256]",
    ),
    "a zero dimension": (
        {"tensors": {"blk.0.attn_norm.weight": np.zeros((0,), np.float32)}},
        "blk.0.attn_norm.weight has dimensions [0]: each must be above 0",
    ),
    "a longer vocabulary than the embedding": (
        {"tensors": {"token_embd.weight": np.zeros((300, 256), np.float32)}},
        "tokenizer.ggml.tokens holds 512 tokens but token_embd.weight has 300 rows",
    ),
}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_gguf(tiny("llama", False), tmp_path_factory.mktemp("gguf") / "good.gguf")


def crafted(source, tmp_path, case: str):
    change, line = CASES[case]
    return rewrite_gguf(source, tmp_path / "bad.gguf", **change), line


def test_the_files_written_here_pass(source):
    check_header(GGUFFile(source))


@pytest.mark.parametrize("case", list(CASES))
def test_a_crafted_file_is_one_line_before_any_weight_is_read(source, tmp_path, monkeypatch, case):
    path, line = crafted(source, tmp_path, case)
    with pytest.raises(GGUFError, match="^bad GGUF: ") as caught:
        check_header(GGUFFile(path))
    assert str(caught.value) == f"bad GGUF: {line}"

    def read(*_a, **_k):
        raise AssertionError("a weight was read")

    monkeypatch.setattr(GGUFFile, "read", read)
    monkeypatch.setattr(GGUFFile, "vector", read)
    with pytest.raises(LoadError) as loading:
        load_engine(str(path))
    assert str(loading.value) == f"could not load model {path}: bad GGUF: {line}"


@pytest.mark.parametrize("case", ["a million blocks", "NaN epsilon", "architecture a number", "zero heads"])
def test_the_one_shot_says_one_line(source, tmp_path, case):
    path, line = crafted(source, tmp_path, case)
    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "config.toml"), "CHATCLI_DATA_DIR": str(tmp_path / "data")}
    argv = [sys.executable, "-m", "chatcli", "-m", str(path), "-p", "hi", "--max-tokens", "4"]
    result = subprocess.run(argv, capture_output=True, env=env, timeout=60)  # the file fails fast: seconds
    err = result.stderr.decode()
    assert result.returncode != 0 and "Traceback" not in err, err
    assert err.strip() == f"chatcli: error: could not load model {path}: bad GGUF: {line}"
    assert result.stdout == b""


def test_the_transformers_path_is_checked_too(source, tmp_path):
    from chatcli.engine import LoadOptions

    path, line = crafted(source, tmp_path, "negative rope base")
    with pytest.raises(LoadError, match=f"bad GGUF: {line}"):
        load_engine(str(path), LoadOptions(runner="hf"))


# a mixture of experts' fields and tensors (a tiny qwen3moe: eight experts of 256, two a token)
MOE_CASES = {
    "more experts a token than there are": (
        {"fields": {"qwen3moe.expert_used_count": (9, T.UINT32)}},
        "qwen3moe.expert_used_count is 9: a token takes 1 to qwen3moe.expert_count 8 experts",
    ),
    "no experts a token": (
        {"fields": {"qwen3moe.expert_used_count": (0, T.UINT32)}},
        "qwen3moe.expert_used_count is 0, not a whole number above 0",
    ),
    "a router of other experts": (
        {"tensors": {"blk.0.ffn_gate_inp.weight": np.zeros((6, 256), np.float32)}},
        "blk.0.ffn_gate_inp.weight is [256, 6] but qwen3moe.embedding_length 256 and qwen3moe.expert_count 8 "
        "make it [256, 8]",
    ),
    "experts of another width": (
        {"tensors": {"blk.1.ffn_down_exps.weight": np.zeros((8, 256, 128), np.float32)}},
        "blk.1.ffn_down_exps.weight is [128, 256, 8] but qwen3moe.embedding_length 256, "
        "qwen3moe.expert_feed_forward_length 256 and qwen3moe.expert_count 8 make it [256, 256, 8]",
    ),
}


@pytest.mark.parametrize("case", list(MOE_CASES))
def test_a_crafted_mixture_of_experts_is_one_line(tmp_path_factory, tmp_path, case):
    source = write_gguf(tiny("qwen3_moe", False), tmp_path_factory.mktemp("moe") / "good.gguf")
    check_header(GGUFFile(source))
    change, line = MOE_CASES[case]
    with pytest.raises(GGUFError) as caught:
        check_header(GGUFFile(rewrite_gguf(source, tmp_path / "bad.gguf", **change)))
    assert str(caught.value) == f"bad GGUF: {line}"
