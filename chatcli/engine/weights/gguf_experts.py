"""A mixture's experts repacked after the first start, a layer at a time, beside the lean file that left them in
the GGUF (`LeanConfig.raw_experts`).

A first start writes only the rest of the model (`gguf_lean`) and reads the experts from the GGUF's own rows, the
same bits but slower to decode (kernels/project_raw.h puts each block in the repacked layout as it reads it). Then
a process of its own at the lowest priority (`runners.native_experts.start`) writes each layer's experts as the
lean file would hold them into `<lean stem>.experts-<i>.safetensors` (atomic, its sidecar last), in order; the
runner takes each layer up as its file is done (`ExpertViews.poll`), and a later start reads every layer done from
its file. A layer's file holds its experts' arrays under the lean file's names (`layers.<i>.experts_gate_up.<j>.w`,
...) and names its source and layer in its metadata; one that does not match is written again. The process
converts nothing once its parent is gone, so a one-shot's start leaves the layers it finished;
`CHATCLI_REPACK_EXPERTS=off` starts none (every start then reads the GGUF's rows).
"""

from __future__ import annotations

import json
from pathlib import Path

from chatcli.engine.weights.gguf_file import GGUFFile
from chatcli.engine.weights.lean_file import LeanConfig, block_arrays
from chatcli.engine.weights.lean_writer import ChunkWriter, declare_part, write_part

KEY = "chatcli_experts"  # a layer file's metadata: its source and layer


def layer_path(lean: Path, i: int) -> Path:
    return lean.with_name(f"{lean.stem}.experts-{i}.safetensors")


def layer_names(i: int) -> tuple[str, str]:
    return f"layers.{i}.experts_gate_up", f"layers.{i}.experts_down"


def open_layer(lean: Path, config: LeanConfig, i: int):
    """Layer i's repacked experts (a `tensorfile.MappedTensors`) where its file is done and holds what `config`
    says, else None."""
    from chatcli.engine.weights import sidecar
    from chatcli.engine.weights.tensorfile import MappedTensors, TensorFileError

    path = layer_path(lean, i)
    if not path.is_file() or not sidecar.unchanged(path):
        return None
    try:
        mapped = MappedTensors(path)
    except (OSError, TensorFileError):
        return None
    if mapped.metadata.get(KEY) != json.dumps({"source": config.source, "layer": i}):
        return None
    for name, k in zip(layer_names(i), (config.hidden, config.ffn), strict=True):  # gate_up's inputs, down's
        for j, (kind, size) in enumerate(config.parts[name]):
            for key, (code, shape) in block_arrays(kind, size, k).items():
                info = mapped.tensors.get(f"{name}.{j}.{key}")
                if info is None or info.dtype != code or info.shape != shape:
                    return None
    return mapped


def write_layer(meta: GGUFFile, config: LeanConfig, lean: Path, i: int, packer=None) -> None:
    """Layer i's experts repacked into their file (atomic; its sidecar last)."""
    from chatcli.engine.weights.sidecar import record
    from chatcli.engine.weights.tensorfile import StreamedTensors

    path = layer_path(lean, i)
    out = StreamedTensors(path)
    try:
        for name in layer_names(i):
            for j, tensor in enumerate(config.raw_experts[name]):
                declare_part(out, f"{name}.{j}.", meta.tensors[tensor])
        out.start({KEY: json.dumps({"source": config.source, "layer": i})})
        with ChunkWriter(out) as writer:
            for name in layer_names(i):
                for j, tensor in enumerate(config.raw_experts[name]):
                    t = meta.tensors[tensor]
                    write_part(writer, f"{name}.{j}.", meta, tensor, None, t.type_name, t.rows, packer)
        digest = out.close()
    except BaseException:
        out.abort()
        raise
    record(path, digest)
