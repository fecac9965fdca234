"""The compiled decode step (`decode.cpp`), built once per machine and loaded with ctypes.

There are four builds of the same source: AVX-512 with VNNI (`simd.h`, `attention.h`,
`project.h`; K-quant prompt chunks on AMX's tiles where the CPU has them, `project_amx.h`), AVX2 with
FMA and F16C (their `_avx2` twins), the same with AVX-VNNI's 256-bit int8 dots (`avxvnni`: Alder Lake
and later, Zen 5) and aarch64 NEON with the dot-product extension (their `_neon` twins); a CPU gets the
first it can run, and each computes every row alone with exact integer dots, so any keeps drafts exact
and all give the same bits but for rounding in rope (x86's g++ fuses it, aarch64's does not).
A decode step (a call of fewer than 16 rows) on a negative number of threads runs its stages without
barriers (`tolerant.h`: a thread does the items of one the scheduler has taken off its core) on threads
of the kernel's own while the caller's sleeps (`pool.h`); runners/team.py picks that where another
process keeps a core busy. `CHATCLI_TOLERANT=off` keeps barriers.
The source (with the headers beside it) is compiled with the system's C++ compiler into the
user cache dir, named by the build, a digest of the sources, the flags and the compiler, so an
edit or a new compiler builds anew and a build is never half-written (a temporary file renamed
into place). A sidecar (`decode-….json`, written after the rename) records the build's size and
BLAKE3 (an older chatcli's, its SHA-256: still checked so, `sidecar.matches`); each load checks both
before `ctypes.CDLL` maps the file (`sidecar.check` on an 836 KB AVX-512 build: 0.21 ms, 0.54 ms against
a SHA-256 record; the best of 5 × 2,000 in a timeit loop on the AMD EPYC here, 2026-12-07), and a build
that does not match — truncated, damaged, or from a chatcli that wrote no sidecar — is built again
first: a damaged file is never mapped (a truncated one would crash the process with a bus error). It is linked
against OpenMP by soname (`libgomp.so.1`): in a process that has torch, the kernel shares
torch's runtime; in one that has not, the system's, which a torch imported later then
shares too (the loader reuses a loaded soname). Two runtimes would fight over the cores.
On macOS (`macos.py`: untested on a Mac) Apple's clang builds it against libomp, torch's
`libomp.dylib` where torch ships one, and the loaded runtimes are listed through dyld.

`library()` returns the loaded library, or None with `why_not()` saying why in one line:
no AVX2 (or FMA, F16C; on ARM no ASIMD dot products), no compiler, no libomp (macOS), a failed
build, a second OpenMP runtime (a torch whose libgomp has another name), or `CHATCLI_KERNEL=off`
in the environment (`CHATCLI_KERNEL=avx2` takes the AVX2 build on a CPU that could run the AVX-512
one; `neon` names the ARM build).
Callers then keep the pure-torch path, which stays the reference.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from functools import cache, lru_cache
from pathlib import Path

from chatcli.engine.runners.kernels import macos
from chatcli.engine.weights import sidecar

SOURCE = Path(__file__).with_name("decode.cpp")
FLAGS = [
    "-O3",
    "-std=c++17",
    "-fPIC",
    "-shared",
    "-fopenmp",
    "-ffp-contract=off",  # no implicit FMAs: a row's sums round the same in every template instance
]
BUILDS = {  # best first: each build's compiler flags and the /proc/cpuinfo names it needs
    "avx512": (
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mfma"],
        ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "fma"),
    ),
    "avxvnni": (["-mavx2", "-mfma", "-mf16c", "-mavxvnni"], ("avx2", "fma", "f16c", "avx_vnni")),  # AVX2's, VNNI dots
    "avx2": (["-mavx2", "-mfma", "-mf16c"], ("avx2", "fma", "f16c")),
    "neon": (["-march=armv8.2-a+dotprod"], ("asimd", "asimddp")),  # aarch64: SDOT
}
ENV = "CHATCLI_KERNEL"  # "off": never build or load (the torch path runs); a build's name: that build

_reason = ""
_build = ""


def why_not() -> str:
    """Why `library()` gave None (empty when it did not)."""
    return _reason


def build_name() -> str:
    """The build `library()` loaded ("avx512", "avxvnni", "avx2" or "neon"; empty when it gave None)."""
    return _build if library() is not None else ""


def runnable() -> list[str]:
    """The builds this CPU can run, best first."""
    from chatcli.engine.cpu import cpu_flags

    return [name for name, (_, needs) in BUILDS.items() if set(needs) <= cpu_flags()]


def missing_cpu_flags() -> list[str]:
    """What the kernel needs that this CPU lacks (empty where a build can run): the least build's
    needs for this CPU's architecture (NEON's on ARM, AVX2's elsewhere)."""
    from chatcli.engine.cpu import cpu_flags

    return [f for f in BUILDS[_fallback()][1] if f not in cpu_flags()]


