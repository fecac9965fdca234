"""A model folder's safetensors → a lean file, a block of rows at a time: never the whole model in memory.

`lean_convert.convert_lean` loads the whole transformers model in fp32 and gathers every output
array before it writes (a 1B bf16 model: ~5 GB of fp32 model, and the output again). Here each
weight is read from the folder's safetensors files when its turn comes, `CHUNK_BYTES` of fp32 rows
at a time (`Checkpoint.read`: the file is opened for that read alone, so the pages read are not
left mapped), fused, norm-folded, rope-ordered and laid out by `lean_convert`'s and `layouts`' own
functions, and written where it goes in the file (`tensorfile.StreamedTensors`). The peak memory
is a block's on top of the interpreter's, and the tensors written are the bytes `convert_lean`
writes (each step is row-wise, or element-wise, and blocks hold whole panels and whole q4 / q8
blocks of 16 outputs).

The model `lean_convert` reads is a skeleton (`lazy_model`): transformers' own model built with
`accelerate.init_empty_weights` (parameters on the meta device; buffers, such as the rotary
embedding's frequencies and Gemma's embedding scale, real), its matrices `LazyWeight`s (a tensor's
name, its first row, its shape: read by blocks of rows) and its vectors (norms, biases) read in
fp32 at once (they are small). The architecture (`lean_config`), the rope tables, the vectors and
each projection's parts (`projection_parts`) come from it as from a loaded model.

Streamed: `float32-panels`, the dense kinds, `q4` and `q8`. Not streamed (`convert_streamed`
returns False; the caller converts through the whole model): `int8` (its SmoothQuant scales are
measured through forward passes of the model: `quantize.down_smoothing`), `q4` / `q8` of a folder
made from a GGUF (its own blocks are taken where they equal a whole weight: `GGUFBlocks`), a folder
without `model.safetensors` or its index, a model whose parameters are not in the files under
transformers' names, shapes and a float dtype (BF16, F16, F32), and a quantized one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from chatcli.engine.weights import Status
from chatcli.engine.weights.families import context_limit, lean_support
from chatcli.engine.weights.layouts import dense, grouped_arrays, padded_vector, panels
from chatcli.engine.weights.lean_convert import (
    embed_scale,
    fused_transposed,
    grouped_parts,
    lean_config,
    load_tokenizer,
    projection_parts,
    rope_tables,
    vectors,
)
from chatcli.engine.weights.lean_file import GROUPED, INT8, PANEL, norm_before, scales_length
from chatcli.engine.weights.sidecar import record
from chatcli.engine.weights.tensorfile import CODES, StreamedTensors

CHUNK_BYTES = 16 << 20  # the fp32 rows read, and laid out, at a time
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FLOATS = ("BF16", "F16", "F32")  # what is read as it is (upcast); anything else goes through transformers


class Checkpoint:
    """A model folder's safetensors tensors by name (the index's shards, or `model.safetensors`): their
    shapes and dtypes from the headers, their rows read on demand."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        index = folder / INDEX
        where = json.loads(index.read_text())["weight_map"] if index.is_file() else None
        self.files: dict[str, Path] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}  # safetensors codes: BF16, F16, F32, ...
        for file in sorted(set(where.values())) if where is not None else [SINGLE]:
            with safe_open(folder / file, framework="pt") as f:
                for name in f.keys():
                    if where is None or where.get(name) == file:
                        header = f.get_slice(name)
                        self.files[name] = folder / file
                        self.shapes[name], self.dtypes[name] = tuple(header.get_shape()), header.get_dtype()

    def read(self, name: str, rows: slice = slice(None)) -> torch.Tensor:
        """Rows `rows` of tensor `name` in fp32 (a bf16 or fp16 one upcast, exactly); the file is
        mapped for this read only, so the pages read do not stay in this process."""
        from safetensors import safe_open

        with safe_open(self.files[name], framework="pt") as f:
            return f.get_slice(name)[rows].float()


