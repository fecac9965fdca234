"""A tiny model written as a GGUF and run on its own blocks (`gguf_lean` + the native runner): the checks
every block type's model tests share.

`direct_runner` writes the file and reads it directly; `computed` gives its logits over `IDS` (a
prefill, then decode steps) beside transformers' over the same weights put through each type's
quantization (`gguf_models.fake_quantized`); `assert_drafts_are_single_steps` holds a draft, and a
crop then the same ids again, to the bits of single steps (conftest's `build` runs a test on each kernel
build this CPU runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from chatcli.engine.runners.native import NativeRunner
from chatcli.engine.weights.gguf_file import GGUFFile
from chatcli.engine.weights.gguf_lean import convert_gguf_lean, direct_reason
from chatcli.engine.weights.lean_file import LeanWeights
from tests.gguf_models import fake_quantized, write_gguf

IDS = [1, 5, 17, 200, 3, 99, 42, 7, 300, 511, 2, 64]


def direct_runner(model, types, tmp_path, limit: int = 128, kv_dtype: str = "float32") -> NativeRunner:
    """The model written as a GGUF of `types` at tmp_path/model.gguf, read directly into
    tmp_path/gguf.safetensors, on the native runner (its KV cache in `kv_dtype`)."""
    path = write_gguf(model, tmp_path / "model.gguf", types)
    assert direct_reason(GGUFFile(path)) is None
    lean = tmp_path / "gguf.safetensors"
    convert_gguf_lean(path, lean, limit, "test")
    return NativeRunner(LeanWeights(lean, "gguf", "test"), kv_dtype=kv_dtype, threads=2)


@dataclass
class Computed:
    got: np.ndarray  # [S, V]: the runner's logits over IDS, a prefill of 8 then steps
    want: np.ndarray  # [S, V]: transformers' over the same weights as the file holds them
    types: set  # the tensor types the reference put the weights through


def computed(model, types, runner: NativeRunner) -> Computed:
    """The runner's logits beside the reference's; `model` is changed in place to the file's weights."""
    chosen = fake_quantized(model, types)
    with torch.no_grad():
        want = model(torch.tensor([IDS])).logits[0].numpy()  # [S, V]
    cache = runner.new_cache()
    got = np.concatenate([runner.verify(IDS[:8], cache), *(runner.verify([t], cache) for t in IDS[8:])])
    return Computed(got, want, set(chosen.values()))


def assert_close(c: Computed, tolerance: float = 0.04) -> None:
    """Within `tolerance` of the largest logit (int8 activations' rounding), the same argmax mostly."""
    scale = np.abs(c.want).max()
    assert np.abs(c.got - c.want).max() < tolerance * scale, (np.abs(c.got - c.want).max(), scale)
    assert (c.got.argmax(-1) == c.want.argmax(-1)).mean() >= 0.75


def assert_drafts_are_single_steps(runner: NativeRunner) -> None:
    one = runner.new_cache()
    steps = [runner.forward(IDS[:4], one)] + [runner.forward([t], one) for t in IDS[4:9]]
    other = runner.new_cache()
    runner.forward(IDS[:3], other)
    drafted = runner.verify(IDS[3:9], other)  # [6, V]
    assert all(np.array_equal(a, b) for a, b in zip(steps, drafted, strict=True))
    other.crop(5)  # a crop, then the same tokens again
    assert np.array_equal(runner.verify(IDS[5:9], other), drafted[2:])


def assert_near_the_files_size(tmp_path, types, kinds: set, bound: float) -> None:
    """A tiny llama written with `types` and read directly: its lean file holds the tensor types `kinds`,
    their blocks at most `bound` times the GGUF's 2-D tensors' bytes."""
    from tests.gguf_models import tiny

    direct_runner(tiny("llama", False), types, tmp_path)
    weights = LeanWeights(tmp_path / "gguf.safetensors", "gguf", "test")
    assert set(weights.config.types.split("+")) == kinds
    keys = ("w", "hi", "d", "m", "sc", "sm")
    blocks = sum(i.nbytes for n, i in weights.file.tensors.items() if n.split(".")[-1] in keys)
    in_file = sum(t.n_bytes for t in GGUFFile(tmp_path / "model.gguf").tensors.values() if len(t.shape) == 2)
    assert blocks <= bound * in_file, blocks / in_file