def _fallback() -> str:
    """The build of this architecture that asks the least of its CPU."""
    from chatcli.engine.cpu import is_arm

    return "neon" if is_arm() else "avx2"


STALE_S = 7 * 86400  # other builds unused this long are removed (another install may still use a newer one)


def compiler() -> list[str] | None:
    """The C++ compiler's command: `$CXX` (which may carry arguments, e.g. `ccache g++`), else g++ (on
    macOS clang++, Apple's: its g++ is the same clang)."""
    if os.environ.get("CXX"):
        return shlex.split(os.environ["CXX"])
    names = ("clang++", "c++", "g++") if sys.platform == "darwin" else ("g++", "c++", "clang++")
    found = next(filter(None, map(shutil.which, names)), None)
    return [found] if found else None


def compile_flags(name: str) -> list[str]:
    """The compiler's flags for a build (a key of BUILDS): FLAGS and the build's own; on macOS as Apple's
    clang takes them, with libomp (`macos.flags`)."""
    if sys.platform == "darwin":
        return macos.flags(FLAGS) + BUILDS[name][0]
    return FLAGS + BUILDS[name][0]


def library_path(cxx: list[str], build_name: str | None = None) -> Path:
    """Where the build (this CPU's best by default) for these sources, flags and compiler lives. The
    compiler is named by its command and its binary's path, size and mtime (a stat, not a `--version`
    run at each start)."""
    from chatcli.paths import cache_dir

    binary = shutil.which(cxx[0]) or cxx[0]
    try:
        st = os.stat(binary)
        compiler_id = f"{' '.join(cxx)}|{os.path.realpath(binary)}|{st.st_size}|{st.st_mtime_ns}"
    except OSError:
        compiler_id = " ".join(cxx)
    sources = SOURCE.read_bytes() + b"".join(h.read_bytes() for h in sorted(SOURCE.parent.glob("*.h")))
    name = build_name or _best()
    flags = " ".join(compile_flags(name))
    digest = hashlib.sha256(sources + flags.encode() + compiler_id.encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"decode-{name}-{digest}.so"


def _best() -> str:
    builds = runnable()
    return builds[0] if builds else _fallback()


def build(cxx: list[str], target: Path, build_name: str | None = None) -> None:
    """Compile the source into `target` (seconds; the build is this CPU's best by default); raises
    RuntimeError with the compiler's first error."""
    from chatcli.paths import temp_file

    fd, tmp = temp_file(target)  # a killed build's is swept by a later one (`_prune`) and by a start
    os.close(fd)
    try:
        flags = compile_flags(build_name or _best())
        done = subprocess.run([*cxx, *flags, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=300)
        setup = macos.compiler_error(done.stderr or "") if done.returncode != 0 and sys.platform == "darwin" else None
        if setup:
            raise RuntimeError(setup)
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
            raise RuntimeError(f"{Path(cxx[0]).name} failed: {errors[0] if errors else 'exit ' + str(done.returncode)}")
        os.replace(tmp, target)
        sidecar.record(target)
        _prune(target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def intact(target: Path) -> bool:
    """The build is the one its sidecar recorded (size and hash, rehashed); False where either is missing."""
    return not sidecar.check(target)


def _prune(keep: Path) -> None:
    """Remove other builds (with their sidecars) not touched for STALE_S, the temporary files of
    builds whose process is gone (`paths.sweep_temps`), and sidecars whose build is gone."""
    from chatcli.paths import sweep_temps

    sweep_temps(keep.parent)
    now = time.time()
    for old in [*keep.parent.glob("decode-*.so"), *keep.parent.glob("decode-*.tmp")]:
        try:
            if old != keep and now - old.stat().st_mtime > STALE_S:
                sidecar.remove(old)
        except OSError:
            pass
    for side in keep.parent.glob("decode-*.json"):
        if not side.with_suffix(".so").exists():
            side.unlink(missing_ok=True)


def openmp_runtimes() -> set[str]:
    """The OpenMP runtime files mapped into this process (one expected: torch's), from /proc/self/maps.
    macOS has no /proc: there dyld lists the images it loaded (`macos.openmp_runtimes`: libomp, libgomp,
    libiomp by real path), so a kernel linked against Homebrew's libomp beside torch's own is seen as
    two. Untested on a Mac; where neither can be read, the set is empty and the check passes."""
    if sys.platform == "darwin":
        return macos.openmp_runtimes()
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            return {os.path.realpath(line.split()[-1]) for line in f if "libgomp" in line and "/" in line}
    except OSError:
        return set()


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The compiled decode step (the best build this CPU runs, or `CHATCLI_KERNEL`'s), built first if
    need be; None where it cannot run here."""
    global _reason, _build
    wanted = os.environ.get(ENV, "").lower()
    if wanted in ("off", "0", "no", "false"):
        _reason = f"{ENV}=off"
        return None
    missing = missing_cpu_flags()
    if missing:
        _reason = f"the CPU lacks {', '.join(missing)}"
        return None
    name = wanted if wanted in BUILDS else _best()
    if name not in runnable():
        from chatcli.engine.cpu import cpu_flags

        _reason = f"{ENV}={wanted}: the CPU lacks {', '.join(f for f in BUILDS[name][1] if f not in cpu_flags())}"
        return None
    lib, _reason = load(name)
    _build = name
    if lib is not None and len(openmp_runtimes()) > 1:  # torch's libgomp has another soname: a second runtime
        _reason = "the kernel would run a second OpenMP runtime beside torch's"
        return None
    return lib


@cache
def load(name: str) -> tuple[ctypes.CDLL | None, str]:
    """Build `name` (a key of BUILDS) where need be and load it: (the library, "") or (None, why not in
    one line). Loading it with another OpenMP runtime mapped is `library()`'s check."""
    cxx = compiler()
    if cxx is None:
        return None, macos.NO_COMPILER if sys.platform == "darwin" else "no C++ compiler (g++) found"
    if sys.platform == "darwin" and macos.why_not_openmp():
        return None, macos.why_not_openmp()
    try:
        target = library_path(cxx, name)
        try:
            lib = _checked_load(cxx, target, name)
        except OSError:  # removed or broken in between: build it once more
            build(cxx, target, name)
            lib = _checked_load(cxx, target, name, rebuild=False)
        os.utime(target)  # in use: not stale
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"the decode kernel did not build: {exc}"
    _declare(lib)
    return lib, ""


def _checked_load(cxx: list[str], target: Path, name: str, rebuild: bool = True) -> ctypes.CDLL:
    """Map `target` once it matches its sidecar, building it (again) first where it does not: a
    missing, truncated or damaged build, or one from a chatcli that wrote no sidecar."""
    if not intact(target):
        if not rebuild:
            raise RuntimeError(f"{target.name} does not match its record")
        build(cxx, target, name)
        if not intact(target):  # another process replaced it in between: never map what failed the check
            raise RuntimeError(f"{target.name} does not match its record after the build")
    return ctypes.CDLL(str(target))


def _declare(lib: ctypes.CDLL) -> None:
    from chatcli.engine.runners.kernels.structs import Cache, Matrix, Model, Segment

    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.chatcli_decode.argtypes = [
        ctypes.POINTER(Model),
        ctypes.POINTER(Cache),
        ptr,
        i64,
        i64,
        ptr,
        i64,
        ctypes.c_int32,
    ]
    lib.chatcli_decode.restype = ctypes.c_int
    lib.chatcli_decode_batch.argtypes = [ctypes.POINTER(Model), ctypes.POINTER(Segment), i64, ptr, ptr, ctypes.c_int32]
    lib.chatcli_decode_batch.restype = ctypes.c_int
    lib.chatcli_project.argtypes = [ctypes.POINTER(Matrix), ptr, i64, ptr, ctypes.c_int32]
    lib.chatcli_project.restype = ctypes.c_int
    lib.chatcli_pack.argtypes = [ctypes.c_int32, ptr, i64, i64, ptr, ptr, ptr, ptr, ptr, ptr]
    lib.chatcli_pack.restype = ctypes.c_int
    lib.chatcli_tolerant.argtypes = [ctypes.c_int32, i64]
    lib.chatcli_tolerant.restype = ctypes.c_int
    lib.chatcli_taken_over.argtypes = []
    lib.chatcli_taken_over.restype = i64
    lib.chatcli_split_units.argtypes = []
    lib.chatcli_split_units.restype = i64
    lib.chatcli_fail_thread.argtypes = [ctypes.c_int32]
    lib.chatcli_fail_thread.restype = None