@dataclass(frozen=True, eq=False)
class LazyWeight:
    """A matrix in the folder's files, not read: rows `start .. start + shape[0]` of tensor `name` (a
    fused tensor's part, as `split` and `chunk` make them, the way transformers' modules split theirs)."""

    files: Checkpoint
    name: str
    shape: tuple[int, ...]
    start: int = 0

    def split(self, sizes: list[int]) -> list[LazyWeight]:
        out, at = [], self.start
        for size in sizes:
            out.append(LazyWeight(self.files, self.name, (size, *self.shape[1:]), at))
            at += size
        return out

    def chunk(self, count: int, dim: int = 0) -> list[LazyWeight]:
        if dim != 0:
            raise ValueError("a LazyWeight splits along its rows only")
        size = -(-self.shape[0] // count)
        return self.split([min(size, self.shape[0] - i) for i in range(0, self.shape[0], size)])

    def rows(self, begin: int, end: int) -> torch.Tensor:
        """Rows `begin:end` in fp32."""
        return self.files.read(self.name, slice(self.start + begin, self.start + end))

    def data_ptr(self) -> tuple[str, int]:
        """The same tensor's rows read under two names (a tied head) give one."""
        return self.name, self.start


def lazy_model(folder: Path, files: Checkpoint):
    """`folder`'s transformers model as a skeleton over `files` (see the module's docstring), or None
    where a parameter is not in the files under a name transformers gives it, in its shape and a float
    dtype (or the model is quantized: transformers' loading dequantizes it)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    if lean_support(config) or getattr(config, "quantization_config", None):
        return None  # convert_lean says why, or dequantizes as transformers does
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.tie_weights()  # init_empty_weights leaves a tied head apart
    found, params = {}, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        params[id(p)] = p
        if name in files.shapes and id(p) not in found:
            found[id(p)] = name
    if set(params) - set(found) or any(
        files.shapes[n] != tuple(params[k].shape) or files.dtypes[n] not in FLOATS for k, n in found.items()
    ):
        return None
    read = {
        k: LazyWeight(files, n, files.shapes[n]) if len(files.shapes[n]) > 1 else files.read(n)
        for k, n in found.items()
    }
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = read[id(p)]  # what `module.weight` returns from now on
    return model.eval()


def streams(folder: Path, kind: str) -> bool:
    """Whether `convert_streamed` takes this kind of this folder (it may still find its names do not match)."""
    if kind == INT8 or not ((folder / INDEX).is_file() or (folder / SINGLE).is_file()):
        return False
    if kind in GROUPED:
        from chatcli.engine.weights.gguf_convert import source_gguf

        return source_gguf(folder) is None
    return True


def convert_streamed(folder: Path, path: Path, kind: str, source: str, status: Status | None = None) -> bool:
    """Write the lean file of `kind` for the model in `folder` at `path`, streamed (see the module's
    docstring); False, with nothing written, where it is not streamed (the caller then converts it
    with `lean_convert.convert_lean`)."""
    if not streams(folder, kind):
        return False
    tokenizer = load_tokenizer(folder)  # and transformers quiet from here on
    model = lazy_model(folder, Checkpoint(folder))
    if model is None:
        return False
    status = status or (lambda *_a, **_k: None)
    status(f"Converting {folder.name} for the lean runner (once)")
    limit = context_limit(model.config, tokenizer)
    config = lean_config(model, limit, kind, source)
    with torch.inference_mode():
        small, rotary = rope_tables(model, limit, config)
        small.update({name: v.numpy() for name, v in vectors(model, config, rotary).items()})
        if kind in GROUPED:
            config, parts = grouped_parts(model, config, rotary)
            small.update(
                {norm_before(n): padded_vector(norm).numpy() for n, (_, norm) in parts.items() if norm is not None}
            )
        else:
            parts = projection_parts(model, None, rotary)
        out = StreamedTensors(path)
        try:
            for name, array in small.items():
                out.declare(name, "F32", array.shape)
                out.write(name, 0, array)
            if kind not in GROUPED:
                _write_embedding(out, model)
            for i, (name, (listed, norm)) in enumerate(parts.items()):
                status("Writing the lean weights", i, len(parts))
                if kind in GROUPED:
                    _write_grouped(out, name, listed, kind)
                else:
                    _write_projection(out, name, listed, norm, config.weights, kind.endswith("-panels"))
            status("Writing the lean weights", len(parts), len(parts))
            out.close({"chatcli": config.to_json()})
        except BaseException:
            out.abort()
            raise
    record(path)
    return True


def _step(k: int) -> int:
    """Outputs (rows) a block holds: whole panels of 64 (and so whole q4 / q8 blocks of 16)."""
    return max(PANEL, CHUNK_BYTES // (4 * k) // PANEL * PANEL)


def _fused_rows(parts: list, begin: int, end: int) -> list[torch.Tensor]:
    """Outputs `begin:end` of a fused projection's parts `[(LazyWeight, row order or None)]`, read, each
    part's rows in its order (q / k: rope's, within each head)."""
    out, at = [], 0
    for weight, order in parts:
        n = weight.shape[0]
        lo, hi = max(begin - at, 0), min(end - at, n)
        if lo < hi:
            if order is None:
                out.append(weight.rows(lo, hi))
            else:
                index = torch.as_tensor(order[lo:hi])
                first = int(index.min())
                out.append(weight.rows(first, int(index.max()) + 1)[index - first])
        at += n
    return out


def _write_embedding(out: StreamedTensors, model) -> None:
    """`embed [V, D]` fp32, Gemma's scale folded in (`lean_convert.embedding`), a block of rows at a time."""
    weight, scale = model.model.embed_tokens.weight, embed_scale(model)
    rows, hidden = weight.shape
    out.declare("embed", "F32", (rows, hidden))
    step = _step(hidden)
    for begin in range(0, rows, step):
        block = weight.rows(begin, min(rows, begin + step))
        out.write("embed", begin * hidden * 4, (block * scale if scale is not None else block).contiguous().numpy())


