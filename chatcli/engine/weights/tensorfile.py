"""safetensors files, memory-mapped and written 64-byte aligned, without torch.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON naming each
tensor's dtype, shape and byte range in the data that follows, then the data. The library
writes it (`safetensors.serialize_file`, from raw pointers); reading is done here, because
the library hands out copies through numpy or torch, and chatcli wants the file's own pages:
`MappedTensors` maps the file read-only and shared, so the weights are one copy in the page
cache however many processes read them, pages come in as they are first read, and the kernel
gets plain addresses. Nothing here imports torch; numpy only for `array()`.

Every tensor written by `write_tensors` starts at a multiple of 64 bytes (the kernel's
vector loads then never split a cache line): each tensor's size is a multiple of 64 (the
caller pads) and the header is padded so the data starts on one. Both writers write a temporary
file beside the final one (`paths.temp_file`: named by its writer, so that a killed one's is swept
by a later start), renamed into place when complete.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from chatcli.paths import temp_file

ALIGN = 64

# safetensors dtype codes -> (numpy dtype name, bytes); BF16 is read as raw uint16
DTYPES = {
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("uint16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "I32": ("int32", 4),
    "I64": ("int64", 8),
    "U16": ("uint16", 2),
}
CODES = {
    "float32": "F32",
    "float16": "F16",
    "int8": "I8",
    "uint8": "U8",
    "int32": "I32",
    "int64": "I64",
    "uint16": "U16",
}
SPEC_NAMES = {
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I8": "int8",
    "U8": "uint8",
    "I32": "int32",
    "I64": "int64",
    "U16": "uint16",
}  # what safetensors.TensorSpec takes
_MAX_HEADER = 100 << 20


class TensorFileError(ValueError):
    """The file is not a well-formed safetensors file (truncated, damaged, not one at all)."""


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # safetensors code: F32, BF16, I8, ...
    shape: tuple[int, ...]
    offset: int  # from the start of the file
    nbytes: int


class MappedTensors:
    """A safetensors file mapped read-only and shared; tensors are addresses into the mapping."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise TensorFileError(f"{self.path.name}: {size} bytes, too short for a safetensors file")
            (length,) = struct.unpack("<Q", f.read(8))
            if not 2 <= length <= min(_MAX_HEADER, size - 8):
                raise TensorFileError(f"{self.path.name}: header length {length} does not fit a {size}-byte file")
            try:
                header = json.loads(f.read(length))
            except (UnicodeDecodeError, ValueError):
                raise TensorFileError(f"{self.path.name}: the header is not JSON") from None
            if not isinstance(header, dict):
                raise TensorFileError(f"{self.path.name}: the header is not a JSON object")
            self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
            start = 8 + length
            self.tensors = {name: _info(self.path.name, name, entry, start, size) for name, entry in header.items()}
            end = max((t.offset + t.nbytes for t in self.tensors.values()), default=start)
            if end != size:
                raise TensorFileError(f"{self.path.name}: {size} bytes where the header describes {end}")
            self._map = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)  # shared, read-only
        self.base = _address(self._map)
        self.size = size

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def address(self, name: str) -> int:
        return self.base + self.tensors[name].offset

    def array(self, name: str):
        """A numpy view of the tensor (BF16 as uint16), read-only in spirit: the file is shared."""
        import numpy as np

        info = self.tensors[name]
        dtype = DTYPES[info.dtype][0]
        count = info.nbytes // DTYPES[info.dtype][1]
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=info.offset).reshape(info.shape)


