"""The native runner: a decoder of a lean family in the compiled kernel over a memory-mapped lean file, no torch.

`kernels/decode.cpp` runs S rows (a prompt chunk, a sampled token, or a token and the draft
after it) through every layer, the KV cache writes and the head in one call and one OpenMP
team. It computes each row exactly as it would alone, in a fixed order: prefill gives the
numbers that decoding the same tokens one by one gives, and a draft is checked exactly, int8
included (activations get a scale per row). The weights are the lean file's (fp32 panels or
packed int8: see `weights.lean_file`), read where they are mapped; the KV cache lives in anonymous
memory that the OS backs as it is written. Logits come back as numpy arrays.

`NativeRunner` is what a model of a lean family gets on a CPU where the kernel builds (AVX-512 VNNI or AVX2,
and a C++ compiler): start-up is a file mapping, and a process that answers one prompt never
imports torch. Elsewhere `lean.LeanRunner` runs the same lean tensors on torch.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

from chatcli.engine.kv import memory as kv_memory
from chatcli.engine.kv.cache import KVCache
from chatcli.engine.runners import kernels
from chatcli.engine.runners.base import ModelRunner
from chatcli.engine.runners.kernels.structs import (
    ACT_GELU_TANH,
    ACT_SILU,
    BLOCK_KINDS,
    CACHE_BF16,
    CACHE_F32,
    WEIGHT_F32,
    WEIGHT_I8,
    WEIGHT_PARTS,
    WEIGHT_Q4,
    WEIGHT_Q8,
    Cache,
    Layer,
    Matrix,
    Model,
)
from chatcli.engine.runners.team import TeamWidth
from chatcli.engine.weights.lean_file import (
    BLOCKS,
    GGUF,
    GROUP,
    GROUPED,
    INT8,
    PROJECTIONS,
    VECTORS,
    LeanWeights,
    norm_before,
)

CACHE_DTYPES = {"float32": (CACHE_F32, np.float32, "F32"), "bfloat16": (CACHE_BF16, np.uint16, "BF16")}


MAX_HEAD_DIM = 256  # attention.h's kMaxHeadDim


def shape_reason(head_dim: int, heads: int, kv_heads: int) -> str | None:
    """Why the kernel cannot run a model of these attention shapes (None: it can)."""
    if head_dim % 16 or head_dim > MAX_HEAD_DIM:
        return f"the kernel takes heads of a multiple of 16 up to {MAX_HEAD_DIM}, not {head_dim}"
    if heads % kv_heads:
        return "the kernel needs whole query groups"
    return None


def kernel_threads() -> int:
    """Threads for the kernel's team: $OMP_NUM_THREADS, else the physical cores this process may use."""
    from chatcli.engine.cpu import physical_cores

    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return physical_cores()


KEY_BLOCK = 16  # decode.cpp keeps keys in blocks of 16 positions, transposed


