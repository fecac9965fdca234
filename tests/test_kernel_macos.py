"""The compiled kernel's macOS paths, on Linux with the platform faked (there is no Mac here).

`sys.platform` is "darwin", /proc/cpuinfo is missing, and `sysctl`, `brew` and the compiler are fakes
that answer as a Mac's would: the CPU's flags in Linux's names, Apple clang's flags and libomp, the
OpenMP runtimes dyld lists, and every missing piece one line in `why_not()`. Nothing here is compiled
or loaded by a real Apple clang: that stays untested (README).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

import pytest

from chatcli.engine import cpu
from chatcli.engine.runners import kernels, team
from chatcli.engine.runners.kernels import macos

# an Ice Lake MacBook Pro's `sysctl -n machdep.cpu.features machdep.cpu.leaf7_features` (abridged)
INTEL_MAC = (
    "FPU VME DE PSE TSC MSR PAE MCE CX8 APIC SEP MTRR PGE MCA CMOV PAT PSE36 CLFSH DS ACPI MMX FXSR SSE SSE2 SS "
    "HTT TM PBE SSE3 PCLMULQDQ DTES64 MON DSCPL VMX EST TM2 SSSE3 FMA CX16 TPR PDCM SSE4.1 SSE4.2 x2APIC MOVBE "
    "POPCNT AES PCID XSAVE OSXSAVE SEGLIM64 TSCTMR AVX1.0 RDRAND F16C\n"
    "RDWRFSGS TSC_THREAD_OFFSET SGX BMI1 AVX2 FDPEO SMEP BMI2 ERMS INVPCID FPU_CSDS AVX512F AVX512DQ RDSEED ADX "
    "SMAP AVX512IFMA CLFSOPT IPT AVX512CD SHA AVX512BW AVX512VL AVX512VBMI UMIP PKU GFNI VAES VPCLMULQDQ "
    "AVX512VNNI AVX512BITALG AVX512VPOPCNTDQ RDPID SGXLC FSREPMOV MDCLEAR IBRS STIBP L1DF ACAPMSR SSBD\n"
)
# a Haswell-to-Comet Lake Mac: AVX2, no AVX-512
AVX2_MAC = "FPU SSE SSE2 SSE3 SSSE3 FMA SSE4.1 SSE4.2 AVX1.0 F16C\nBMI1 AVX2 BMI2 ERMS\n"


class Commands:
    """A fake `subprocess.run`: each command's (stdout, exit status) by its words, every call kept."""

    def __init__(self, answers: dict[str, tuple[str, int] | BaseException]) -> None:
        self.answers, self.calls = answers, []

    def __call__(self, command, **_kwargs):
        self.calls.append(list(command))
        answer = next((a for words, a in self.answers.items() if words in " ".join(map(str, command))), None)
        if answer is None:
            raise FileNotFoundError(command[0])
        if isinstance(answer, BaseException):
            raise answer
        return subprocess.CompletedProcess(command, answer[1], answer[0], "")


def forget():
    cpu.cpu_flags.cache_clear()
    cpu.physical_cores.cache_clear()
    macos.libomp.cache_clear()


