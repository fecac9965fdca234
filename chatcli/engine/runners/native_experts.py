"""A mixture's experts as the kernel reads them (`kernels/moe.h`): per layer its router, then every expert's gate_up
and every expert's down, each expert a Matrix over its own rows of the layer's stacked tensors. Those rows are the
lean file's repacked arrays (`lean_file.EXPERT_PROJECTIONS`), or the GGUF's own where the lean file left them there
(`LeanConfig.raw_experts`): the kernel's WEIGHT_RAW_Q4K / _Q6K / _MXFP4 over the GGUF's pages
(`gguf_map.MappedGGUF`), the same bits (`kernels/project_raw.h`), until a process of their own (`start`, this
module's main) has repacked the layer into its file (`weights.gguf_experts`); `poll`, between two forwards, then
points the layer's structs there.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from chatcli.engine.runners.kernels.structs import WEIGHT_RAW_MXFP4, WEIGHT_RAW_Q4K, WEIGHT_RAW_Q6K, Matrix
from chatcli.engine.runners.matrices import block_matrix, parts_matrix
from chatcli.engine.weights import gguf_experts
from chatcli.engine.weights.gguf_file import GGUFError
from chatcli.engine.weights.lean_file import LeanFileError, LeanWeights, block_strides

RAW_KINDS = {"Q4_K": WEIGHT_RAW_Q4K, "Q6_K": WEIGHT_RAW_Q6K, "MXFP4": WEIGHT_RAW_MXFP4}
POLL_S = 0.5  # how often `poll` looks for layers repacked since


class ExpertViews:
    """The experts' Matrix structs of a lean file's layers (kept alive here), the GGUF mapped where they are read
    from it (`gguf`: the file the lean file was written from) and the layers' repacked files found so far."""

    def __init__(self, weights: LeanWeights, gguf: Path | None) -> None:
        from chatcli.engine.weights.gguf_map import MappedGGUF

        self.weights, self.config = weights, weights.config
        self.keep: list = []
        self.gguf = None
        self.path = gguf
        self.files: dict[int, object] = {}  # layer -> its repacked experts (a MappedTensors), where done
        self.arrays: dict[int, ctypes.Array] = {}  # layer -> the structs the kernel reads
        self.process: subprocess.Popen | None = None
        self._polled = 0.0
        if not self.config.raw_experts:
            return
        name = weights.file.path.name
        if gguf is None:
            raise LeanFileError(f"{name}: its experts are read from the GGUF it was written from, and none was given")
        try:
            self.gguf = MappedGGUF(gguf)
        except (OSError, GGUFError) as exc:
            raise LeanFileError(f"{name}: {exc}") from None
        for lean, tensors in self.config.raw_experts.items():
            parts = self.config.parts.get(lean) or []
            for tensor, (_kind, size) in zip(tensors, parts, strict=True):
                t = self.gguf.tensors.get(tensor)
                if t is None or t.type_name not in RAW_KINDS or t.rows != size:
                    raise LeanFileError(f"{name}: {gguf.name}'s {tensor} is not the one it was written from")
        for i in range(self.config.layers):
            self._open(i)

    @property
    def raw_bytes(self) -> int:
        """What the experts read from the GGUF take there (0: none are)."""
        if self.gguf is None:
            return 0
        return sum(self.gguf.tensors[t].n_bytes for tensors in self.config.raw_experts.values() for t in tensors)

    @property
    def pending(self) -> list[int]:
        """The layers whose experts are still read from the GGUF."""
        if not self.config.raw_experts:
            return []
        return [i for i in range(self.config.layers) if i not in self.files]

    def layer(self, i: int, router: Matrix) -> tuple:
        """Layer i's router and its experts (every one's gate_up, then every one's down), as Layer's pointers."""
        experts = self._layer_views(i)
        array = (Matrix * len(experts))(*experts)
        self.keep.append((router, experts, array))
        self.arrays[i] = array
        return ctypes.pointer(router), ctypes.cast(array, ctypes.POINTER(Matrix))

    def start(self) -> None:
        """Repack the pending layers in a process of their own (see `weights.gguf_experts`), if any are."""
        if self.pending and self.process is None:
            self.process = start(self.weights.file.path, self.path)
            if self.process is not None:  # reaped as it ends, not at the next forward's poll (an idle server's)
                threading.Thread(target=self.process.wait, name="chatcli-repack-reaper", daemon=True).start()

    def poll(self) -> None:
        """Point each layer repacked since the last look (at most every POLL_S) at its file; call between forwards."""
        if self.process is None or time.monotonic() - self._polled < POLL_S:
            return
        self._polled = time.monotonic()
        for i in self.pending:
            if not self._open(i):
                break  # the process goes in order
            experts = self._layer_views(i)
            for at, matrix in enumerate(experts):
                self.arrays[i][at] = matrix
            self.keep.append(experts)
        if not self.pending:
            self.close()

    def close(self) -> None:
        """Stop the repacking process (the next start goes on from the layers it finished)."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
            self.process.wait()
            self.process = None

    def _open(self, i: int) -> bool:
        mapped = gguf_experts.open_layer(self.weights.file.path, self.config, i)
        if mapped is not None:
            self.files[i] = mapped
        return mapped is not None

    def _layer_views(self, i: int) -> list[Matrix]:
        gate_up, down = gguf_experts.layer_names(i)
        return self.views(gate_up, self.config.hidden) + self.views(down, self.config.ffn)

    def views(self, name: str, k: int) -> list[Matrix]:
        """Each expert's Matrix over its rows of `name`'s stacked parts (its gate's and up's, or its down's): in its
        layer's repacked file where there is one, else the lean file's arrays or the GGUF's rows."""
        c = self.config
        w = self.files.get(int(name.split(".")[1])) or self.weights.file
        raw = name in c.raw_experts and w is self.weights.file
        has = w.tensors
        views = []
        for e in range(c.experts):
            parts = []
            for j, (kind, size) in enumerate(c.parts[name]):
                rows = size // c.experts
                if raw:
                    t = self.gguf.tensors[c.raw_experts[name][j]]
                    first = self.gguf.address(t.name) + e * rows * (t.n_bytes // t.rows)
                    parts.append(Matrix(RAW_KINDS[t.type_name], rows, k, k, first))
                    continue
                key, strides = f"{name}.{j}.", block_strides(kind, k)

                def address(a: str, key=key, first=e * rows // 16, strides=strides):
                    return w.address(key + a) + first * strides[a] if key + a in has else None

                parts.append(block_matrix(kind, rows, k, k, address))
            views.append(parts_matrix(parts, k, k))
        return views


def start(lean: Path, gguf: Path) -> subprocess.Popen | None:
    """The process that repacks the layers not done yet (this module's main), at the lowest priority on one thread;
    None where `CHATCLI_REPACK_EXPERTS=off`."""
    if os.environ.get("CHATCLI_REPACK_EXPERTS", "").lower() in ("off", "0", "no"):
        return None
    return subprocess.Popen(
        [sys.executable, "-m", __name__, str(lean), str(gguf), str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=lambda: os.nice(19),  # runs no thread of its own before the exec
    )


def main(argv: list[str]) -> int:
    """LEAN GGUF PARENT: each layer of LEAN's experts not repacked yet, in order, while PARENT is this one's parent."""
    from chatcli.engine.runners import kernels
    from chatcli.engine.weights.gguf_file import GGUFFile
    from chatcli.engine.weights.lean_file import LeanConfig
    from chatcli.engine.weights.tensorfile import MappedTensors

    lean, gguf, parent = Path(argv[0]), Path(argv[1]), int(argv[2])
    config = LeanConfig.from_json(MappedTensors(lean).metadata.get("chatcli", "null"))
    meta = GGUFFile(gguf)
    packer = kernels.library()
    for i in range(config.layers):
        if os.getppid() != parent:  # the runner is gone: the next start goes on from here
            return 0
        if gguf_experts.layer_names(i)[0] in config.raw_experts and gguf_experts.open_layer(lean, config, i) is None:
            gguf_experts.write_layer(meta, config, lean, i, packer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
