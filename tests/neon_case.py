"""The NEON kernel away from ARM: tests/kernel_harness/harness.cpp built with decode.cpp by Debian's
aarch64 cross compiler and run under qemu-user, over a native runner's model (test_kernel_neon).

`write_case` writes a runner's `Model` (every Matrix, its parts and each Layer; pointers as offsets
into the lean file, which the harness reads whole) and a script of ids; `run` runs the harness on it and
gives the logit rows it wrote, in its order (see the harness's header): single steps over P + D, P's
prefill, D as a draft, then O beside P + D in one batched call. `script` gives the same rows from a
runner on this machine's build, with its own caches, for the bits to be compared. `project_neon` and
`project_here` run one projection (a `Projection`: a Matrix over numpy arrays) on either build.
"""

from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from chatcli.engine.runners import kernels
from chatcli.engine.runners.kernels.structs import CACHE_BF16, CACHE_F16, CACHE_F32, CACHE_Q8, Matrix

HARNESS = Path(__file__).with_name("kernel_harness") / "harness.cpp"
CROSS = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
MAGIC = int.from_bytes(b"CHATNEON", "little")


def missing_tools() -> str | None:
    """Why the NEON build cannot be tested here (None: it can)."""
    for tool, package in ((CROSS, "g++-aarch64-linux-gnu"), (QEMU, "qemu-user")):
        if shutil.which(tool) is None:
            return f"no {tool} (Debian's {package})"
    return None


