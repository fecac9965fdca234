"""The compiled kernel on macOS: what Apple's clang needs to build it, and which OpenMP runtimes a
process has loaded. Untested on a Mac (none where chatcli is made): each path is tested on Linux with
the platform faked (tests/test_kernel_macos.py), never compiled or loaded by a real Apple clang.

Apple's clang has no OpenMP runtime of its own: it takes `-Xpreprocessor -fopenmp` and libomp's
header and library from elsewhere. The header comes from Homebrew's libomp (`brew install libomp`)
or from torch where its wheel ships one; the library linked is the `libomp.dylib` torch ships
(`torch/lib`, found without importing torch) where there is one, so that the kernel and torch run one
OpenMP runtime (the kernel names it `@rpath/libomp.dylib`, its rpath torch's folder: the image torch
loads), else Homebrew's. A shared library is `-dynamiclib`; the kernel keeps its `.so` name (dlopen
reads the file, whatever it is called).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

BREW_LIBOMP = ("/opt/homebrew/opt/libomp", "/usr/local/opt/libomp")  # Apple Silicon's Homebrew, Intel's
NO_OPENMP = "no OpenMP runtime for Apple's clang (brew install libomp)"
NO_TOOLS = "no Xcode command line tools (xcode-select --install)"
NO_COMPILER = "no C++ compiler (clang++) found: xcode-select --install"
OPENMP_NAMES = ("libomp", "libgomp", "libiomp")  # LLVM's (torch's on macOS), GNU's, Intel's


def torch_lib() -> Path | None:
    """torch's `lib` folder, found without importing torch (None where torch is not installed)."""
    from importlib.util import find_spec

    try:
        spec = find_spec("torch")
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent / "lib" if spec is not None and spec.origin else None


def _brew_prefix() -> Path | None:
    """Homebrew's libomp: its usual prefixes, else `brew --prefix libomp` (one run, where brew is)."""
    for prefix in BREW_LIBOMP:
        if Path(prefix, "include", "omp.h").is_file():
            return Path(prefix)
    brew = shutil.which("brew")
    if brew is None:
        return None
    try:
        done = subprocess.run([brew, "--prefix", "libomp"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    prefix = (done.stdout or "").strip()
    return Path(prefix) if done.returncode == 0 and prefix else None


@cache
def libomp() -> tuple[Path | None, Path | None]:
    """(the folder of libomp's `omp.h`, the folder of the `libomp.dylib` to link): torch's library where
    torch ships one, else Homebrew's; None for what neither has."""
    torch, brew = torch_lib(), _brew_prefix()
    headers = [brew / "include"] if brew else []
    libraries = [brew / "lib"] if brew else []
    if torch is not None:
        headers.append(torch.parent / "include")
        libraries.insert(0, torch)
    include = next((d for d in headers if (d / "omp.h").is_file()), None)
    lib = next((d for d in libraries if (d / "libomp.dylib").is_file()), None)
    return include, lib


def why_not_openmp() -> str:
    """Why Apple's clang cannot build the kernel here ("" where libomp's header and library are found)."""
    include, lib = libomp()
    return "" if include and lib else NO_OPENMP


def flags(linux: list[str]) -> list[str]:
    """The kernel's Linux flags (`kernels.FLAGS`) as Apple's clang takes them: `-dynamiclib`, OpenMP
    through the preprocessor and libomp (`libomp()`) linked with its folder as the rpath."""
    out = []
    for flag in linux:
        out += {"-shared": ["-dynamiclib"], "-fopenmp": ["-Xpreprocessor", "-fopenmp"]}.get(flag, [flag])
    include, lib = libomp()
    if include:
        out.append(f"-I{include}")
    if lib:
        out += [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lomp"]
    return out


def compiler_error(stderr: str) -> str | None:
    """A failed build's cause where it is the Mac's setup, not the source: the command line tools or
    libomp missing (None otherwise)."""
    if "xcrun: error" in stderr or "active developer path" in stderr:
        return NO_TOOLS
    if "'omp.h' file not found" in stderr or "library not found for -lomp" in stderr:
        return NO_OPENMP
    return None


def loaded_images() -> list[str]:
    """The paths of the images (libraries) dyld has loaded into this process (`_dyld_image_count`,
    `_dyld_get_image_name`: macOS has no /proc/self/maps); empty where they cannot be listed."""
    try:
        dyld = ctypes.CDLL(None)
        count, name = dyld._dyld_image_count, dyld._dyld_get_image_name
    except (OSError, AttributeError):
        return []
    count.restype, name.restype, name.argtypes = ctypes.c_uint32, ctypes.c_char_p, [ctypes.c_uint32]
    return [path.decode(errors="replace") for path in map(name, range(count())) if path]


def openmp_runtimes() -> set[str]:
    """The OpenMP runtime files dyld has loaded (each by its real path)."""
    return {os.path.realpath(p) for p in loaded_images() if os.path.basename(p).startswith(OPENMP_NAMES)}
