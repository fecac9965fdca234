"""A GGUF refused before anything reads it, in one line: a later part of a split model (it runs by its
first part) or one whose parts are not all there, or an architecture chatcli does not run.

Without this, a GGUF of an architecture outside the lean families (`mamba`, `rwkv6`, `deepseek2`, …)
went to transformers' GGUF converter, which spent from seconds to minutes before it stopped with its
own text (`You set ignore_mismatched_sizes to False…` for Qwen3-MoE). The architecture is read from the
first key-value pairs of the header (llama.cpp writes `general.architecture` first): a few KiB, no
vocabulary parsed; a model pulled by name is refused so before its download (`pull`: its first 64 KiB,
a range request). `--runner hf` still hands any file to transformers, on purpose.
"""

from __future__ import annotations

import struct
from pathlib import Path

from chatcli.engine.load.options import LoadError

_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type → bytes
_STRING = 8
HEAD_BYTES = 1 << 16  # where the first pairs are: a header's names and numbers, before its vocabulary


def header_architecture(path: Path, head_bytes: int = HEAD_BYTES) -> str | None:
    """`general.architecture` where it is among the header's first pairs (`architecture_of`), else None
    (then nothing is refused: the loader reads the file as before)."""
    try:
        with open(path, "rb") as f:
            return architecture_of(f.read(head_bytes))
    except OSError:
        return None


def architecture_of(head: bytes) -> str | None:
    """`general.architecture` from a GGUF's first bytes, where it comes before any array (llama.cpp
    writes it first); else None."""
    if head[:4] != b"GGUF":
        return None
    try:
        (pairs,) = struct.unpack_from("<Q", head, 16)
        at = 24  # magic, version, tensor count, pair count
        for _ in range(min(pairs, 64)):
            (n,) = struct.unpack_from("<Q", head, at)
            key, at = head[at + 8 : at + 8 + n], at + 8 + n
            (kind,) = struct.unpack_from("<I", head, at)
            at += 4
            if kind == _STRING:
                (n,) = struct.unpack_from("<Q", head, at)
                value, at = head[at + 8 : at + 8 + n], at + 8 + n
                if key == b"general.architecture":
                    return value.decode("utf-8", errors="replace")
            elif kind in _SCALAR_BYTES:
                at += _SCALAR_BYTES[kind]
            else:
                return None
    except struct.error:
        return None
    return None


def runnable_architectures() -> list[str]:
    """The GGUF architectures chatcli runs: those whose config it writes for a lean family."""
    from chatcli.engine.weights.families import LEAN_FAMILIES, MOE_FAMILIES
    from chatcli.engine.weights.gguf_meta import FAMILIES

    return [arch for arch, (model_type, _) in FAMILIES.items() if model_type in (*LEAN_FAMILIES, *MOE_FAMILIES)]


def check_gguf(path: Path, runner: str = "auto") -> None:
    """Raise one LoadError line where `path` cannot be run: a split model's later part or one with a part
    missing (any runner), or an architecture outside `runnable_architectures` (but with `--runner hf`,
    which tries transformers)."""
    from chatcli.engine.weights.gguf_parts import SplitError, parts_of

    try:
        parts_of(path)  # a split model: run by its first part, every part beside it
    except SplitError as exc:
        raise LoadError(str(exc)) from None
    why = refusal(path.name, header_architecture(path)) if runner != "hf" else None
    if why:
        raise LoadError(why)


def refusal(name: str, arch: str | None) -> str | None:
    """The line that refuses `name`, a GGUF of `arch` (None: not known, nothing refused), or None where it runs."""
    runs = runnable_architectures() if arch is not None else []
    if arch is None or arch in runs:
        return None
    return (
        f"{name}: architecture {arch!r} does not run in chatcli (it runs GGUFs of {', '.join(runs)}); "
        "--runner hf tries transformers' GGUF support, which is slow and may fail"
    )
