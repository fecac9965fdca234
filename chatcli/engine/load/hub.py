"""Models by name: what a name stands for, and which of a repository's GGUFs it picks; the pull itself
is `pull`'s.

A name is a catalogue name (`qwen3:4b`: `catalogue.toml`, shipped in the wheel), `hf.co/USER/REPO[:QUANT]`
(ollama's spelling), `USER/REPO:QUANT` (llama.cpp's `-hf`) or `USER/REPO-GGUF`. The file is picked from
the repository's GGUFs by the quant tag in its name: the one asked for, else (a quant the user did not
type: the default Q4_K_M, or the catalogue's) the nearest in bits per weight. A model split into parts
(`-00001-of-0000N.gguf`) is one choice of all its parts.

The models live in huggingface_hub's cache (`HF_HUB_CACHE`, `HF_HOME`): `cached_files` finds a
repository's there with no network. `models.json` in the data dir remembers the name each file was
last used by, and when (`chatcli models`), and the names it was asked for by.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from chatcli.engine.weights.gguf_parts import SPLIT

DEFAULT_QUANT = "Q4_K_M"  # llama.cpp's and ollama's default
CATALOGUE = Path(__file__).with_name("catalogue.toml")
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:IQ[1-4]_(?:XXS|XS|NL|S|M)|Q[2-8]_K(?:_(?:XL|L|M|S))?|Q[4-8]_[01]|TQ[12]_0|MXFP4"
    r"|BF16|F16|F32))(?![A-Za-z0-9])",
    re.IGNORECASE,
)
# bits per weight of llama.cpp's quant mixes (its `llama-quantize --help`): what "nearest" measures
BITS = {
    "F32": 32, "BF16": 16, "F16": 16, "Q8_0": 8.5, "Q6_K": 6.56, "Q5_1": 6.0, "Q5_K_M": 5.69, "Q5_K_S": 5.54,
    "Q5_0": 5.5, "Q4_1": 5.0, "Q4_K_M": 4.89, "Q4_K_S": 4.58, "Q4_0": 4.5, "IQ4_NL": 4.5, "Q3_K_L": 4.27,
    "IQ4_XS": 4.25, "MXFP4": 4.25, "Q3_K_M": 3.91, "IQ3_M": 3.66, "Q3_K_S": 3.5, "IQ3_S": 3.44, "IQ3_XS": 3.3,
    "IQ3_XXS": 3.06, "Q2_K": 2.96, "IQ2_M": 2.7, "IQ2_S": 2.5, "IQ2_XS": 2.31, "IQ2_XXS": 2.06, "TQ2_0": 2.06,
    "IQ1_M": 1.75, "TQ1_0": 1.69, "IQ1_S": 1.56,
}  # fmt: skip
_REPO = r"[A-Za-z0-9][\w.-]*/[\w.-]+"
_HF = re.compile(rf"(?:https?://)?(?:hf\.co|huggingface\.co)/({_REPO})(?::([\w.-]+))?")
_QUANTED = re.compile(rf"({_REPO}):([\w.-]+)")
_CATALOGUE_LIKE = re.compile(r"[a-z][a-z0-9.-]*:[a-z0-9.-]+")  # qwen3:5b, not a path or a hub id


@functools.cache
def catalogue() -> dict[str, str]:
    """The built-in names: name → "REPO:QUANT"."""
    import tomllib

    return dict(tomllib.loads(CATALOGUE.read_text(encoding="utf-8"))["models"])


@dataclass(frozen=True)
class Ref:
    """A model's name, parsed: its repository, the quant wanted, and whether only that one will do."""

    repo: str
    quant: str
    asked: bool  # typed by the user: that quant or nothing; else the default or the catalogue's (the nearest)
    alias: str | None = None  # the catalogue's name

    def shown(self, quant: str | None) -> str:
        """The name the model is known by once `quant` is picked (a conversation keeps it)."""
        return self.alias or hub_name(self.repo, quant)


def hub_name(repo: str, quant: str | None) -> str:
    """A hub model's name in ollama's spelling: hf.co/USER/REPO:QUANT."""
    return f"hf.co/{repo}" + (f":{quant}" if quant else "")


@dataclass(frozen=True)
class Choice:
    """One model a repository holds: its quant tag and its file (a split model's parts, in order)."""

    quant: str | None
    files: tuple[str, ...]
    size: int


def parse(name: str) -> Ref | None:
    """The hub model `name` stands for, or None where it is not a model's name."""
    text = name.strip()
    if text.lower() in catalogue():
        repo, _, quant = catalogue()[text.lower()].rpartition(":")
        return Ref(repo, quant, False, text.lower())
    for pattern in (_HF, _QUANTED):
        match = pattern.fullmatch(text)
        if match:
            quant = match[2]
            return Ref(match[1], quant.upper() if quant else DEFAULT_QUANT, bool(quant))
    if re.fullmatch(_REPO, text) and text.lower().endswith("-gguf"):
        return Ref(text, DEFAULT_QUANT, False)
    return None


