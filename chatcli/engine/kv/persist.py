"""A conversation's KV cache on disk, so `chatcli -c` after a restart skips the prefill.

One safetensors file per conversation: the cache's named arrays (`KVCache.state()`), the
ids they hold, and metadata naming the model, runner and dtype that made them, with a SHA-256
of the contents (`checksum`: every array's name, dtype, shape and bytes, ids included, names in
sorted order). Loading checks all of that: a file from another model or runner, one without a
checksum (an older chatcli's), or ids that do not match are ignored (the engine then prefills
as usual), never trusted; a damaged one (unreadable, or its contents not matching the
checksum) is ignored too, and `read_cache` says so (`DAMAGED`), so the front ends can tell the
user. Files over `max_bytes` are not written; the folder is kept under `folder_budget` (every file
in it counted, a save being written too) by deleting the least recently written saves, after the
temporary files of saves killed mid-write (`paths.sweep_temps`). No torch here: the arrays are numpy (`tensorfile`
reads and writes them). The checksum costs one pass over the bytes at save and at load: ~70 ms
for 100 MiB on a CPU with SHA instructions (OpenSSL's SHA-256, ~1.5 GB/s), a few times that without.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from chatcli.errors import one_line

if TYPE_CHECKING:
    from chatcli.engine.kv.cache import KVCache

MAX_FILE_BYTES = 256 << 20
FOLDER_BUDGET = 2 << 30
CHECKSUM_KEY = "sha256"  # the metadata key of `checksum`; a file without it is not used
DAMAGED = "saved KV cache was damaged, prefilled again"  # the note a damaged file leaves (TurnStats.note)


def fingerprint(runner, model_name: str) -> str:
    """What a saved cache must match: the same model, forward (a `ModelRunner`), weights' and cache's dtypes."""
    kv = str(getattr(runner, "kv_dtype", runner.dtype)).removeprefix("torch.")
    weights = runner.weights_dtype
    return f"{model_name}|{type(runner).__name__}|{weights}|kv {kv}|{runner.context_limit}"


def checksum(tensors: dict[str, tuple[str, object]]) -> str:
    """SHA-256 (hex) of `tensors` ({name: (safetensors dtype code, numpy array)}): each name, dtype,
    shape and the array's bytes, in sorted name order, so that any flipped byte changes it."""
    import numpy as np

    digest = hashlib.sha256()
    for name in sorted(tensors):
        code, array = tensors[name]
        array = np.ascontiguousarray(array)
        digest.update(f"{name}\0{code}\0{','.join(map(str, array.shape))}\0".encode())
        digest.update(array.reshape(-1).view(np.uint8))  # hashlib reads the buffer in place, GIL released
    return digest.hexdigest()


def save_cache(cache: KVCache, path: Path, fp: str, max_bytes: int = MAX_FILE_BYTES) -> bool:
    """Write the cache atomically, with its `checksum`; False when it is empty, unsupported or too large.
    A failed write raises what the writer raised (an OSError for an I/O error: `tensorfile`)."""
    import numpy as np

    from chatcli.engine.weights.tensorfile import CODES, write_tensors

    state = cache.state()
    size = sum(array.nbytes for _, array in state.values())
    if not state or not cache.ids or size > max_bytes:
        path.unlink(missing_ok=True)  # a stale file would no longer match
        return False
    ids = np.asarray(cache.ids, dtype=np.int64)
    tensors = {name: value for name, value in state.items()}
    tensors["ids"] = (CODES[ids.dtype.name], ids)
    write_tensors(path, tensors, {"fingerprint": fp, CHECKSUM_KEY: checksum(tensors)}, align=False)
    return True


def read_cache(runner, path: Path, fp: str) -> tuple[KVCache | None, str]:
    """A cache restored from `path` (None when there is none that fits this runner: its
    `new_cache()`), and a note for the user: `DAMAGED` where the file was there but unreadable or
    its contents do not match its checksum, else "" (no file, another model's or runner's, or an
    older chatcli's without a checksum: ignored silently)."""
    from chatcli.engine.weights.tensorfile import MappedTensors, TensorFileError

    if not path.is_file():
        return None, ""
    try:
        f = MappedTensors(path)
    except (TensorFileError, ValueError):
        return None, DAMAGED  # written atomically by chatcli, so not a safetensors file any more
    except OSError:
        return None, ""  # unreadable (permissions): nothing to say about its contents
    try:
        if f.metadata.get("fingerprint") != fp:
            return None, ""
        expected = f.metadata.get(CHECKSUM_KEY)
        if not expected:
            return None, ""
        tensors = {name: (info.dtype, f.array(name)) for name, info in f.tensors.items()}
        if checksum(tensors) != expected:
            return None, DAMAGED
        if "ids" not in f or f.tensors["ids"].dtype != "I64":
            return None, ""
        ids = [int(i) for i in tensors.pop("ids")[1]]
        cache = runner.new_cache()
        return (cache if cache.restore(ids, tensors) else None), ""
    except Exception:  # noqa: BLE001 - a file that does not fit is ignored, not trusted
        return None, ""


def trim_folder(folder: Path, budget: int = FOLDER_BUDGET) -> None:
    """Remove the temporary files of saves whose process is gone (`paths.sweep_temps`: a save killed
    mid-write), then delete the least recently written cache files until everything in the folder —
    a save being written by a live process included — fits `budget`."""
    import stat

    from chatcli.paths import sweep_temps

    sweep_temps(folder)
    entries = []
    try:
        for p in folder.iterdir():
            try:
                st = p.stat()
            except OSError:
                continue  # renamed or removed meanwhile
            if stat.S_ISREG(st.st_mode):
                entries.append((p, st))
    except OSError:
        return
    total = sum(st.st_size for _, st in entries)
    for p, st in sorted(entries, key=lambda e: e[1].st_mtime):
        if total <= budget:
            break
        if p.suffix != ".safetensors" or p.name.startswith("."):
            continue  # a live writer's temporary: counted, not removed
        try:
            p.unlink()
            total -= st.st_size
        except OSError:
            pass


def save_session(runner, model_name: str, session, path: Path) -> bool:
    """Write the session's KV cache to `path` (atomically: a failed write leaves no partial file; the
    folder is kept within its budget), for a later start to restore. False when there is nothing worth
    saving (an empty or too large cache); OSError, with a one-line message, whatever made the write fail
    (a full disk: "[Errno 28] No space left on device", from the writer, `tensorfile.write_tensors`)."""
    try:
        saved = save_cache(session.cache, path, fingerprint(runner, model_name))
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - one kind of error for callers, in one line
        raise OSError(f"cannot write the KV cache: {one_line(exc)}") from exc
    trim_folder(path.parent)
    return saved


def restore_session(runner, model_name: str, session, path: Path) -> bool:
    """Give `session` the KV cache saved at `path` when it was made by this model, runner and dtypes;
    False (the session unchanged) for a missing, foreign, older-format or damaged file. A damaged one
    leaves a note (`Session.note`) that the session's next turn's stats carry."""
    cache, note = read_cache(runner, path, fingerprint(runner, model_name))
    if note:
        session.note = note
    if cache is None:
        return False
    session.cache = cache
    return True
