"""The BLAKE3 of a file being written out of order, computed while it is written.

A writer that fills a file a piece at a time (`tensorfile.StreamedTensors`) tells `PrefixHash` each
byte range it has written (`written`). The ranges that join the start of the file into one written
prefix are hashed on a thread of their own, read back with `pread` from the page cache, while the
writer goes on; `finish(size)` hashes what is left (ranges never written read as the zeros the file
holds there) and returns the hex digest. It is the digest `sidecar.file_digest` gives over the
finished file, so a sidecar records it without reading the file again (hashing a 1B model's 0.8 GB
lean file after its last write had cost a first start 0.6 s, with SHA-256).

The writer must not change a range after telling it written. `pread` lets go of the GIL, and so does
the `blake3` package's `update` for a buffer of 2 KiB or more (`GIL_MINSIZE` in its src/lib.rs, since
0.3.1; a PIECE here is 1 MiB; with 1.0.11 another thread ran on, never waiting over 0.3 ms, through
one 0.37 s `update` of 1 GiB), so on a two-core machine the hashing runs beside the writer's
single-threaded parts (its reads, its `pwrite`s), not after them. One thread (BLAKE3's default), not
all cores: the writer has the other.
"""

from __future__ import annotations

import os
import queue
import threading

import blake3

PIECE = 1 << 20  # bytes read back at a time


class PrefixHash:
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._hasher = blake3.blake3()
        self._pending: dict[int, int] = {}  # written ranges past the prefix: start -> end
        self._frontier = 0  # the prefix [0, frontier) is written and queued for hashing
        self._ranges: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="chatcli-prefix-hash", daemon=True)
        self._thread.start()

    def written(self, start: int, end: int) -> None:
        """Bytes [start, end) of the file are written and final."""
        if end <= start:
            return
        self._pending[start] = end
        while self._frontier in self._pending:
            end = self._pending.pop(self._frontier)
            self._ranges.put((self._frontier, end))
            self._frontier = end

    def finish(self, size: int) -> str:
        """The file is `size` bytes and done: the BLAKE3 (hex) of all of it."""
        if size > self._frontier:
            self._ranges.put((self._frontier, size))
        self._ranges.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._hasher.hexdigest()

    def cancel(self) -> None:
        """Stop hashing (the file is being thrown away)."""
        self._ranges.put(None)
        self._thread.join()

    def _run(self) -> None:
        buffer = bytearray(PIECE)
        view = memoryview(buffer)
        while (item := self._ranges.get()) is not None:
            if self._error is not None:
                continue
            at, end = item
            try:
                while at < end:
                    got = os.preadv(self._fd, [view[: min(PIECE, end - at)]], at)
                    if got <= 0:
                        raise OSError(f"the file ends at {at:,} bytes, before {end:,}")
                    self._hasher.update(view[:got])
                    at += got
            except BaseException as exc:  # noqa: BLE001 - raised again by finish()
                self._error = exc
