"""A GGUF chatcli does not run is refused from the first bytes of its header, in one line, at once
(`engine.load.refuse`); `--runner hf` still hands it to transformers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chatcli.engine.load.options import LoadError
from chatcli.engine.load.refuse import check_gguf, header_architecture
from tests.test_oneshot import one_error_line


def write_header(path: Path, arch: str) -> Path:
    """A small GGUF of `arch`: a header and one tensor, as llama.cpp's writer lays them out."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_an_architecture_chatcli_does_not_run_is_refused_unless_transformers_is_asked(tmp_path):
    for arch in ("gpt-oss", "mamba", "rwkv6", "llama", "gemma3", "qwen3moe"):
        assert header_architecture(write_header(tmp_path / f"{arch}.gguf", arch)) == arch
    for arch in ("mamba", "rwkv6"):
        with pytest.raises(LoadError, match=f"architecture '{arch}' does not run in chatcli .it runs GGUFs of llama"):
            check_gguf(tmp_path / f"{arch}.gguf")
        check_gguf(tmp_path / f"{arch}.gguf", runner="hf")  # transformers is tried, on purpose
    check_gguf(tmp_path / "llama.gguf")
    check_gguf(tmp_path / "gemma3.gguf")
    check_gguf(tmp_path / "qwen3moe.gguf")  # a mixture of experts runs on the kernel (test_gguf_moe)
    check_gguf(tmp_path / "gpt-oss.gguf")  # and gpt-oss (test_gguf_gptoss)
    (tmp_path / "noise.gguf").write_bytes(b"not a gguf at all")
    assert header_architecture(tmp_path / "noise.gguf") is None  # the loader says what it is, as before


def test_a_mamba_gguf_is_one_line_at_once_from_the_command_line(tmp_path):
    """A GGUF of an architecture chatcli does not run went to transformers' GGUF converter, which ended
    after seconds to minutes with its own text (for a real Qwen3-MoE file, before it ran here:
    `You set ignore_mismatched_sizes to False…`)."""
    path = write_header(tmp_path / "moe.gguf", "mamba")
    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "config.toml"), "CHATCLI_DATA_DIR": str(tmp_path / "data")}
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "chatcli", "-m", str(path), "-p", "hi"], capture_output=True,
                            env=env, timeout=300, stdin=subprocess.DEVNULL)  # fmt: skip
    assert result.returncode == 1
    line = one_error_line(result)
    assert "moe.gguf: architecture 'mamba' does not run in chatcli" in line and "qwen3, qwen3moe" in line
    assert "--runner hf" in line
    assert time.monotonic() - began < 30  # the interpreter's start; nothing is converted
