"""What this CPU can do, read once from /proc/cpuinfo (empty where that file is missing)."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The first CPU's feature names: x86's `flags` line (avx2, avx512_vnni, ...) or aarch64's
    `Features` line (asimd, asimddp, ...)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            line = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


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
    """Physical cores among the CPUs this process may run on (SMT siblings counted once), as torch counts."""
    import os

    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
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
