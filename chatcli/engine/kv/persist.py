"""A conversation's KV cache on disk, so `chatcli -c` after a restart skips the prefill.

One safetensors file per conversation: the cache's named arrays (`KVCache.state()`), the
ids they hold, and metadata naming the model, runner and dtype that made them. Loading
checks all of that: a file from another model or runner, a damaged file, or ids that do not
match are ignored (the engine then prefills as usual), never trusted. Files over `max_bytes`
are not written; the folder is kept under `folder_budget` by deleting the least recently
written files. No torch here: the arrays are numpy (`tensorfile` reads and writes them).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chatcli.engine.kv.cache import KVCache

MAX_FILE_BYTES = 256 << 20
FOLDER_BUDGET = 2 << 30


def fingerprint(runner, model_name: str) -> str:
    """What a saved cache must match: the same model, forward (a `ModelRunner`), weights' and cache's dtypes."""
    kv = str(getattr(runner, "kv_dtype", runner.dtype)).removeprefix("torch.")
    weights = runner.weights_dtype
    return f"{model_name}|{type(runner).__name__}|{weights}|kv {kv}|{runner.context_limit}"


def save_cache(cache: KVCache, path: Path, fp: str, max_bytes: int = MAX_FILE_BYTES) -> bool:
    """Write the cache atomically; False when it is empty, unsupported or too large."""
    import numpy as np

    from chatcli.engine.weights.tensorfile import write_tensors

    state = cache.state()
    size = sum(array.nbytes for _, array in state.values())
    if not state or not cache.ids or size > max_bytes:
        path.unlink(missing_ok=True)  # a stale file would no longer match
        return False
    tensors = {name: value for name, value in state.items()}
    tensors["ids"] = np.asarray(cache.ids, dtype=np.int64)
    write_tensors(path, tensors, {"fingerprint": fp}, align=False)
    return True


def load_cache(runner, path: Path, fp: str) -> KVCache | None:
    """A cache restored from `path`, or None when there is none that fits this runner (its `new_cache()`)."""
    from chatcli.engine.weights.tensorfile import MappedTensors

    if not path.is_file():
        return None
    try:
        f = MappedTensors(path)
        if f.metadata.get("fingerprint") != fp or "ids" not in f or f.tensors["ids"].dtype != "I64":
            return None
        ids = [int(i) for i in f.array("ids")]
        state = {name: (info.dtype, f.array(name)) for name, info in f.tensors.items() if name != "ids"}
        cache = runner.new_cache()
        return cache if cache.restore(ids, state) else None
    except Exception:  # noqa: BLE001 - a damaged or foreign file is ignored, not trusted
        return None


def trim_folder(folder: Path, budget: int = FOLDER_BUDGET) -> None:
    """Delete the least recently written cache files until the folder fits `budget`."""
    try:
        files = sorted(folder.glob("*.safetensors"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
    except OSError:
        return
    for p in files:
        if total <= budget:
            break
        try:
            total -= p.stat().st_size
            p.unlink()
        except OSError:
            pass
