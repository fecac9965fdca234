"""The lean file's chunk writer (weights/lean_writer.py): writes in the order put, an arena reused only once its
writes are done, a failed write raised to the caller."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from chatcli.engine.weights.lean_writer import ARENAS, ChunkWriter


class Out:
    """A StreamedTensors stand-in: records each write (a copy), and can be held or made to fail."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.writes: list[tuple[str, int, list]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.fail_at = fail_at

    def write(self, name: str, at: int, array) -> None:
        self.hold.wait()
        if self.fail_at is not None and len(self.writes) == self.fail_at:
            raise OSError(28, "No space left on device")
        self.writes.append((name, at, np.array(array).tolist()))


def test_chunks_are_written_in_the_order_put_from_their_arenas():
    out = Out()
    writer = ChunkWriter(out)
    expected = []
    for chunk in range(7):
        number, arena = writer.take()
        buffer = arena.setdefault("out", np.zeros(4, np.int64))
        buffer[:] = chunk  # packed into the arena's buffer, which the next use of the arena overwrites
        writer.put(number, [("w", chunk * 32, buffer), ("d", chunk * 8, buffer[:1])])
        expected += [("w", chunk * 32, [chunk] * 4), ("d", chunk * 8, [chunk])]
    writer.close()
    assert out.writes == expected


def test_an_arena_is_given_again_only_once_its_writes_are_done():
    out = Out()
    out.hold.clear()  # the writer thread stuck in its first write
    writer = ChunkWriter(out)
    for _ in range(ARENAS):
        number, arena = writer.take()
        writer.put(number, [("w", 0, np.zeros(1))])
    taken = threading.Event()
    threading.Thread(target=lambda: (writer.take(), taken.set()), daemon=True).start()
    assert not taken.wait(0.3)  # every arena's writes still pending: no arena to pack into
    out.hold.set()
    assert taken.wait(10)
    writer.stop()


def test_a_failed_write_is_raised_by_the_callers_next_call():
    out = Out(fail_at=1)
    writer = ChunkWriter(out)
    number, _ = writer.take()
    writer.put(number, [("a", 0, np.zeros(1)), ("b", 0, np.zeros(1)), ("c", 0, np.zeros(1))])
    with pytest.raises(OSError, match="No space left"):
        writer.close()
    assert [name for name, _, _ in out.writes] == ["a"]  # nothing written after the failure


def test_as_a_context_it_closes_after_the_last_put_and_stops_under_the_callers_error():
    out = Out()
    with ChunkWriter(out) as writer:
        number, _ = writer.take()
        writer.put(number, [("a", 0, np.zeros(1))])
    assert [name for name, _, _ in out.writes] == ["a"] and not writer._thread.is_alive()
    failing = Out(fail_at=0)
    with pytest.raises(KeyError), ChunkWriter(failing) as writer:  # the caller's error, not the write's
        number, _ = writer.take()
        writer.put(number, [("a", 0, np.zeros(1))])
        raise KeyError("packing failed")
    assert not writer._thread.is_alive()
