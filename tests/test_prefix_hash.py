"""A file written out of order is hashed as it fills (`prefix_hash`, `StreamedTensors.start`): the digest
`close()` returns is the BLAKE3 of the finished file (`sidecar.file_digest`'s), whatever the order of the
writes, with ranges never written, and with the header written first."""

from __future__ import annotations

import json
import os
import random

import blake3
import numpy as np
import pytest

from chatcli.engine.weights.prefix_hash import PIECE, PrefixHash
from chatcli.engine.weights.tensorfile import MappedTensors, StreamedTensors


def _file_digest(path) -> str:
    return blake3.blake3(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_out_of_order_writes_hash_to_the_files_blake3(tmp_path, seed):
    rng = random.Random(seed)
    sizes = [64 * rng.randint(1, 3000) for _ in range(12)]  # some larger than a read-back piece
    assert max(sizes) > PIECE // 64
    out = StreamedTensors(tmp_path / "x.safetensors")
    for i, size in enumerate(sizes):
        out.declare(f"t{i}", "U8", (size,))
    out.start({"note": "written first"})
    data = {f"t{i}": np.frombuffer(rng.randbytes(size), np.uint8) for i, size in enumerate(sizes)}
    pieces = [(name, at, min(at + 4096, len(a))) for name, a in data.items() for at in range(0, len(a), 4096)]
    rng.shuffle(pieces)
    for name, a, b in pieces:
        out.write(name, a, data[name][a:b])
    digest = out.close()
    path = tmp_path / "x.safetensors"
    assert digest == _file_digest(path)
    f = MappedTensors(path)  # the file is the one declared, its header as start() wrote it
    assert f.metadata == {"note": "written first"}
    assert all(np.array_equal(f.array(name), a) for name, a in data.items())


def test_ranges_never_written_are_hashed_as_the_files_zeros(tmp_path):
    out = StreamedTensors(tmp_path / "x.safetensors")
    for name in ("a", "b", "c"):
        out.declare(name, "U8", (128,))
    out.start({})
    out.write("a", 0, np.full(128, 7, np.uint8))
    out.write("c", 0, np.full(128, 9, np.uint8))  # b never written: past the prefix, then zeros
    digest = out.close()
    assert digest == _file_digest(tmp_path / "x.safetensors")


def test_close_without_start_writes_the_header_and_returns_no_digest(tmp_path):
    out = StreamedTensors(tmp_path / "x.safetensors")
    out.declare("a", "U8", (64,))
    out.write("a", 0, np.arange(64, dtype=np.uint8))
    assert out.close({"k": "v"}) is None
    assert MappedTensors(tmp_path / "x.safetensors").metadata == {"k": "v"}


def test_metadata_at_close_after_start_is_refused(tmp_path):
    out = StreamedTensors(tmp_path / "x.safetensors")
    out.declare("a", "U8", (64,))
    out.start({})
    with pytest.raises(ValueError, match="start"):
        out.close({"late": "1"})
    assert not list(tmp_path.iterdir())  # the temporary file is removed


def test_a_file_shorter_than_its_ranges_is_an_error_not_a_wrong_digest(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_RDONLY)
    try:
        h = PrefixHash(fd)
        h.written(0, 100)
        with pytest.raises(OSError, match="ends"):
            h.finish(200)
    finally:
        os.close(fd)


def test_the_gguf_lean_files_record_holds_its_blake3(tmp_path):
    """The sidecar of a GGUF's lean file (written with the digest hashed as it filled) is what a full
    rehash finds: `pull --verify` passes on it."""
    from chatcli.engine.weights import sidecar
    from chatcli.engine.weights.gguf_lean import convert_gguf_lean
    from tests.gguf_models import Q4_K_M, tiny, write_gguf

    gguf = write_gguf(tiny("llama", True), tmp_path / "model.gguf", Q4_K_M)
    lean = tmp_path / "lean" / "gguf.safetensors"
    convert_gguf_lean(gguf, lean, 64, "test")
    recorded = json.loads(sidecar.path_of(lean).read_text())["blake3"]
    assert recorded == _file_digest(lean)
    assert sidecar.check(lean) == ""