def _key_rows(kt: np.ndarray, n: int) -> np.ndarray:
    """Transposed key blocks `[L, KV, blocks, hd, 16]` -> the first n keys as rows `[L, KV, n, hd]` (a copy)."""
    blocks = -(-n // KEY_BLOCK)
    rows = kt[:, :, :blocks].transpose(0, 1, 2, 4, 3)  # [L, KV, blocks, 16, hd]
    return rows.reshape(*rows.shape[:2], blocks * KEY_BLOCK, rows.shape[-1])[:, :, :n]


def _put_key_rows(kt: np.ndarray, rows: np.ndarray) -> None:
    """Key rows `[L, KV, n, hd]` into the first blocks of `kt` `[L, KV, blocks, hd, 16]`."""
    layers, kv_heads, n, head_dim = rows.shape
    blocks, full = n // KEY_BLOCK, n // KEY_BLOCK * KEY_BLOCK
    whole = rows[:, :, :full].reshape(layers, kv_heads, blocks, KEY_BLOCK, head_dim)
    kt[:, :, :blocks] = whole.transpose(0, 1, 2, 4, 3)
    if full < n:  # the last, partly filled block
        kt[:, :, blocks, :, : n - full] = rows[:, :, full:].transpose(0, 1, 3, 2)


def block_matrix(kind: str, n: int, k: int, kp: int, address, norm=None) -> Matrix:
    """The kernel's Matrix of one block type (`BLOCK_KINDS`) over arrays named as `quant_blocks.pack` /
    `kquant_blocks.pack_k` name them, `address(key)` giving each one's address or None."""
    return Matrix(
        BLOCK_KINDS[kind],
        n,
        k,
        kp,
        address("w"),
        None,
        None,
        address("d"),
        address("m"),
        norm,
        address("sc"),
        address("sm"),
        address("hi"),
    )


def parts_matrix(parts: list[Matrix], k: int, kp: int, norm=None) -> Matrix:
    """Matrices stacked along the outputs (a fused projection whose tensors have several types); the
    array of parts is kept alive on the result."""
    if len(parts) == 1:
        whole = parts[0]
        whole.norm = norm
        return whole
    array = (Matrix * len(parts))(*parts)
    whole = Matrix(WEIGHT_PARTS, sum(p.n for p in parts), k, kp, None, None, None, None, None, norm)
    whole.parts, whole.n_parts = ctypes.cast(array, ctypes.POINTER(Matrix)), len(parts)
    whole.keep = array
    return whole


class NativeCache(kv_memory.ReservedCache):
    """Keys `[Lf, KV, capacity/16, hd, 16]` (blocks of 16 positions, transposed: one vector holds a
    dimension of 16 keys) and values `[Lf, KV, capacity, hd]`, fp32 or bf16 held as uint16, in anonymous
    memory; a model's sliding layers, where a strip is smaller than the context, in `wk`, `wv` of the
    same layout over `strip.size` positions (see `kv.memory.Strip`). `keys(n)` and `state()` give the
    keys as rows `[L, KV, n, hd]`, like every other cache."""

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, limit: int, dtype: str, window: int = 0, sliding=()
    ) -> None:
        self.kind, self._np, self._code = CACHE_DTYPES[dtype]
        itemsize = np.dtype(self._np).itemsize
        super().__init__(layers, kv_heads, head_dim, limit, itemsize, lazy=True, window=window, sliding=sliding)
        self.dtype = dtype
        self._view = None  # the kernel's Cache over these arrays, rebuilt when they move
        self.k, self.v, self._map = self._allocate(len(self.full), 0)
        if self.strip is not None:
            self.wk, self.wv, self._wmap = self._allocate(len(self.slid), self.strip.size)

    def _allocate(self, layers: int, cap: int):
        """Keys and values `[layers, KV, cap/16, hd, 16]`, `[layers, KV, cap, hd]` in anonymous memory."""
        cap = -(-cap // KEY_BLOCK) * KEY_BLOCK
        _, kv_heads, head_dim = self._shape
        count = layers * kv_heads * cap * head_dim
        memory = mmap.mmap(-1, 2 * count * np.dtype(self._np).itemsize) if count else None  # backed when written
        flat = np.frombuffer(memory, dtype=self._np) if count else np.empty(0, self._np)
        if self._no_huge_pages and count:
            kv_memory.advise_no_huge_pages(flat.ctypes.data, flat.nbytes)
        k = flat[:count].reshape(layers, kv_heads, cap // KEY_BLOCK, head_dim, KEY_BLOCK)
        return k, flat[count : 2 * count].reshape(layers, kv_heads, cap, head_dim), memory

    def _resize(self, cap: int) -> None:
        k, v, memory = self._allocate(len(self.full), cap)
        blocks, held = -(-len(self.ids) // KEY_BLOCK), len(self.ids)
        k[:, :, :blocks], v[:, :, :held] = self.k[:, :, :blocks], self.v[:, :, :held]
        self.k, self.v, self._map, self._view = k, v, memory, None

    def _slide(self, shift: int, count: int) -> None:
        first, blocks = shift // KEY_BLOCK, -(-count // KEY_BLOCK)
        self.wk[:, :, :blocks] = self.wk[:, :, first : first + blocks]  # numpy copies overlapping parts first
        self.wv[:, :, :count] = self.wv[:, :, shift : shift + count]
        self._view = None

    def kernel_cache(self) -> Cache:
        """The kernel's view: each layer's key and value arrays, capacity and first position."""
        if self._view is None or (self.strip is not None and self._view.base[self.slid[0]] != self.strip.base):
            layers = len(self.full) + len(self.slid)
            k, v = (ctypes.c_void_p * layers)(), (ctypes.c_void_p * layers)()
            capacity, base = (ctypes.c_int64 * layers)(), (ctypes.c_int64 * layers)()
            for i in range(layers):
                kl, vl, first = self.part(i)
                k[i], v[i], capacity[i], base[i] = kl.ctypes.data, vl.ctypes.data, vl.shape[1], first
            self._view = Cache(self.kind, k, v, capacity, base)
            self._view.arrays = (k, v, capacity, base)  # kept alive with the view
        return self._view

    def keys(self, n: int) -> np.ndarray:
        """The first n keys of the full-context layers as rows `[Lf, KV, n, hd]` (a copy)."""
        return _key_rows(self.k, n)

    def _empty(self) -> NativeCache:
        layers = len(self.full) + len(self.slid)
        return NativeCache(
            layers, self._shape[1], self._shape[2], self.limit, self.dtype, self.window, self.sliding_layers
        )

    def _copy_to(self, other: NativeCache, n: int) -> None:
        blocks = -(-n // KEY_BLOCK)
        other.k[:, :, :blocks], other.v[:, :, :n] = self.k[:, :, :blocks], self.v[:, :, :n]
        if self.strip is not None:
            held = max(0, n - self.strip.base)
            blocks = -(-held // KEY_BLOCK)
            other.wk[:, :, :blocks], other.wv[:, :, :held] = self.wk[:, :, :blocks], self.wv[:, :, :held]

    def _rows_out(self, held, n: int, keys: bool) -> tuple[str, np.ndarray]:
        return self._code, _key_rows(held, n) if keys else held[:, :, :n]

    def _rows_in(self, value: tuple[str, np.ndarray]) -> np.ndarray:
        code, rows = value
        if code != self._code:
            raise ValueError(f"a {code} cache, not {self._code}")
        return rows

    def _put_rows(self, held, rows, keys: bool) -> None:
        if keys:
            _put_key_rows(held, rows)
        else:
            held[:, :, : rows.shape[2]] = rows


class NativeRunner(ModelRunner):
    """A `ModelRunner` over a lean file (`float32-panels` or `int8`) through the compiled kernel."""

    def __init__(self, weights: LeanWeights, kv_dtype: str = "float32", threads: int | None = None) -> None:
        lib = kernels.library()
        if lib is None:
            raise RuntimeError(f"the compiled kernel is not available: {kernels.why_not()}")
        c = weights.config
        if c.kind not in ("float32-panels", INT8, *BLOCKS):
            raise ValueError(f"the native runner reads float32-panels, int8, q4, q8 or gguf lean files, not {c.kind}")
        if kv_dtype not in CACHE_DTYPES:
            raise ValueError(f"the native runner keeps a float32 or bfloat16 KV cache, not {kv_dtype}")
        reason = shape_reason(c.head_dim, c.heads, c.kv_heads)
        if reason:
            raise ValueError(reason)
        self._lib = lib
        self.weights = weights  # the mapping the kernel reads stays open while the runner lives
        self.config = c
        self.context_limit = c.positions
        self.device = "cpu"
        self.dtype = "float32"  # activations; the weights are `c.weights`
        self.quantized = c.weights in (INT8, *BLOCKS)
        self._keep = []  # the matrices whose parts the kernel's structs point to
        self.kv_dtype = kv_dtype
        self.threads = threads or kernel_threads()
        # the team's width per call, learned (runners/team.py); a fixed `threads` (tests, benchmarks) is kept
        self.team = TeamWidth(self.threads) if threads is None and self.threads > 1 else None
        shapes, vectors = c.shapes(), c.vectors()

        def vector(name: str):  # a family's vector, or null where it has none
            return weights.address(name) if name in vectors else None

        layers = [
            Layer(
                *[self._matrix(f"layers.{i}.{p}", shapes) for p in PROJECTIONS],
                weights.address(c.rope_name(i)),
                c.layer_window(i),
                *[vector(f"layers.{i}.{n}") for n in VECTORS],  # in Layer's field order
            )
            for i in range(c.layers)
        ]
        self._layers = (Layer * c.layers)(*layers)
        self._model = Model(
            c.layers,
            c.hidden,
            c.heads,
            c.kv_heads,
            c.head_dim,
            c.ffn,
            c.vocab,
            c.eps,
            c.scale,
            c.attn_softcap,
            ACT_GELU_TANH if c.act == "gelu_tanh" else ACT_SILU,
            None if c.kind in BLOCKS else weights.address("embed"),
            self._layers,
            self._matrix("head", shapes),
        )
        if c.kind in BLOCKS:  # the embedding from its blocks: the head's where tied
            self._embed = self._model.head if c.tied else self._matrix("embed", {"embed": (c.hidden, c.embed_rows)})
            self._model.embed_rows = ctypes.pointer(self._embed)
            self._model.embed_scale = c.embed_scale
        self.final_softcap = c.final_softcap
        apart = {**vectors, **c.norms()}  # fp32 vectors beside the projections, not their weights
        self.weight_bytes = sum(
            weights.file.tensors[n].nbytes
            for n in weights.file.tensors
            if n.split(".")[0] not in ("embed", "rope", "rope_sliding") and n not in apart
        )

    def _matrix(self, name: str, shapes: dict) -> Matrix:
        k, n = shapes[name]
        w = self.weights
        if self.config.kind == GGUF:  # parts, each in its own type
            has = w.file.tensors
            norm = norm_before(name)

            def part(i: int, kind: str, size: int) -> Matrix:
                key = f"{name}.{i}."
                return block_matrix(kind, size, k, k, lambda a: w.address(key + a) if key + a in has else None)

            whole = parts_matrix(
                [part(i, kind, size) for i, (kind, size) in enumerate(self.config.parts[name])],
                k,
                k,
                w.address(norm) if norm in has else None,
            )
            self._keep.append(whole)
            return whole
        if self.config.kind in GROUPED:  # each projection q4 or q8 by its packing (quant_blocks)
            bits = WEIGHT_Q8 if w.file.tensors[f"{name}.w"].shape[2] == 8 else WEIGHT_Q4
            has = w.file.tensors
            norm = norm_before(name)
            return Matrix(
                bits,
                n,
                k,
                -(-k // GROUP) * GROUP,
                w.address(f"{name}.w"),
                None,
                None,
                w.address(f"{name}.d"),
                w.address(f"{name}.m") if f"{name}.m" in has else None,
                w.address(norm) if norm in has else None,
            )
        if self.quantized:
            return Matrix(
                WEIGHT_I8,
                n,
                k,
                -(-k // 4) * 4,
                w.address(f"{name}.w"),
                w.address(f"{name}.scale"),
                w.address(f"{name}.wsum"),
            )
        return Matrix(WEIGHT_F32, n, k, k, self.weights.address(name), None, None)

    def files(self) -> list:
        return [self.weights.file.path]

    @property
    def exact_verify(self) -> bool:
        return True  # every row is computed as if alone, int8, q4 and q8 included

    def new_cache(self) -> NativeCache:
        c = self.config
        return NativeCache(c.layers, c.kv_heads, c.head_dim, self.context_limit, self.kv_dtype, c.window, c.sliding)

    def forward(self, ids: list[int], cache: KVCache) -> np.ndarray:
        return self._run(ids, cache, every=False)[0]  # [V]

    def verify(self, ids: list[int], cache: KVCache) -> np.ndarray:
        return self._run(ids, cache, every=True)  # [S, V]

    def _run(self, ids: list[int], cache: KVCache, every: bool) -> np.ndarray:
        """ids at positions len(cache).. -> logits [S or 1, V]; writes their keys and values into `cache`
        (in pieces a cache's sliding strip has room for: every row is computed alone, so the same bits)."""
        assert isinstance(cache, NativeCache) and cache.dtype == self.kv_dtype
        start, count = len(cache.ids), len(ids)
        if not ids:
            raise ValueError("forward needs at least one id")
        if start + count > self.context_limit:
            raise ValueError(f"{start + count} positions exceed the context limit {self.context_limit}")
        if min(ids) < 0 or max(ids) >= self.config.embed_rows:  # the kernel would read past the embedding
            raise IndexError(f"token id out of range for an embedding of {self.config.embed_rows} rows")
        room = cache.strip.room if cache.strip is not None else count
        pieces = [self._piece(ids[i : i + room], cache, every) for i in range(0, count, room)]
        logits = pieces[-1] if len(pieces) == 1 or not every else np.concatenate(pieces)
        if self.final_softcap:  # Gemma 2: cap * tanh(logits / cap)
            cap = np.float32(self.final_softcap)
            np.multiply(np.tanh(logits / cap), cap, out=logits)
        return logits

    def _piece(self, ids: list[int], cache: NativeCache, every: bool) -> np.ndarray:
        start, count = len(cache.ids), len(ids)
        cache.reserve(start + count)
        tokens = (ctypes.c_int64 * count)(*ids)
        rows = count if every else 1
        logits = np.empty((rows, self.config.vocab), dtype=np.float32)
        model, view = ctypes.byref(self._model), ctypes.byref(cache.kernel_cache())

        def call(threads: int) -> int:
            return self._lib.chatcli_decode(model, view, tokens, count, start, logits.ctypes.data, rows, threads)

        status = self.team.timed(count, call) if self.team is not None else call(self.threads)
        if status:
            raise ValueError(f"the kernel refused {count} ids at position {start} (status {status})")
        cache.ids.extend(ids)
        return logits