def _info(file: str, name: str, entry, start: int, size: int) -> TensorInfo:
    try:
        dtype, shape, (begin, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
        begin, end = int(begin), int(end)
    except (KeyError, TypeError, ValueError):
        raise TensorFileError(f"{file}: tensor {name!r} has a malformed entry") from None
    if dtype not in DTYPES:
        raise TensorFileError(f"{file}: tensor {name!r} has an unknown dtype {dtype!r}")
    count = 1
    for d in shape:
        count *= d
    if any(d < 0 for d in shape) or not 0 <= begin <= end or end - begin != count * DTYPES[dtype][1]:
        raise TensorFileError(f"{file}: tensor {name!r}: shape {list(shape)} does not match bytes {begin}..{end}")
    if start + end > size:
        raise TensorFileError(f"{file}: tensor {name!r} runs past the end of the file (truncated?)")
    return TensorInfo(dtype, shape, start + begin, end - begin)


def _address(buffer) -> int:
    """The address of a read-only buffer (ctypes only takes writable ones; numpy takes any)."""
    import numpy as np

    return int(np.frombuffer(buffer, dtype=np.uint8, count=1).ctypes.data)


def write_tensors(
    path: str | os.PathLike, tensors: dict, metadata: dict[str, str] | None = None, align: bool = True
) -> None:
    """Write `tensors` ({name: numpy array, or (safetensors code, numpy array) for BF16}) to `path`
    atomically (a temporary file renamed into place); with `align`, every tensor 64-byte aligned."""
    from safetensors import TensorSpec, serialize_file

    specs, keep = {}, []
    for name, value in tensors.items():
        code, array = value if isinstance(value, tuple) else (CODES[value.dtype.name], value)
        if not array.flags.c_contiguous:
            array = array.copy()
        if align and array.nbytes % ALIGN:
            raise ValueError(f"tensor {name!r} is {array.nbytes} bytes, not a multiple of {ALIGN}: pad it")
        keep.append(array)
        specs[name] = TensorSpec(
            dtype=SPEC_NAMES[code], shape=tuple(array.shape), data_ptr=array.ctypes.data, data_len=array.nbytes
        )
    fd, tmp = temp_file(Path(path))
    os.close(fd)
    try:
        meta = {**(metadata or {}), "pad": ""}
        _serialize(serialize_file, specs, tmp, meta)
        json_length = _header_json_length(tmp)
        if align and (8 + _header_length(tmp)) % ALIGN:
            # The data starts right after the header: lengthen the header (the library pads it to a
            # multiple of 8 with spaces) so that it ends on a multiple of 64. Offsets are relative to
            # the data, so nothing else in it moves.
            meta["pad"] = " " * ((ALIGN - 8 - json_length) % ALIGN)
            _serialize(serialize_file, specs, tmp, meta)
            if (8 + _header_length(tmp)) % ALIGN:
                raise RuntimeError("could not align the tensors of the file")  # a changed library layout
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class StreamedTensors:
    """A safetensors file written a piece at a time, for tensors too many to hold at once: every tensor
    is declared first (`declare`: dtype code and shape, its place fixed, 64-byte aligned), its bytes
    written where they go as they are made (`write`, any order), and the header last (`close`). The data
    starts after a reserved header space, the header's JSON padded with spaces to fill it (safetensors
    allows trailing spaces); the file is a temporary one beside `path`, renamed into place by `close`.
    Where the metadata is known once every tensor is declared, `start(metadata)` writes the header then
    and hashes the file as it fills (`prefix_hash`): `close()` returns its BLAKE3 (`sidecar.file_digest`'s),
    no second read."""

    def __init__(self, path: str | os.PathLike, header_bytes: int = 1 << 20) -> None:
        self.path = Path(path)
        self._fd, self._tmp = temp_file(self.path)
        self._start = padded(header_bytes + 8) if header_bytes else 0
        self._entries: dict[str, dict] = {}
        self._end = 0
        self._hash = None  # a PrefixHash once start() has written the header

    def declare(self, name: str, code: str, shape: tuple) -> None:
        count = 1
        for d in shape:
            count *= int(d)
        nbytes = count * DTYPES[code][1]
        if nbytes % ALIGN:
            raise ValueError(f"tensor {name!r} is {nbytes} bytes, not a multiple of {ALIGN}: pad it")
        self._entries[name] = {
            "dtype": code,
            "shape": [int(d) for d in shape],
            "data_offsets": [self._end, self._end + nbytes],
        }
        self._end += nbytes

    def write(self, name: str, at: int, data) -> None:
        """`data` (bytes or a contiguous array) into tensor `name` from its byte `at` on."""
        begin, end = self._entries[name]["data_offsets"]
        view = memoryview(data).cast("B")
        if at < 0 or begin + at + len(view) > end:
            raise ValueError(f"{len(view)} bytes at {at} run past tensor {name!r} ({end - begin} bytes)")
        done = 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done:], self._start + begin + at + done)
        if self._hash is not None:
            self._hash.written(self._start + begin + at, self._start + begin + at + len(view))

    def start(self, metadata: dict[str, str]) -> None:
        """Write the header now (every tensor declared) and hash the file as it is written."""
        from chatcli.engine.weights.prefix_hash import PrefixHash

        self._write_header(metadata)
        self._hash = PrefixHash(self._fd)
        self._hash.written(0, self._start)

    def close(self, metadata: dict[str, str] | None = None) -> str | None:
        """Write the header (unless `start` did), make the file its full length, and rename it into place;
        the file's BLAKE3 (hex) where `start` began hashing it, else None."""
        try:
            if self._hash is None:
                self._write_header(metadata)
            elif metadata is not None:
                raise ValueError("the header was written by start(): close() takes no metadata then")
            os.ftruncate(self._fd, self._start + self._end)
            digest = self._hash.finish(self._start + self._end) if self._hash is not None else None
            self._hash = None
            os.close(self._fd)
            self._fd = -1
            os.replace(self._tmp, self.path)
            return digest
        finally:
            self.abort()

    def _write_header(self, metadata: dict[str, str] | None) -> None:
        header = json.dumps({"__metadata__": metadata or {}, **self._entries}, separators=(",", ":")).encode()
        if len(header) > self._start - 8:
            raise ValueError(f"the header ({len(header)} bytes) does not fit its {self._start - 8} reserved bytes")
        header += b" " * (self._start - 8 - len(header))
        os.pwrite(self._fd, struct.pack("<Q", len(header)) + header, 0)

    def abort(self) -> None:
        """Remove the temporary file (after `close`, nothing is left to remove)."""
        if self._hash is not None:
            self._hash.cancel()
            self._hash = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)


def _serialize(serialize_file, specs: dict, tmp: str, meta: dict) -> None:
    """The library's write; an I/O error it reports as its own error type ("... (os error 28)") is
    raised as the OSError it is, so a full disk reads "[Errno 28] No space left on device"."""
    try:
        serialize_file(specs, tmp, metadata=meta)
    except OSError:
        raise
    except Exception as exc:
        found = re.search(r"os error (\d+)", str(exc))
        if found and int(found.group(1)) in errno.errorcode:
            code = int(found.group(1))
            raise OSError(code, os.strerror(code)) from exc
        raise


def _header_length(path: str) -> int:
    with open(path, "rb") as f:
        return struct.unpack("<Q", f.read(8))[0]


def _header_json_length(path: str) -> int:
    with open(path, "rb") as f:
        length = struct.unpack("<Q", f.read(8))[0]
        return len(f.read(length).rstrip(b" "))


def padded(count: int, unit: int = ALIGN) -> int:
    """`count` rounded up to a multiple of `unit`."""
    return -(-count // unit) * unit
