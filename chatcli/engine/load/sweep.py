"""What a start removes from chatcli's folders: what killed processes and vanished models left.

- the temporary files and folders of writers no longer running (`paths.sweep_temps`: a lean file,
  a GGUF's folder or a kernel build cut off mid-write, a KV cache save, a sidecar or the identity
  index being replaced), in the cache dir, its `gguf/`, `converted/`, `kernels/` and lean folders,
  and the data dir's `kv/` (`chat.saved.kv_path`: it is then kept within its budget when a save
  is written, `kv.persist.trim_folder`);
- a GGUF's folders that no GGUF file has any more (`gguf_convert.sweep`), then the lean folders of
  models whose folder is gone (`lean_file.sweep`).

Listings, stats and a few small JSON reads, nothing hashed: 0.36 ms a sweep over two GGUFs' entries
(`sweep_cache()` timed 20 times in a loop, 2026-12-06). A load sweeps before it (room for a
conversion) and after it (`load.build`); `chatcli pull --verify` sweeps first.
"""

from __future__ import annotations

from pathlib import Path

from chatcli.engine.weights import gguf_convert, lean_file


def sweep_cache() -> list[Path]:
    """Sweep (see the module docstring); the cache folders removed."""
    from chatcli.paths import cache_dir, data_dir, sweep_temps

    for folder in (cache_dir(), cache_dir() / "kernels", data_dir() / "kv"):
        sweep_temps(folder)
    return gguf_convert.sweep() + lean_file.sweep()