def build_harness(folder: Path) -> Path:
    """The harness and the kernel in one static aarch64 program, with the NEON build's flags."""
    flags = [f for f in kernels.FLAGS if f not in ("-shared", "-fPIC")] + kernels.BUILDS["neon"][0]
    binary = folder / "harness"
    command = [CROSS, *flags, "-static", "-I", str(kernels.SOURCE.parent), "-o", str(binary), str(HARNESS)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return binary


@dataclass
class Script:
    prompt: list[int]  # P
    draft: list[int]  # D
    other: list[int]  # O, batched beside P + D
    flat_rope: bool = False  # every layer's rope the identity (cos 1, sin 0): see `flat_rope`


def _float(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


class _Words:
    """The case's int64 words; pointers into [base, base + size) as offsets, null as -1."""

    def __init__(self, base: int, size: int) -> None:
        self.base, self.size, self.words = base, size, []

    def add(self, *values: int) -> None:
        self.words.extend(int(v) for v in values)

    def pointer(self, address) -> None:
        if not address:
            self.words.append(-1)
            return
        offset = int(address) - self.base
        assert 0 <= offset < self.size, "a kernel pointer outside the lean file"
        self.words.append(offset)

    def pointer_of(self, p) -> None:  # a ctypes POINTER field
        self.pointer(ctypes.cast(p, ctypes.c_void_p).value if p else None)

    def matrix(self, m: Matrix) -> None:
        self.add(m.kind, m.n, m.k, m.kp)
        for name in ("w", "scale", "wsum", "d", "mins", "norm", "sc", "sm", "hi"):
            self.pointer(getattr(m, name))
        count = m.n_parts if m.parts else 0
        self.add(count)
        for i in range(count):
            self.matrix(m.parts[i])


def write_case(runner, path: Path, script: Script, kv_dtype: str, threads: tuple[int, int] = (1, 2)) -> None:
    """`runner`'s model (a NativeRunner) and the script into `path`, for the harness."""
    file = runner.weights.file
    w = _Words(file.base, file.size)
    m = runner._model
    w.add(MAGIC, 3, m.n_layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn, m.vocab)
    w.add(_float(m.eps), _float(m.attn_scale), _float(m.attn_softcap), m.act)
    w.pointer(m.embed)
    for i in range(m.n_layers):
        layer = m.layers[i]
        for name in ("qkv", "out", "gate_up", "down"):
            w.matrix(getattr(layer, name))
        if script.flat_rope and layer.rope:  # (a layer without rope keeps none)
            w.add(-2)
        else:
            w.pointer(layer.rope)
        w.add(layer.window)
        for name in ("qkv_bias", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm"):
            w.pointer(getattr(layer, name))
        experts = [layer.experts[e] for e in range(2 * m.experts)] if layer.router else []  # gate_ups, downs
        w.add(1 + len(experts) if layer.router else 0)
        for matrix in [layer.router.contents, *experts] if layer.router else []:
            w.matrix(matrix)
        for name in ("out_bias", "router_bias", "experts_bias", "sinks"):  # gpt-oss's
            w.pointer(getattr(layer, name))
    w.matrix(m.head)
    w.add(1 if m.embed_rows else 0)
    if m.embed_rows:
        w.matrix(m.embed_rows.contents)
    w.add(_float(m.embed_scale), m.experts, m.experts_used, m.expert_ffn, m.norm_topk)
    w.add(m.pre_norm, m.qk_norm_whole, _float(m.residual_scale))
    capacity = -(-runner.context_limit // 16) * 16
    w.add({"bfloat16": CACHE_BF16, "float16": CACHE_F16, "q8_0": CACHE_Q8}.get(kv_dtype, CACHE_F32), capacity, *threads)
    for ids in (script.prompt, script.draft, script.other):
        w.add(len(ids), *ids)
    path.write_bytes(np.array(w.words, dtype="<i8").tobytes())


def run(binary: Path, case: Path, runner, script: Script, out: Path, timeout: float = 120) -> list[np.ndarray]:
    """The harness under qemu: [steps (P + D rows), prefill (1), draft (D), batch (O + P + D)], each as
    the runner gives logits (Gemma 2's final soft-capping applied here, as the runner applies it)."""
    lean = runner.weights.file.path
    done = subprocess.run(
        [QEMU, str(binary), str(case), str(lean), str(out)], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = np.fromfile(out, dtype=np.float32).reshape(-1, runner.config.vocab)
    if runner.final_softcap:
        cap = np.float32(runner.final_softcap)
        np.multiply(np.tanh(rows / cap), cap, out=rows)
    if runner.logits_scaling != 1.0:  # Granite's, as the runner divides
        np.divide(rows, np.float32(runner.logits_scaling), out=rows)
    n, d = len(script.prompt) + len(script.draft), len(script.draft)
    return np.split(rows, np.cumsum([n, 1, d]))


@contextmanager
def flat_rope(runner):
    """Every layer of `runner` on an identity rope table while in the block. Rope is common.h's scalar
    code, which x86's compiler vectorizes with fused multiply-adds (VFMADDSUB, -ffp-contract=off
    notwithstanding) where aarch64's rounds each product: without it the builds' bits can be compared."""
    c = runner.config
    table = np.zeros((-(-runner.context_limit // 16) * 16, c.head_dim // 2, 2), np.float32)
    table[..., 0] = 1
    saved = [layer.rope for layer in runner._layers]
    try:
        for layer in runner._layers:
            layer.rope = table.ctypes.data
        yield
    finally:
        for layer, rope in zip(runner._layers, saved, strict=True):
            layer.rope = rope


def script(runner, s: Script) -> list[np.ndarray]:
    """The harness's rows from `runner` itself (this machine's build, the runner's own caches)."""
    if s.flat_rope:
        with flat_rope(runner):
            return script(runner, replace(s, flat_rope=False))
    sequence = s.prompt + s.draft
    one = runner.new_cache()
    steps = np.stack([runner.forward([t], one) for t in sequence])
    cache = runner.new_cache()
    prefill = runner.forward(s.prompt, cache)[None]
    draft = runner.verify(s.draft, cache)
    beside, again = runner.forward_batch([(s.other, runner.new_cache(), True), (sequence, runner.new_cache(), True)])
    return [steps, prefill, draft, np.concatenate([beside, again])]


FIELDS = ("w", "scale", "wsum", "d", "mins", "norm", "sc", "sm", "hi")  # Matrix's pointers, in order


@dataclass
class Projection:
    """One projection's weights: a Matrix's numbers and its arrays by field name (FIELDS)."""

    kind: int
    n: int
    k: int
    kp: int
    arrays: dict[str, np.ndarray]

    def matrix(self) -> Matrix:
        """The Matrix over the arrays themselves, for this machine's build."""
        pointers = [self.arrays[f].ctypes.data if f in self.arrays else None for f in FIELDS]
        return Matrix(self.kind, self.n, self.k, self.kp, *pointers)


def project_here(p: Projection, x: np.ndarray, threads: int = 2) -> np.ndarray:
    """`x [S, k]` through this machine's build (`kernels.library()`)."""
    y = np.zeros((len(x), p.n), np.float32)
    m = p.matrix()
    assert kernels.library().chatcli_project(ctypes.byref(m), x.ctypes.data, len(x), y.ctypes.data, threads) == 0
    return y


def project_neon(binary: Path, folder: Path, p: Projection, x: np.ndarray, threads: int = 2) -> np.ndarray:
    """`x [S, k]` through the NEON build under qemu: the arrays in one blob (each at a multiple of 64
    bytes), a CHATPROJ case over it (see the harness)."""
    blob, offsets = bytearray(), {}
    for field, array in p.arrays.items():
        offsets[field] = len(blob)
        blob += np.ascontiguousarray(array).tobytes()
        blob += bytes(-len(blob) % 64)
    words = [int.from_bytes(b"CHATPROJ", "little"), 3, p.kind, p.n, p.k, p.kp]
    words += [offsets.get(f, -1) for f in FIELDS] + [0, len(x), threads]
    words += np.ascontiguousarray(x, np.float32).view(np.uint32).ravel().tolist()
    case, data, out = folder / "project.bin", folder / "blob.bin", folder / "y.bin"
    case.write_bytes(np.array(words, dtype="<i8").tobytes())
    data.write_bytes(bytes(blob) + bytes(64))
    done = subprocess.run(
        [QEMU, str(binary), str(case), str(data), str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return np.fromfile(out, dtype=np.float32).reshape(len(x), p.n)
