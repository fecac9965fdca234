"""`chatcli pull --verify`: rehash every cached file a model's start reads.

A start trusts a cached file (a lean file, against its sidecar; a GGUF's folders — its metadata,
and its dequantized model where one was made — against their manifests) whose size and mtime are
the ones recorded when it was written, and rehashes only a file whose mtime changed: hashing
hundreds of MB at each start would cost seconds. Bytes changed in place with the mtime put back thus
pass a start; `verify_model_files` rehashes them all, says which are damaged, and removes those so
that they are made again. It sweeps first what a start sweeps (`load.sweep`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from chatcli.engine.load.build import why_not_lean
from chatcli.engine.load.lean import kinds, plan
from chatcli.engine.load.options import LoadOptions, placement
from chatcli.engine.load.sources import each_candidate, resolve
from chatcli.engine.load.sweep import sweep_cache
from chatcli.engine.weights import Status, gguf_convert, sidecar
from chatcli.engine.weights.lean_file import lean_path


@dataclass(frozen=True)
class FileCheck:
    """One file of the cache, rehashed: `problem` says what is wrong ("" where it is intact)."""

    path: Path
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem


def verify_model_files(
    model: str | None = None,
    options: LoadOptions | None = None,
    config_default: str | None = None,
    status: Status | None = None,
    kernel: bool = True,
) -> list[FileCheck]:
    """Rehash every file of the cache that loading `model` (as `load_engine` would, same arguments)
    reads: a GGUF's folders, against their manifests, and the lean file(s), against their sidecars,
    whatever their mtime (a start trusts a file whose size and mtime are as recorded). A damaged file
    is removed (a GGUF's folder with it): the next load that needs it makes it again. Files not made
    yet are not listed. What a start sweeps goes first (`sweep.sweep_cache`: entries whose GGUF is
    gone, killed writers' temporary files). Raises LoadError where the model cannot be found."""
    options = options or LoadOptions()
    status = status or (lambda *_a, **_k: None)
    device, dtype = placement(options)
    sweep_cache()

    def attempt(name: str, explicit: bool) -> list[FileCheck]:
        checks = []
        gguf = Path(os.path.expanduser(name))
        if name.endswith(".gguf") and gguf.is_file():
            for folder in (gguf_convert.meta_folder_for(gguf), gguf_convert.folder_for(gguf)):
                if not folder.is_dir():
                    continue  # a folder not made yet is not a damaged one
                found = [FileCheck(path, problem) for path, problem in gguf_convert.check_folder(folder)]
                checks += found
                if not all(c.ok for c in found):
                    shutil.rmtree(folder, ignore_errors=True)  # made again when next needed
        source = resolve(name, explicit, status)
        if source.folder is None:
            if not explicit:
                raise FileNotFoundError("not in the local Hugging Face cache")  # as load_engine says
            return checks
        if why_not_lean(options, source) is not None:
            return checks  # transformers' runner: no lean file
        native, quantize = plan(source.folder, device, dtype, options.kv_dtype, options.quantize, kernel, source.gguf)
        folder = source.folder  # a GGUF's lean files but its own are those of its dequantized folder
        if source.gguf is not None and quantize != "gguf":
            folder = gguf_convert.folder_for(source.gguf)
        for kind in kinds(native, quantize, dtype):
            path = lean_path(folder, kind)
            if not path.is_file():
                continue
            # the lean file, then its experts' files (weights.gguf_experts: a mixture's, repacked after its first start)
            for found in (path, *sorted(path.parent.glob(f"{path.stem}.experts-*.safetensors"))):
                checks.append(FileCheck(found, sidecar.check(found)))
                if checks[-1].problem:
                    sidecar.remove(found)
        return checks

    return each_candidate(model, config_default, attempt)
