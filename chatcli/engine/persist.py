"""A conversation's KV cache on disk, so `chatcli -c` after a restart skips the prefill.

One safetensors file per conversation: the cache's named tensors (`KVCache.state()`),
the ids they hold, and metadata naming the model, runner and dtype that made them.
Loading checks all of that: a file from another model or runner, a damaged file, or
ids that do not match are ignored (the engine then prefills as usual), never trusted.
Files over `max_bytes` are not written; the folder is kept under `folder_budget` by
deleting the least recently written files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from chatcli.engine.runner import KVCache, ModelRunner

MAX_FILE_BYTES = 256 << 20
FOLDER_BUDGET = 2 << 30


def fingerprint(runner: ModelRunner, model_name: str) -> str:
    """What a saved cache must match: the same model, forward, weights' and cache's dtypes."""
    kv = getattr(runner, "kv_dtype", runner.dtype)
    weights = "int8" if getattr(runner, "quantized", False) else runner.dtype
    return f"{model_name}|{type(runner).__name__}|{weights}|kv {kv}|{runner.context_limit}"


def save_cache(cache: KVCache, path: Path, fp: str, max_bytes: int = MAX_FILE_BYTES) -> bool:
    """Write the cache atomically; False when it is empty, unsupported or too large."""
    from safetensors.torch import save_file

    state = cache.state()
    size = sum(t.numel() * t.element_size() for t in state.values())
    if not state or not cache.ids or size > max_bytes:
        path.unlink(missing_ok=True)  # a stale file would no longer match
        return False
    tensors = {name: t.detach().to("cpu") for name, t in state.items()}
    tensors["ids"] = torch.tensor(cache.ids, dtype=torch.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"fingerprint": fp})
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return True


def load_cache(runner: ModelRunner, path: Path, fp: str) -> KVCache | None:
    """A cache restored from `path`, or None when there is none that fits this runner."""
    from safetensors import safe_open

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            if (f.metadata() or {}).get("fingerprint") != fp:
                return None
            state = {name: f.get_tensor(name) for name in f.keys()}
    except Exception:  # noqa: BLE001 - a damaged or foreign file is ignored, not trusted
        return None
    ids = state.pop("ids", None)
    if ids is None:
        return None
    device = runner.device
    state = {name: t.to(device) for name, t in state.items()}
    cache = runner.new_cache()
    return cache if cache.restore(ids.tolist(), state) else None


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
