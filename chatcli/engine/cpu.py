"""What this CPU can do, read once: Linux's /proc/cpuinfo, macOS's `sysctl` (one run), else nothing."""

from __future__ import annotations

import os
import sys
from functools import lru_cache

CPUINFO = "/proc/cpuinfo"
# macOS's sysctl names where they differ from Linux's /proc/cpuinfo names (the rest: lower-cased)
MAC_NAMES = {"avx1.0": "avx", "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16", "avxvnni": "avx_vnni"}


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The first CPU's feature names: x86's `flags` line (avx2, avx512_vnni, ...) or aarch64's
    `Features` line (asimd, asimddp, ...); on macOS the same names from `sysctl`. Empty where none can
    be read (the kernel then stays off, saying what the CPU lacks)."""
    try:
        with open(CPUINFO, encoding="utf-8") as f:
            line = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return _mac_flags() if sys.platform == "darwin" else frozenset()
    return frozenset(line.partition(":")[2].split())


def _sysctl(*names: str) -> str:
    """`sysctl -n NAMES`' output ("" where it cannot run; a name it lacks is left out of it)."""
    import subprocess

    try:
        return subprocess.run(["sysctl", "-n", *names], capture_output=True, text=True, timeout=10).stdout or ""
    except (OSError, subprocess.SubprocessError, ValueError):
        return ""


def _mac_flags() -> frozenset[str]:
    """macOS: Apple Silicon has ASIMD always, its dot products where `hw.optional.arm.FEAT_DotProd` is 1
    (every M-series chip); an Intel Mac lists its features in upper case (`AVX2 FMA F16C AVX512VNNI`)."""
    if is_arm():
        dot = _sysctl("hw.optional.arm.FEAT_DotProd").strip() == "1"
        return frozenset({"asimd", "asimddp"} if dot else {"asimd"})
    names = _sysctl("machdep.cpu.features", "machdep.cpu.leaf7_features").lower().split()
    return frozenset(MAC_NAMES.get(name, name) for name in names)


def is_arm() -> bool:
    """An aarch64 (ARM64) CPU."""
    import platform

    return platform.machine().lower() in ("aarch64", "arm64")


def has_native_bf16() -> bool:
    """bf16 matmuls in hardware (AMX or AVX-512 BF16): attention over a bf16 cache beats fp32."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


def has_vnni() -> bool:
    """int8 dot products that accumulate in int32 (AVX-512 VNNI or AVX-VNNI)."""
    return bool({"avx512_vnni", "avx_vnni"} & cpu_flags())


@lru_cache(maxsize=1)
def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (SMT siblings counted once), as torch counts.
    macOS has no affinity call and no /sys: `sysctl -n hw.physicalcpu` (performance and efficiency cores)."""
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        if sys.platform == "darwin":
            found = _sysctl("hw.physicalcpu").strip()
            if found.isdigit() and int(found) > 0:
                return int(found)
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        try:
            topology = f"/sys/devices/system/cpu/cpu{cpu}/topology"
            with open(f"{topology}/physical_package_id") as f, open(f"{topology}/core_id") as g:
                cores.add((f.read().strip(), g.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))
