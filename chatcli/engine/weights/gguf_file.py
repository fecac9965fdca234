"""A GGUF file's header read in one pass: its key-value pairs and where each tensor is.

The format (ggml's `gguf.md`): magic `GGUF`, a version (2 or 3), the tensor and pair counts, the
pairs (a string key, a value type, a value: scalars, strings, arrays of either), then per tensor its
name, dimensions (ggml's order: the row length first), type and offset in the data, which starts at
the next multiple of `general.alignment` (32). gguf's own `GGUFReader` builds numpy views of every
field's parts, ~4 s for SmolLM2's 49,152-token vocabulary here; this reads the same in ~0.1 s,
strings as Python strings and numeric arrays with one `frombuffer` each, and maps nothing: tensor
bytes are read where asked (`read`), with `pread`, so they stay page cache, not this process's.
Types by ggml's numbering (`ggml.h`); the byte size of a tensor is known for the types listed.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from chatcli.engine.weights.gguf_parts import SPLIT_TENSORS, SplitError, check_part, split_parts

# ggml type id -> (name, values a block, bytes a block)
TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    20: ("IQ4_NL", 32, 18),
    23: ("IQ4_XS", 256, 136),
    30: ("BF16", 1, 2),
    39: ("MXFP4", 32, 17),
}
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9


class GGUFError(ValueError):
    """A file that is not a GGUF this reader understands, or is cut short; one line."""


class _Short(Exception):
    """The header runs past the bytes read so far."""


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple  # ggml's order: shape[0] values a row, shape[1] rows (a 2-D weight: inputs, outputs)
    type_name: str
    offset: int  # from the start of its file
    n_bytes: int | None  # None: a type not in TYPES
    part: int = 0  # the file it is in: a split model's part (from 0), else 0

    @property
    def rows(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n


class Strings(Sequence):
    """An array of strings as the header holds it, each decoded when it is read: a vocabulary's and
    its merges' ~350k strings are walked once to find where they end (~0.1 s), and a reader that
    wants only the tensors (the kernel's packer) never decodes them (~0.4 s a header)."""

    def __init__(self, region: bytes, starts: list[int], ends: list[int]) -> None:
        self._region, self._starts, self._ends = region, starts, ends

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._region[self._starts[i] : self._ends[i]].decode("utf-8", errors="replace")

    def __iter__(self):
        region = self._region
        for s, e in zip(self._starts, self._ends, strict=True):
            yield region[s:e].decode("utf-8", errors="replace")

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and list(self) == list(other)

    __hash__ = None  # a list's equality: no hash


class GGUFFile:
    """The header of the GGUF at `path`: `fields` (key → value; arrays as lists, `Strings`, or numpy
    arrays of numbers) and `tensors` (name → Tensor); `read` gives a tensor's raw rows. A split model's
    first part (`gguf_parts`) is read with its other parts as one: the first's fields, every part's
    tensors, `size` all their bytes; `whole=False` reads the one file only."""

    def __init__(self, path: str | os.PathLike, whole: bool = True) -> None:
        self.path = Path(path)
        self._file = open(self.path, "rb")  # noqa: SIM115 - read from while the object lives
        self._fd = self._file.fileno()
        self.size = os.fstat(self._fd).st_size
        for limit in (16 << 20, 1 << 30):  # a header is a few MiB (a vocabulary); read more only if it is not
            self._data, self._at = os.pread(self._fd, min(self.size, limit), 0), 0
            try:
                self._parse()
                break
            except _Short:
                if limit >= self.size:
                    raise GGUFError(f"{self.path.name}: the file ends inside its header (truncated?)") from None
            except (struct.error, IndexError, UnicodeDecodeError, ValueError, KeyError) as exc:
                if isinstance(exc, GGUFError):
                    raise
                if self._at >= len(self._data) - 64 and len(self._data) < self.size:
                    continue
                raise GGUFError(f"{self.path.name}: the GGUF header cannot be read (truncated or damaged?)") from None
        else:
            raise GGUFError(f"{self.path.name}: a header over 1 GiB")
        self._data = b""
        self._parts: list[GGUFFile] = []  # a split model's other parts, open while this is
        if whole:
            try:
                self._join_parts()
            except BaseException:
                self.close()
                raise

    def _join_parts(self) -> None:
        """A split model's other parts opened, their headers checked against their names, their tensors
        added (each with its part); `split.tensors.count` the tensors found in all."""
        try:
            paths = split_parts(self.path, self.fields)
            for number, path in enumerate(paths, 2):
                part = GGUFFile(path, whole=False)
                self._parts.append(part)
                check_part(path, part.fields, number, len(paths) + 1)
                for name, t in part.tensors.items():
                    if name in self.tensors:
                        raise SplitError(f"{path.name}: tensor {name} is in an earlier part too")
                    self.tensors[name] = replace(t, part=number - 1)
        except SplitError as exc:
            raise GGUFError(str(exc)) from None
        want = self.fields.get(SPLIT_TENSORS)
        if paths and want is not None and int(want) != len(self.tensors):
            raise GGUFError(
                f"{self.path.name}: its parts hold {len(self.tensors)} tensors, where its header "
                f"({SPLIT_TENSORS}) says {int(want)}"
            )
        self.size += sum(part.size for part in self._parts)

    def _take(self, fmt: str):
        if self._at + struct.calcsize(fmt) > len(self._data):
            raise _Short
        (value,) = struct.unpack_from(fmt, self._data, self._at)
        self._at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._take("<Q")
        if self._at + n > len(self._data):
            raise _Short
        text = self._data[self._at : self._at + n].decode("utf-8", errors="replace")
        self._at += n
        return text

    def _strings(self, count: int) -> Strings:
        """`count` strings from here, located now and decoded when read."""
        data, first, at, end = self._data, self._at, self._at, len(self._data)
        length = struct.Struct("<Q").unpack_from
        starts, ends = [0] * count, [0] * count
        for i in range(count):
            if at + 8 > end:
                raise _Short
            (n,) = length(data, at)
            starts[i], ends[i] = at + 8 - first, at + 8 + n - first
            at += 8 + n
        if at > end:
            raise _Short
        self._at = at
        return Strings(data[first:at], starts, ends)

    def _value(self, kind: int):
        if kind == STRING:
            return self._string()
        if kind == ARRAY:
            inner, count = self._take("<I"), self._take("<Q")
            if inner == STRING:
                return self._strings(count)
            if inner == ARRAY:
                return [self._value(ARRAY) for _ in range(count)]
            dtype = np.dtype(_NUMPY[inner])
            if self._at + dtype.itemsize * count > len(self._data):
                raise _Short
            values = np.frombuffer(self._data, dtype=dtype, count=count, offset=self._at).copy()
            self._at += dtype.itemsize * count
            return values
        return self._take(_SCALARS[kind])

    def _parse(self) -> None:
        if self._data[:4] != b"GGUF":
            raise GGUFError(f"{self.path.name}: not a GGUF file (it does not start with the GGUF magic bytes)")
        self._at = 4
        version = self._take("<I")
        if version not in (2, 3):
            raise GGUFError(f"{self.path.name}: GGUF version {version}, not 2 or 3")
        n_tensors, n_fields = self._take("<Q"), self._take("<Q")
        self.fields: dict = {}
        for _ in range(n_fields):
            key = self._string()
            self.fields[key] = self._value(self._take("<I"))
        listed = []
        for _ in range(n_tensors):
            name = self._string()
            dims = self._take("<I")
            shape = tuple(int(self._take("<Q")) for _ in range(dims))
            kind, offset = self._take("<I"), self._take("<Q")
            listed.append((name, shape, kind, offset))
        align = int(self.fields.get("general.alignment", 32) or 32)
        start = -(-self._at // align) * align
        self.tensors: dict[str, Tensor] = {}
        for name, shape, kind, offset in listed:
            type_name, per, size = TYPES.get(kind, (f"type {kind}", 0, 0))
            count = 1
            for d in shape:
                count *= d
            n_bytes = count // per * size if per else None
            if n_bytes is not None and start + offset + n_bytes > self.size:
                raise GGUFError(f"{self.path.name}: tensor {name} runs past the end of the file (truncated?)")
            self.tensors[name] = Tensor(name, shape, type_name, start + offset, n_bytes)
        self.arch = str(self.fields.get("general.architecture", ""))

    @property
    def paths(self) -> list[Path]:
        """The files its tensors are in, by `Tensor.part`: this one, then a split model's other parts."""
        return [self.path, *(part.path for part in self._parts)]

    def hp(self, key: str, default=None):
        """`<arch>.<key>`, or `default` where the file does not say."""
        return self.fields.get(f"{self.arch}.{key}", default)

    def read(self, t: Tensor, r0: int, r1: int, into: np.ndarray | None = None) -> np.ndarray:
        """Rows r0..r1 of 2-D tensor `t`'s raw bytes (`[r1 - r0, row bytes]` uint8), read with `pread`;
        `into`: a uint8 buffer to read them into (at least that long), else a new one."""
        row = t.n_bytes // t.rows
        fd = self._fd if t.part == 0 else self._parts[t.part - 1]._fd
        buffer = np.empty((r1 - r0) * row, np.uint8) if into is None else into[: (r1 - r0) * row]
        view, at, done = memoryview(buffer), t.offset + r0 * row, 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], at + done)
            if got <= 0:
                name = self._parts[t.part - 1].path.name if t.part else self.path.name
                raise GGUFError(f"{name}: the file ends inside {t.name} (truncated?)")
            done += got
        return buffer.reshape(r1 - r0, row)

    def vector(self, name: str) -> np.ndarray:
        """A 1-D F32 tensor (a norm's weight, a bias) as float32."""
        t = self.tensors[name]
        if t.type_name != "F32":
            raise GGUFError(f"{self.path.name}: {name} is {t.type_name}, not F32")
        return self.read(replace(t, shape=(t.n_bytes,)), 0, 1).view(np.float32)[0]

    def close(self) -> None:
        for part in getattr(self, "_parts", ()):
            part.close()
        self._file.close()
