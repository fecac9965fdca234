"""Where chatcli keeps things: the user's config, data and cache dirs (platformdirs).

Each can be moved with an environment variable — tests point them at temporary folders.
"""

from __future__ import annotations

import os
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
