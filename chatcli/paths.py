"""Where chatcli keeps things: the user's config, data and cache dirs (platformdirs), and the names
of the temporary files written there (which say their writer, so a start can sweep a killed one's).

Each dir can be moved with an environment variable — tests point them at temporary folders.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

APP = "chatcli"


def config_file() -> Path:
    """`$CHATCLI_CONFIG`, else `<user config dir>/config.toml`."""
    override = os.environ.get("CHATCLI_CONFIG")
    if override:
        return Path(override)
    from platformdirs import user_config_dir

    return Path(user_config_dir(APP)) / "config.toml"


def data_dir() -> Path:
    """`$CHATCLI_DATA_DIR`, else the user data dir: conversations, KV caches, prompt history."""
    override = os.environ.get("CHATCLI_DATA_DIR")
    if override:
        return Path(override)
    from platformdirs import user_data_dir

    return Path(user_data_dir(APP))


def cache_dir() -> Path:
    """`$CHATCLI_CACHE_DIR`, else the user cache dir: converted GGUF models."""
    override = os.environ.get("CHATCLI_CACHE_DIR")
    if override:
        return Path(override)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir(APP))


# -- temporary files ----------------------------------------------------------
#
# Everything chatcli writes into its own folders (a lean file, a GGUF's folders, a KV cache save, a
# kernel build, a sidecar) is written under a temporary name beside its final one, then renamed into
# place. A process killed mid-write (kill -9, a power cut) leaves that temporary behind, so its name
# says who wrote it: `.<final name>.tmp-<pid>-<host>-<random>`, `<host>` a short hash of the machine's
# name. `sweep_temps` removes the temporaries whose writer is gone: the pid is not running on this
# machine. Where that cannot be asked (another machine's, on a shared home folder; an older chatcli's
# untagged `.<final name>.<random>`; Windows) a temporary untouched for STALE_TEMP_S is taken as dead.

STALE_TEMP_S = 86400
_TAGGED = re.compile(r"^\..+\.tmp-(\d+)-([0-9a-f]{6})-[A-Za-z0-9_]+$")
_UNTAGGED = re.compile(r"^(\..+\.[a-z0-9_]{8}|decode-.+\.[a-z0-9_]{8}\.tmp|\..+\.json\.\d+)$")  # chatcli before tags


@functools.cache
def _host() -> str:
    import hashlib
    import socket

    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def temp_prefix(final: Path) -> str:
    """The start of the name of a temporary for `final`, which tells `sweep_temps` who writes it (the
    `prefix` of `tempfile.mkstemp` / `mkdtemp`, beside `final` in `final.parent`)."""
    return f".{final.name}.tmp-{os.getpid()}-{_host()}-"


def temp_file(final: Path) -> tuple[int, str]:
    """A new temporary file beside `final` (`tempfile.mkstemp`: an open fd and its path), named by
    `temp_prefix`; the caller renames it onto `final` or removes it."""
    import tempfile

    final.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(prefix=temp_prefix(final), dir=final.parent)


def temp_folder(final: Path) -> Path:
    """A new temporary folder beside `final` (`tempfile.mkdtemp`), named by `temp_prefix`."""
    import tempfile

    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=temp_prefix(final), dir=final.parent))


def _running(pid: int) -> bool | None:
    """Whether a process `pid` runs on this machine (None: it cannot be asked here)."""
    if pid == os.getpid():
        return True
    if os.name != "posix":
        return None  # os.kill would end the process there
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process (EPERM)
    return True


def dead_temp(path: Path, now: float | None = None) -> bool:
    """Whether `path` is a temporary (by its name) whose writer is gone: see the rule above."""
    import time

    tagged = _TAGGED.match(path.name)
    if tagged and tagged.group(2) == _host():
        running = _running(int(tagged.group(1)))
        if running is not None:
            return not running
    elif not tagged and not _UNTAGGED.match(path.name):
        return False  # not a temporary
    try:
        return (now or time.time()) - path.lstat().st_mtime > STALE_TEMP_S
    except OSError:
        return False


def sweep_temps(folder: Path) -> int:
    """Remove the temporaries in `folder` (not below it) that a writer no longer running left; the
    bytes freed. A folder that cannot be listed frees nothing."""
    import shutil

    freed = 0
    try:
        entries = list(folder.iterdir())
    except OSError:
        return 0
    for path in entries:
        if not dead_temp(path):
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                freed += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
                shutil.rmtree(path)
            else:
                freed += path.lstat().st_size
                path.unlink()
        except OSError:
            pass  # gone meanwhile, or not ours to remove
    return freed