@pytest.fixture
def mac(monkeypatch, tmp_path):
    """This process as a Mac's (an Intel one until a test says arm64), with no /proc/cpuinfo, no brew,
    no torch, its kernel cache under tmp_path; the caches a Mac's answers fill are emptied after."""
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu, "CPUINFO", str(tmp_path / "no-proc" / "cpuinfo"))
    monkeypatch.setattr(macos, "BREW_LIBOMP", (str(tmp_path / "no-brew"),))
    monkeypatch.setattr(macos, "torch_lib", lambda: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(kernels.ENV, raising=False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(kernels, "load", kernels.load.__wrapped__)  # uncached: no real build is reused
    monkeypatch.setattr(kernels, "_reason", kernels._reason)  # library()'s globals, restored after
    monkeypatch.setattr(kernels, "_build", kernels._build)
    forget()
    yield monkeypatch
    forget()


def commands(monkeypatch, answers) -> Commands:
    fake = Commands(answers)
    monkeypatch.setattr(subprocess, "run", fake)
    return fake


def why_not_on_this_mac() -> str:
    assert kernels.library.__wrapped__() is None
    return kernels.why_not()


def test_an_intel_macs_flags_are_linuxs_names_read_once(mac):
    ran = commands(mac, {"machdep.cpu.features machdep.cpu.leaf7_features": (INTEL_MAC, 0)})
    flags = cpu.cpu_flags()
    wanted = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
    assert wanted <= flags and "avx" in flags and cpu.has_vnni()
    assert kernels.runnable() == ["avx512", "avx2"] and not kernels.missing_cpu_flags()
    cpu.cpu_flags()
    assert ran.calls == [["sysctl", "-n", "machdep.cpu.features", "machdep.cpu.leaf7_features"]]  # one run


def test_an_avx2_mac_runs_the_avx2_build(mac):
    commands(mac, {"machdep.cpu": (AVX2_MAC, 0)})
    assert kernels.runnable() == ["avx2"]


def test_apple_silicons_dot_products(mac):
    mac.setattr(platform, "machine", lambda: "arm64")
    ran = commands(mac, {"hw.optional.arm.FEAT_DotProd": ("1\n", 0)})
    assert cpu.cpu_flags() == {"asimd", "asimddp"} and kernels.runnable() == ["neon"]
    assert ran.calls == [["sysctl", "-n", "hw.optional.arm.FEAT_DotProd"]]
    forget()
    commands(mac, {"hw.optional.arm.FEAT_DotProd": ("0\n", 0)})
    assert kernels.missing_cpu_flags() == ["asimddp"]
    assert why_not_on_this_mac() == "the CPU lacks asimddp"


@pytest.mark.parametrize("failure", [FileNotFoundError("sysctl"), subprocess.TimeoutExpired("sysctl", 10)])
def test_no_sysctl_leaves_the_kernel_off_with_its_reason(mac, failure):
    commands(mac, {"sysctl": failure})
    assert cpu.cpu_flags() == frozenset()
    assert why_not_on_this_mac() == "the CPU lacks avx2, fma, f16c"


def test_a_macs_physical_cores(mac):
    mac.delattr(os, "sched_getaffinity", raising=False)  # macOS has no affinity call
    commands(mac, {"hw.physicalcpu": ("8\n", 0)})
    assert cpu.physical_cores() == 8
    forget()
    commands(mac, {})  # no sysctl: the logical CPUs
    assert cpu.physical_cores() == (os.cpu_count() or 1)


def test_a_mac_compiles_with_clang(mac):
    found = {"clang++": "/usr/bin/clang++", "g++": "/usr/bin/g++"}
    mac.setattr(shutil, "which", found.get)
    assert kernels.compiler() == ["/usr/bin/clang++"]


def libomp_at(tmp_path, torch: bool, brew: bool):
    """Homebrew's libomp (omp.h and the library) and torch's lib folder (with its libomp.dylib or not)."""
    prefix, lib = tmp_path / "brew" / "libomp", tmp_path / "torch" / "lib"
    lib.mkdir(parents=True)
    if torch:
        (lib / "libomp.dylib").write_bytes(b"torch's")
    if brew:
        (prefix / "include").mkdir(parents=True)
        (prefix / "lib").mkdir()
        (prefix / "include" / "omp.h").write_text("")
        (prefix / "lib" / "libomp.dylib").write_bytes(b"brew's")
    return prefix, lib


@pytest.mark.parametrize("torch", [True, False])
def test_apple_clangs_flags_link_the_libomp_torch_loads(mac, tmp_path, torch):
    prefix, lib = libomp_at(tmp_path, torch=torch, brew=True)
    mac.setattr(macos, "BREW_LIBOMP", (str(prefix),))
    mac.setattr(macos, "torch_lib", lambda: lib)
    flags = kernels.compile_flags("neon")
    linked = lib if torch else prefix / "lib"  # torch's where it ships one: one runtime in the process
    assert "-shared" not in flags and "-dynamiclib" in flags
    assert flags[flags.index("-fopenmp") - 1] == "-Xpreprocessor"
    for flag in (f"-I{prefix / 'include'}", f"-L{linked}", f"-Wl,-rpath,{linked}", "-lomp", "-ffp-contract=off"):
        assert flag in flags
    assert flags[-1] == "-march=armv8.2-a+dotprod" and not macos.why_not_openmp()

    ran = commands(mac, {"clang++": ("", 0)})
    target = tmp_path / "cache" / "kernels" / "decode-neon-x.so"

    def compiled(command, **kwargs):  # the compiler writes its output where -o says
        open(command[command.index("-o") + 1], "wb").write(b"a dylib")
        return ran(command, **kwargs)

    mac.setattr(subprocess, "run", compiled)
    kernels.build(["clang++"], target, "neon")
    assert ran.calls == [["clang++", *flags, "-o", ran.calls[0][-2], str(kernels.SOURCE)]]
    assert target.read_bytes() == b"a dylib" and kernels.intact(target)
    assert kernels.library_path(["clang++"], "neon").suffix == ".so"  # dlopen takes the name as it is


def test_brew_prefix_where_libomp_is_elsewhere(mac, tmp_path):
    prefix, _ = libomp_at(tmp_path, torch=False, brew=True)
    mac.setattr(shutil, "which", {"brew": "/somewhere/bin/brew"}.get)
    ran = commands(mac, {"brew --prefix libomp": (f"{prefix}\n", 0)})
    assert macos.libomp() == (prefix / "include", prefix / "lib")
    assert ran.calls == [["/somewhere/bin/brew", "--prefix", "libomp"]]


@pytest.mark.parametrize("brew", ["missing", "fails", "not installed"])
def test_no_libomp_is_one_line(mac, tmp_path, brew):
    mac.setattr(platform, "machine", lambda: "arm64")
    _, lib = libomp_at(tmp_path, torch=False, brew=False)  # a torch without libomp.dylib
    mac.setattr(macos, "torch_lib", lambda: lib)
    if brew != "missing":
        mac.setattr(shutil, "which", {"brew": "/opt/homebrew/bin/brew", "clang++": "/usr/bin/clang++"}.get)
    else:
        mac.setattr(shutil, "which", {"clang++": "/usr/bin/clang++"}.get)
    answer = ("", 1) if brew == "not installed" else subprocess.TimeoutExpired("brew", 60)
    ran = commands(mac, {"FEAT_DotProd": ("1\n", 0), "brew": answer})
    assert why_not_on_this_mac() == "no OpenMP runtime for Apple's clang (brew install libomp)"
    assert not any(call[0].endswith("clang++") for call in ran.calls)  # nothing compiled


def test_no_command_line_tools_is_one_line(mac, tmp_path):
    commands(mac, {"machdep.cpu": (AVX2_MAC, 0)})
    assert kernels.missing_cpu_flags() == []
    mac.setattr(shutil, "which", lambda name: None)
    assert why_not_on_this_mac() == "no C++ compiler (clang++) found: xcode-select --install"

    prefix, _ = libomp_at(tmp_path, torch=False, brew=True)
    mac.setattr(macos, "BREW_LIBOMP", (str(prefix),))
    mac.setattr(shutil, "which", {"clang++": "/usr/bin/clang++"}.get)
    xcrun = "xcrun: error: invalid active developer path (/Library/Developer/CommandLineTools), missing xcrun"
    mac.setattr(subprocess, "run", lambda c, **k: subprocess.CompletedProcess(c, 1, "", xcrun))
    assert kernels.load("avx2") == (None, "the decode kernel did not build: " + macos.NO_TOOLS)


def test_dyld_lists_the_openmp_runtimes(mac):
    torchs, brews = "/venv/lib/python3.12/site-packages/torch/lib/libomp.dylib", "/opt/homebrew/lib/libomp.dylib"
    images = ["/usr/lib/libSystem.B.dylib", torchs, "/usr/lib/libc++.1.dylib"]
    mac.setattr(macos, "loaded_images", lambda: images)
    assert kernels.openmp_runtimes() == {torchs}  # the kernel linked torch's: one runtime
    images.append(brews)
    assert kernels.openmp_runtimes() == {torchs, brews}

    commands(mac, {"machdep.cpu": (AVX2_MAC, 0)})
    loaded = object()
    mac.setattr(kernels, "load", lambda name: (loaded, ""))
    assert why_not_on_this_mac() == "the kernel would run a second OpenMP runtime beside torch's"
    images.remove(brews)
    assert kernels.library.__wrapped__() is loaded and kernels._build == "avx2" and not kernels.why_not()


def test_dyld_is_not_asked_where_there_is_none():
    assert macos.loaded_images() == []  # Linux: no _dyld_image_count, quietly nothing


def test_the_team_looks_at_no_proc_on_a_mac(mac):
    mac.delattr(os, "sched_getaffinity", raising=False)
    assert team.others_running() == 0
