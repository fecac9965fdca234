"""A GGUF's tensors mapped read-only, as the file holds them: the experts a lean file leaves in the GGUF
(`LeanConfig.raw_experts`, the kernel's WEIGHT_RAW_* kinds) are read from these pages, shared with the
page cache and every process reading the file, with no copy of their own.

Each file of the model (a split model's parts too) is mapped whole; `address(name)` is a tensor's first byte.
A file shorter than its header says (truncated since it was checked) is refused here, before the kernel
could read past its end (a bus error).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from chatcli.engine.weights.gguf_file import GGUFError, GGUFFile, Tensor
from chatcli.engine.weights.tensorfile import _address

# the experts' types the kernel reads from the GGUF as they are (kernels/project_raw.h): the inputs a block takes
RAW_TYPES = {"Q4_K": 256, "Q6_K": 256, "MXFP4": 32}


class MappedGGUF:
    def __init__(self, path: str | os.PathLike) -> None:
        meta = GGUFFile(path)
        try:
            self.tensors: dict[str, Tensor] = dict(meta.tensors)
            paths = meta.paths
        finally:
            meta.close()
        self._maps, self._bases = [], []
        for p in paths:
            with open(p, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else None
            self._maps.append(mapped)
            self._bases.append((_address(mapped) if mapped else 0, size))
        for t in self.tensors.values():
            if t.n_bytes is not None and t.offset + t.n_bytes > self._bases[t.part][1]:
                raise GGUFError(f"{Path(paths[t.part]).name}: {t.name} ends past the file's end (truncated?)")

    def address(self, name: str) -> int:
        t = self.tensors[name]
        return self._bases[t.part][0] + t.offset


def raw_experts_plan(meta: GGUFFile, projections: dict) -> dict[str, list[str]]:
    """The experts' projections the kernel reads from the GGUF as it is (lean name -> its GGUF tensors): every
    one, where all of them are Q4_K, Q6_K or MXFP4 rows of whole blocks (`RAW_TYPES`); else none."""
    raw = {
        name: [tensor for tensor, _order in listed]
        for name, (listed, _norm) in projections.items()
        if ".experts_" in name
    }
    for tensors in raw.values():
        for tensor in tensors:
            t = meta.tensors[tensor]
            if t.type_name not in RAW_TYPES or int(t.shape[0]) % RAW_TYPES[t.type_name]:
                return {}
    return raw
