"""What a start removes from chatcli's folders: what killed processes left.

The temporary files and folders of writers no longer running (`paths.sweep_temps`: a lean file,
a GGUF's folder or a kernel build cut off mid-write, a KV cache save, a sidecar being replaced), in
the cache dir, its `gguf/`, `converted/`, `kernels/` and lean folders (`lean_file.sweep`, which also
removes the lean folders of models whose folder is gone), and the data dir's `kv/`
(`chat.saved.kv_path`: it is then kept within its budget when a save is written,
`kv.persist.trim_folder`). Listings and stats: nothing is read or hashed.
`chatcli pull --verify` sweeps the same way first.
"""

from __future__ import annotations

from pathlib import Path

from chatcli.engine.weights import lean_file


def sweep_cache() -> list[Path]:
    """Sweep (see the module docstring); the cache folders removed."""
    from chatcli.paths import cache_dir, data_dir, sweep_temps

    for folder in (cache_dir(), cache_dir() / "gguf", cache_dir() / "converted", cache_dir() / "kernels"):
        sweep_temps(folder)
    sweep_temps(data_dir() / "kv")
    return lean_file.sweep()
