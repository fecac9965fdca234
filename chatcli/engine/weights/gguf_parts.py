"""A GGUF split into parts, as llama.cpp's `llama-gguf-split` writes it: `PREFIX-00001-of-0000N.gguf` …
`PREFIX-0000N-of-0000N.gguf`, side by side, each a GGUF whose header holds `split.no` (from 0),
`split.count` and `split.tensors.count` (gguf's `Keys.Split`); the first part holds the metadata and
the vocabulary, the tensors are spread over all of them.

A split model is named by its first part, as llama.cpp takes it (`-m PREFIX-00001-of-0000N.gguf`; it
opens the others by the name `PREFIX-%05d-of-%05d.gguf` beside the first). `parts_of` finds the parts
of a path from its name alone (no header read): one line (`SplitError`) where the path is a later part
or a part is missing. `GGUFFile` reads the parts' headers as one (`split_parts` checks that the headers
agree with the names); `identity` names a split model by all its parts' bytes.
"""

from __future__ import annotations

import re
from pathlib import Path

SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"  # gguf.Keys.Split


class SplitError(ValueError):
    """A split model that cannot be read as one: a later part named, a part missing; one line."""


def split_of(path: Path) -> tuple[int, int] | None:
    """(part, parts) from a split model's file name (the part from 1), or None where it is one file."""
    found = SPLIT.search(path.name)
    if found is None or int(found[2]) < 2:
        return None
    return int(found[1]), int(found[2])


def part_path(path: Path, part: int, count: int) -> Path:
    """Part `part` (from 1) of the split model `path` names: llama.cpp's `PREFIX-%05d-of-%05d.gguf`."""
    found = SPLIT.search(path.name)
    prefix = path.name[: found.start()] if found else path.name.removesuffix(".gguf")
    return path.with_name(f"{prefix}-{part:05d}-of-{count:05d}{path.suffix}")


def parts_of(path: Path) -> list[Path]:
    """The files of the model `path` names: itself, or a split model's first part and the rest beside
    it. SplitError where `path` is a later part, or a part is missing."""
    found = split_of(path)
    if found is None:
        return [path]
    part, count = found
    first = part_path(path, 1, count)
    if part != 1:
        raise SplitError(
            f"{path.name} is part {part} of a model split into {count} files: run its first part, "
            f"{first.name} (the others are read from beside it)"
        )
    paths = [part_path(path, i, count) for i in range(1, count + 1)]
    missing = [(i, p) for i, p in enumerate(paths, 1) if i > 1 and not p.is_file()]
    if missing:
        which = ", ".join(f"{i} ({p.name})" for i, p in missing[:3]) + (", …" if len(missing) > 3 else "")
        raise SplitError(
            f"{path.name} is part 1 of a model split into {count} files, and part{'s' if len(missing) > 1 else ''} "
            f"{which} {'are' if len(missing) > 1 else 'is'} missing from {path.parent}"
        )
    return paths


def split_parts(path: Path, fields: dict) -> list[Path]:
    """The other parts to read with the GGUF at `path`, whose header holds `fields` (none where the header
    says it is one file): its name and its `split.*` keys must agree. SplitError otherwise."""
    count = int(fields.get(SPLIT_COUNT, 0) or 0)
    if count < 2:
        return []
    number = int(fields.get(SPLIT_NO, 0) or 0) + 1
    named = split_of(path)
    if named is None or named[1] != count:
        raise SplitError(
            f"{path.name}: its header says it is part {number} of a model split into {count} files, but its name "
            f"is not PREFIX-{number:05d}-of-{count:05d}.gguf as llama-gguf-split names them (rename the parts so)"
        )
    if named[0] != number:
        raise SplitError(f"{path.name}: its name says part {named[0]}, its header (split.no) part {number}")
    return parts_of(path)[1:]


def check_part(path: Path, fields: dict, number: int, count: int) -> None:
    """A later part's header says it is part `number` (from 1) of `count`: SplitError otherwise."""
    got = (int(fields.get(SPLIT_NO, -1)) + 1, int(fields.get(SPLIT_COUNT, 0) or 0))
    if got != (number, count):
        said = f"part {got[0]} of {got[1]}" if got[1] else "not a part of a split model"
        raise SplitError(f"{path.name}: its header says it is {said}, where its name says part {number} of {count}")