def is_model_name(name: str) -> bool:
    """Whether `name` is meant as a model's name (a catalogue-like one that is not: `model_file` says so)."""
    return parse(name) is not None or bool(_CATALOGUE_LIKE.fullmatch(name.strip()))


def quant_of(path: str) -> str | None:
    """The quant tag in a GGUF's path in its repository (the last one: a folder may be named by it too)."""
    found = _QUANT.findall(path)
    return found[-1].upper() if found else None


def bits(quant: str) -> float:
    """Bits per weight of a quant tag; a K-quant's _L / _XL (unsloth's) a little more than its _M."""
    tag = quant.upper().removeprefix("UD-")
    if tag in BITS:
        return BITS[tag]
    match = re.fullmatch(r"Q(\d)_K(?:_(XL|L))?", tag)
    if match:
        return BITS.get(f"Q{match[1]}_K_M", int(match[1]) + 1.0) + (0.3 if match[2] else 0.0)
    return 0.0


def choices(files: dict[str, int]) -> list[Choice]:
    """The models among a repository's files (path → size): each GGUF, a split model's parts as one
    (only where every part is there), projectors (mmproj) left out."""
    groups: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for path in sorted(files):
        if not path.lower().endswith(".gguf") or "mmproj" in path.lower():
            continue
        split = SPLIT.search(path)
        key = path[: split.start()] + ".gguf" if split else path
        groups.setdefault(key, []).append(path)
        counts[key] = int(split[2]) if split else 1
    return [
        Choice(quant_of(key), tuple(parts), sum(files[p] for p in parts))
        for key, parts in groups.items()
        if len(parts) == counts[key]
    ]


def pick(found: list[Choice], quant: str, exact: bool) -> Choice | None:
    """The model of `quant`; else (not `exact`) the nearest in bits per weight, more bits on a tie (a
    repository without tags: its one model)."""
    for choice in found:
        if choice.quant == quant:
            return choice
    tagged = [c for c in found if c.quant]
    if exact:
        return None
    if not tagged:
        return found[0] if len(found) == 1 else None
    return min(tagged, key=lambda c: (abs(bits(c.quant) - bits(quant)), -bits(c.quant)))


def repo_folder(repo: str) -> Path:
    """The repository's folder in huggingface_hub's cache (`models--USER--REPO`)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")


def cached_files(repo: str) -> dict[str, Path]:
    """The repository's GGUFs in the local cache: path in the repository → the snapshot's file (the
    newest snapshot's where several hold it); a link whose blob is gone is left out."""
    found: dict[str, Path] = {}
    snapshots = repo_folder(repo) / "snapshots"
    for snapshot in sorted(snapshots.glob("*"), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else ():
        for path in snapshot.rglob("*.gguf"):
            if path.is_file():
                found[path.relative_to(snapshot).as_posix()] = path
    return found


def local_choice(ref: Ref, typed: str = "") -> tuple[Choice, list[Path]] | None:
    """The model `ref` names where it is on disk (no network), with its files: by its quant, or the one
    a pull by the name `typed` took (the nearest to a quant the repository lacks)."""
    files = cached_files(ref.repo)
    found = choices({k: p.stat().st_size for k, p in files.items()})
    chosen = pick(found, ref.quant, exact=ref.asked)
    if chosen is None:
        seen = records()
        chosen = next((c for c in found if typed in seen.get(f"{ref.repo}/{c.files[0]}", {}).get("typed", ())), None)
    return (chosen, [files[f] for f in chosen.files]) if chosen else None


def records_path() -> Path:
    from chatcli.paths import data_dir

    return data_dir() / "models.json"


def records() -> dict:
    """`models.json`: "REPO/FILE" → {"name": the name it is shown by, "used": when it was last used (epoch
    seconds), "typed": the names it was asked for by}."""
    try:
        found = json.loads(records_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def remember(repo: str, file: str, shown: str | None, typed: str = "") -> None:
    """Record that `repo`'s `file` was used now, asked for as `typed`, shown as `shown` (None: forget it);
    a data dir that cannot be written is no reason to refuse the model."""
    found = records()
    key = f"{repo}/{file}"
    if shown is None:
        found.pop(key, None)
    else:
        typed_before = found.get(key, {}).get("typed", []) if isinstance(found.get(key), dict) else []
        found[key] = {"name": shown, "used": time.time(), "typed": sorted({*typed_before, typed} - {""})}
    path = records_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(found, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
