"""A model folder's safetensors converted a block at a time (`weights.lean_stream`).

For every lean family, saved in bf16 and in fp32, and every kind that streams, the streamed file holds
the tensors (names, dtypes, shapes, bytes) and the config today's whole-model path (`convert_lean`)
writes, with blocks of one panel so that every projection, the head and the embedding take several
(the last one short). The streamed path never builds a loaded transformers model, reads no tensor
whole past a block, and holds two blocks at most; `lean_weights` takes it where it can and the
whole model where it cannot (int8, a model given by the caller).
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch

from chatcli.engine.load.lean import lean_weights
from chatcli.engine.weights import lean_stream
from chatcli.engine.weights.lean_convert import _load, convert_lean
from chatcli.engine.weights.lean_file import PANEL, LeanWeights
from chatcli.engine.weights.lean_stream import Checkpoint, convert_streamed
from chatcli.engine.weights.tensorfile import MappedTensors
from tests.tiny import build_family, build_tokenizer

FAMILIES = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "phi3-longrope",
    "gemma2",
    "gemma3_text",
    "smollm3",
    "granite",
]
FAMILIES += ["olmo2"]
KINDS = ["float32-panels", "q4", "q8", "float32-dense", "bfloat16-dense", "float16-dense"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def save(family: str, dtype: torch.dtype, folder, tokenizer, **kw):
    """A tiny random model of `family` saved as a hub folder (config, safetensors, tokenizer) in `dtype`."""
    model = build_family(family, len(tokenizer))
    model.to(dtype).save_pretrained(folder, **kw)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def one_panel_blocks(monkeypatch):
    """Blocks of one panel (64 outputs): every tensor of a tiny model in several blocks."""
    monkeypatch.setattr(lean_stream, "CHUNK_BYTES", 1)


def same_tensors(old, new) -> None:
    a, b = MappedTensors(old), MappedTensors(new)
    assert a.metadata["chatcli"] == b.metadata["chatcli"]
    assert sorted(a.tensors) == sorted(b.tensors)
    for name in a.tensors:
        x, y = a.array(name), b.array(name)
        assert (x.dtype, x.shape) == (y.dtype, y.shape), name
        assert x.tobytes() == y.tobytes(), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("family", FAMILIES)
def test_each_kind_streams_the_bytes_the_whole_model_path_writes(family, dtype, tokenizer, tmp_path, one_panel_blocks):
    folder = save(family, dtype, tmp_path / "model", tokenizer)
    loaded = _load(folder)  # today's path: the whole model, loaded once for every kind
    for kind in KINDS:
        old, new = tmp_path / f"old-{kind}.safetensors", tmp_path / f"new-{kind}.safetensors"
        convert_lean(folder, old, kind, "test", model_loader=lambda: loaded)
        assert convert_streamed(folder, new, kind, "test")
        same_tensors(old, new)
        LeanWeights(new, kind, "test")  # and it opens: every tensor the config implies, in its shape


def test_a_sharded_folder_streams_from_its_index(tokenizer, tmp_path, one_panel_blocks):
    folder = save("qwen3", torch.bfloat16, tmp_path / "model", tokenizer, max_shard_size="40KB")
    assert (folder / "model.safetensors.index.json").is_file() and not (folder / "model.safetensors").exists()
    assert len(list(folder.glob("*.safetensors"))) > 2
    old, new = tmp_path / "old.safetensors", tmp_path / "new.safetensors"
    convert_lean(folder, old, "float32-panels", "test")
    assert convert_streamed(folder, new, "float32-panels", "test")
    same_tensors(old, new)


def test_an_untied_head_and_embedding_stream_apart(tokenizer, tmp_path, one_panel_blocks):
    model = build_family("llama", len(tokenizer))
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight))
    folder = tmp_path / "model"
    model.to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for kind in ("float32-panels", "q4"):
        old, new = tmp_path / f"old-{kind}.safetensors", tmp_path / f"new-{kind}.safetensors"
        convert_lean(folder, old, kind, "test")
        assert convert_streamed(folder, new, kind, "test")
        same_tensors(old, new)
    assert not LeanWeights(new, "q4", "test").config.tied


@pytest.mark.parametrize("family", ["llama", "phi3", "gemma3_text"])
def test_the_stream_never_holds_the_whole_model(family, tokenizer, tmp_path, monkeypatch, one_panel_blocks):
    """No transformers model is loaded, no tensor is read past a block (64 rows; q/k's rope order spans
    at most a head more), and the fp32 blocks alive at once stay under two blocks of the widest tensor:
    less than the largest tensor, a fraction of the model."""
    from transformers import AutoModelForCausalLM

    def no_model(*_a, **_k):
        raise AssertionError("the streamed path loaded the whole model")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_model)
    folder = save(family, torch.bfloat16, tmp_path / "model", tokenizer)
    files = Checkpoint(folder)
    whole = 4 * sum(int(np.prod(shape)) for shape in files.shapes.values())  # the model in fp32
    largest = 4 * max(int(np.prod(shape)) for shape in files.shapes.values())
    widest = max(shape[-1] for shape in files.shapes.values())
    alive, peak, read = [0], [0], Checkpoint.read

    def counted(self, name, rows=slice(None)):
        block = read(self, name, rows)
        alive[0] += block.nbytes
        peak[0] = max(peak[0], alive[0])
        weakref.finalize(block, lambda n=block.nbytes: alive.__setitem__(0, alive[0] - n))
        assert block.shape[0] <= 2 * PANEL or block.dim() == 1, (name, tuple(block.shape))
        return block

    monkeypatch.setattr(Checkpoint, "read", counted)
    for kind in ("float32-panels", "q4", "bfloat16-dense"):
        assert convert_streamed(folder, tmp_path / f"{kind}.safetensors", kind, "test")
    assert peak[0] <= 2 * PANEL * widest * 4 < largest < whole / 3


def test_int8_and_a_gguf_folders_q4_take_the_whole_model(tokenizer, tmp_path, monkeypatch):
    folder = save("llama", torch.bfloat16, tmp_path / "model", tokenizer)
    assert not convert_streamed(folder, tmp_path / "int8.safetensors", "int8", "test")
    from chatcli.engine.weights import gguf_convert

    monkeypatch.setattr(gguf_convert, "source_gguf", lambda _folder: tmp_path / "model.gguf")
    assert not convert_streamed(folder, tmp_path / "q4.safetensors", "q4", "test")
    assert convert_streamed(folder, tmp_path / "panels.safetensors", "float32-panels", "test")
    assert not (tmp_path / "int8.safetensors").exists() and not (tmp_path / "q4.safetensors").exists()


def test_lean_weights_streams_a_folder_and_loads_the_model_only_for_int8(tokenizer, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    folder = save("qwen2", torch.bfloat16, tmp_path / "model", tokenizer)
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    loads, load = [], AutoModelForCausalLM.from_pretrained

    def counted(*a, **k):
        loads.append(a[0])
        return load(*a, **k)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counted)
    panels = lean_weights(folder, "float32-panels")
    assert loads == [] and panels.config.kind == "float32-panels"
    assert lean_weights(folder, "int8").config.kind == "int8"
    assert len(loads) == 1


@pytest.mark.parametrize("change", ["renamed", "float8"])
def test_a_folder_transformers_would_read_otherwise_is_not_streamed(change, tokenizer, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save("llama", torch.bfloat16, tmp_path / "model", tokenizer)
    tensors = load_file(folder / "model.safetensors")
    if change == "renamed":
        tensors = {f"renamed.{name}": t for name, t in tensors.items()}
    else:  # a dtype read as it is would lose its scales
        name = "model.layers.0.mlp.down_proj.weight"
        tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    save_file(tensors, folder / "model.safetensors")
    assert not convert_streamed(folder, tmp_path / "panels.safetensors", "float32-panels", "test")
    assert not (tmp_path / "panels.safetensors").exists()