def _write_projection(out: StreamedTensors, name: str, parts: list, norm, dtype: str, as_panels: bool) -> None:
    """One projection, a block of outputs at a time: fp32 panels `[ceil(n/64), k, 64]` (a block is whole
    panels, contiguous in the file) or `w_t [k, n]` in `dtype` (a block is a column: one write per input)."""
    n, k = sum(w.shape[0] for w, _ in parts), parts[0][0].shape[1]
    step = _step(k)
    for begin in range(0, n, step):
        w_t = fused_transposed(_fused_rows(parts, begin, min(n, begin + step)), norm)  # [k, m]
        if as_panels:
            if begin == 0:
                out.declare(name, "F32", (-(-n // PANEL), k, PANEL))
            out.write(name, begin * k * 4, panels(w_t).numpy())
            continue
        value = dense(w_t, dtype)
        code, array = value if isinstance(value, tuple) else (CODES[value.dtype.name], value)
        if begin == 0:
            out.declare(name, code, (k, n))
        for i in range(k):
            out.write(name, (i * n + begin) * array.itemsize, array[i])


def _write_grouped(out: StreamedTensors, name: str, parts: list, kind: str) -> None:
    """One q4 / q8 projection (`grouped_arrays`), a block of whole 16-output blocks at a time: its codes
    `w` and scales `d` (and mins `m`) each contiguous in the file, declared from the first block."""
    n, k = sum(w.shape[0] for w, _ in parts), parts[0][0].shape[1]
    step, written, declared = _step(k), {}, {}
    for begin in range(0, n, step):
        block = [(w, None) for w in _fused_rows(parts, begin, min(n, begin + step))]
        for key, array in grouped_arrays({name: (block, None)}, {}, kind).items():
            if begin == 0:
                shape = (-(-n // 16), *array.shape[1:]) if key.endswith(".w") else (scales_length(n, k),)
                out.declare(key, CODES[array.dtype.name], shape)
                written[key], declared[key] = 0, int(np.prod(shape)) * array.itemsize
            out.write(key, written[key], array)
            written[key] += array.nbytes
    if written != declared:
        raise RuntimeError(f"{name}: wrote {written} bytes where {declared} were declared")
