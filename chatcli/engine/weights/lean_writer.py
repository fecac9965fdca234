"""A lean file's chunks written on a thread of their own while the next chunk is read and packed.

A first start writes a GGUF's blocks into the lean file a chunk of rows at a time (`gguf_lean._write_part`):
read (`pread`), pack (the kernel's `chatcli_pack`), write (`pwrite`, hashed as it fills). One after the other,
the reads and writes left the packing team idle and the writes left the cores' other work waiting. Here the
chunks take turns in `ARENAS` sets of buffers (an arena: `kquant_blocks.packed_by`'s, and the read buffer):
the caller `take`s a free arena, reads and packs a chunk into it, and `put`s its writes; this thread writes
them, in the order put, and frees the arena. `pread`, `pwrite`, `chatcli_pack` (a ctypes call) and the hash
let go of the GIL, so the write of one chunk runs beside the read and pack of the next. The bytes written and
where they go are the same as one thread's; only when they are written changes.

A write that fails stops the thread; the caller's next `take`, `put` or `close` raises its error. `stop`
ends the thread without raising (the caller is already failing).
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from chatcli.engine.weights.gguf_file import GGUFFile, Tensor
from chatcli.engine.weights.kquant_blocks import MINS, kind_of, tensor_parts

ARENAS = 2  # chunks in flight: one being written while the next is read and packed
CHUNK_BYTES = 16 << 20  # codes decoded at once (a chunk of rows, a multiple of 64)


class ChunkWriter:
    def __init__(self, out) -> None:
        self.out = out  # tensorfile.StreamedTensors
        self.arenas: list[dict] = [{} for _ in range(ARENAS)]
        self._free = [threading.Event() for _ in range(ARENAS)]
        for free in self._free:
            free.set()
        self._turn = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="chatcli-lean-writer", daemon=True)
        self._thread.start()

    def take(self) -> tuple[int, dict]:
        """The next arena (its number and its buffers), once the writes of the chunk last packed into it are done."""
        i = self._turn
        self._free[i].wait()
        self._raise()
        self._free[i].clear()
        self._turn = (i + 1) % ARENAS
        return i, self.arenas[i]

    def put(self, arena: int, writes: list[tuple[str, int, object]]) -> None:
        """Write each (name, offset, array) in turn (`out.write`), then free `arena`: its arrays stay untouched
        until then."""
        self._raise()
        self._queue.put((arena, writes))

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, kind, _error, _trace) -> None:
        """`close` after the caller's last `put`; `stop` where the caller is failing (its error goes on)."""
        if kind is None:
            self.close()
        else:
            self.stop()

    def close(self) -> None:
        """Wait for every write put; raise the error that stopped them, if one did."""
        self.stop()
        self._raise()

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            arena, writes = item
            try:
                if self._error is None:
                    for name, at, array in writes:
                        self.out.write(name, at, array)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's next call
                self._error = exc
            finally:
                self._free[arena].set()


def declare_part(out, prefix: str, t: Tensor) -> None:
    """Declare the arrays a GGUF tensor is repacked into (`lean_file.block_arrays`, `m` as long as `d` where its
    type has mins) in `out` (a `tensorfile.StreamedTensors`), each named `prefix` + its key."""
    from chatcli.engine.weights.lean_file import block_arrays

    arrays = block_arrays(kind_of(t.type_name), t.rows, int(t.shape[0]))
    if t.type_name in MINS:
        arrays["m"] = arrays["d"]
    for key, (code, shape) in arrays.items():
        out.declare(prefix + key, code, shape)


def write_part(
    writer: ChunkWriter, prefix: str, meta: GGUFFile, tensor: str, order, type_name: str, n: int, packer
) -> None:
    """One GGUF tensor's blocks into its arrays, a chunk of rows at a time, through the buffers of the writer's
    arenas, kept from one chunk and tensor to the next (pages touched for the first time are what a first
    start pays most for on a VM, ~2 ms a MB here, and a 1B model's chunks would touch ~1.6 GB of them); each
    chunk's writes go to the writer's thread while the next chunk is read and packed."""
    t = meta.tensors[tensor]
    row_bytes = int(t.n_bytes) // n
    step = max(64, CHUNK_BYTES // max(1, int(t.shape[0])) // 64 * 64)
    whole = meta.read(t, 0, n)[order] if order is not None else None  # q/k rows put in order: small tensors
    written: dict[str, int] = {}
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        number, arena = writer.take()
        if whole is None and len(arena.get("raw", ())) < min(n, step) * row_bytes:
            arena["raw"] = np.empty(min(n, step) * row_bytes, np.uint8)
        raw = whole[r0:r1] if whole is not None else meta.read(t, r0, r1, arena["raw"])
        _kind, arrays = tensor_parts(type_name, raw.reshape(r1 - r0, row_bytes), packer=packer, arena=arena)
        writes = []
        for key, array in arrays.items():
            writes.append((prefix + key, written.get(key, 0), np.ascontiguousarray(array)))
            written[key] = written.get(key, 0) + array.nbytes
        writer.put(number, writes)
