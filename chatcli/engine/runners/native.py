"""The native runner: a decoder of a lean family in the compiled kernel over a memory-mapped lean file, no torch.

`kernels/decode.cpp` runs S rows (a prompt chunk, a sampled token, or a token and the draft after
it) through every layer, the KV cache writes and the head in one call and one OpenMP team;
`forward_batch` the rows of several sequences, each with its own cache (`native_cache`), in one. It
computes each row exactly as it would alone, in a fixed order: prefill gives the numbers that
decoding the same tokens one by one gives, and a draft is checked exactly, int8 included
(activations get a scale per row). The weights are the lean file's (fp32 panels or packed int8: see
`weights.lean_file`), read where they are mapped; the KV cache lives in anonymous memory that the OS
backs as it is written. Logits come back as numpy arrays.

`NativeRunner` is what a model of a lean family gets on a CPU where the kernel builds (AVX-512 VNNI or AVX2,
and a C++ compiler): start-up is a file mapping, and a process that answers one prompt never
imports torch. Elsewhere `lean.LeanRunner` runs the same lean tensors on torch.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from chatcli.engine.kv.cache import KVCache
from chatcli.engine.runners import kernels
from chatcli.engine.runners.base import ModelRunner
from chatcli.engine.runners.kernels.structs import (
    ACT_GELU_TANH,
    ACT_SILU,
    ACT_SWIGLU_OAI,
    WEIGHT_F32,
    WEIGHT_I8,
    WEIGHT_Q4,
    WEIGHT_Q8,
    Layer,
    Matrix,
    Model,
    Segment,
)
from chatcli.engine.runners.matrices import block_matrix, parts_matrix  # noqa: F401 (tests take them from here)
from chatcli.engine.runners.native_cache import CACHE_DTYPES, NativeCache, q8_reason
from chatcli.engine.runners.native_experts import ExpertViews
from chatcli.engine.runners.team import TeamWidth
from chatcli.engine.weights.lean_file import (
    BLOCKS,
    GGUF,
    GROUP,
    GROUPED,
    INT8,
    OAI_VECTORS,
    PROJECTIONS,
    VECTORS,
    LeanWeights,
    norm_before,
)

MAX_HEAD_DIM = 256  # attention.h's kMaxHeadDim
STATE_ROWS = 1024  # rows (tokens) of the sequences whose hidden states one kernel call computes at most


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


class NativeRunner(ModelRunner):
    """A `ModelRunner` over a lean file (`float32-panels` or `int8`) through the compiled kernel."""

    @property
    def kernel(self) -> str:
        """The kernel's build that runs this forward: avx512, avxvnni, avx2 or neon."""
        return kernels.build_name()

    def __init__(self, weights: LeanWeights, kv_dtype: str = "float32", threads: int | None = None) -> None:
        lib = kernels.library()
        if lib is None:
            raise RuntimeError(f"the compiled kernel is not available: {kernels.why_not()}")
        c = weights.config
        if c.kind not in ("float32-panels", INT8, *BLOCKS):
            raise ValueError(f"the native runner reads float32-panels, int8, q4, q8 or gguf lean files, not {c.kind}")
        if kv_dtype not in CACHE_DTYPES:
            raise ValueError(f"the native runner keeps a float32, bfloat16, float16 or q8_0 KV cache, not {kv_dtype}")
        reason = shape_reason(c.head_dim, c.heads, c.kv_heads)
        if kv_dtype == "q8_0":
            reason = reason or q8_reason(c.head_dim)
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
        self._states = None  # the identity-head model of `hidden_states`, and the arrays it points to
        self.kv_dtype = kv_dtype
        self.threads = threads or kernel_threads()
        # the team's width per call, learned (runners/team.py); a fixed `threads` (tests, benchmarks) is kept
        tolerant = bool(lib.chatcli_tolerant(-1, -1))  # decode steps without barriers (kernels/tolerant.h)
        self.team = TeamWidth(self.threads, tolerant=tolerant) if threads is None and self.threads > 1 else None
        shapes, vectors = c.shapes(), c.vectors()
        self._experts = ExpertViews(weights, getattr(weights, "gguf", None))

        def vector(name: str):  # a family's vector, or null where it has none
            return weights.address(name) if name in vectors else None

        def projections(i: int) -> list[str]:  # a mixture of experts' layer has no gate_up nor down (zeros)
            return [f"layers.{i}.{p}" for p in PROJECTIONS]

        layers = [
            Layer(
                *[self._matrix(name, shapes) if name in shapes else Matrix() for name in projections(i)],
                weights.address(c.rope_name(i)) if c.rope_name(i) else None,  # null: not rotated (SmolLM3)
                c.layer_window(i),
                *[vector(f"layers.{i}.{n}") for n in VECTORS],  # in Layer's field order
                *(self._experts.layer(i, self._matrix(f"layers.{i}.router", shapes)) if c.experts else (None, None)),
                *[vector(f"layers.{i}.{n}") for n in OAI_VECTORS],
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
            {"gelu_tanh": ACT_GELU_TANH, "swiglu_oai": ACT_SWIGLU_OAI}.get(c.act, ACT_SILU),
            None if c.kind in BLOCKS else weights.address("embed"),
            self._layers,
            self._matrix("head", shapes),
        )
        self._model.experts, self._model.experts_used, self._model.expert_ffn = c.experts, c.experts_used, c.ffn
        self._model.norm_topk = int(c.norm_topk)
        self._model.pre_norm, self._model.qk_norm_whole = int(c.pre_norms), int(c.qk_norm_whole)
        self._model.residual_scale = c.residual_scale
        if c.kind in BLOCKS:  # the embedding from its blocks: the head's where tied
            self._embed = self._model.head if c.tied else self._matrix("embed", {"embed": (c.hidden, c.embed_rows)})
            self._model.embed_rows = ctypes.pointer(self._embed)
            self._model.embed_scale = c.embed_scale
        self.final_softcap, self.logits_scaling = c.final_softcap, c.logits_scaling
        apart = {**vectors, **c.norms()}  # fp32 vectors beside the projections, not their weights
        sizes = {
            n: weights.file.tensors[n].nbytes
            for n in weights.file.tensors
            if n.split(".")[0] not in ("embed", "rope", "rope_sliding") and n not in apart
        }
        self.weight_bytes = sum(sizes.values())
        # what a token reads: its experts' share of the experts' weights (all of them where there are none)
        experts = sum(size for n, size in sizes.items() if ".experts_" in n) + self._experts.raw_bytes
        self.weight_bytes += self._experts.raw_bytes
        self.active_bytes = self.weight_bytes - experts + experts * c.experts_used // max(1, c.experts)

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

    def start_repacking(self) -> None:
        """Repack the experts the lean file left in the GGUF, in a process of their own (native_experts.start)."""
        self._experts.start()

    def repacking_note(self) -> str:
        """The start's one line where experts are still read from the GGUF's rows (empty: none are)."""
        pending, layers = len(self._experts.pending), self.config.layers
        if not pending:
            return ""
        how = "a process of their own repacks them" if self._experts.process else "CHATCLI_REPACK_EXPERTS is off"
        return (
            f"{layers - pending} of {layers} layers' experts are repacked for the kernel so far; the others are read "
            f"from the GGUF as it holds them, at about 60 % of the decode speed, while {how}"
        )

    def files(self) -> list:
        return [self.weights.file.path, *([self._experts.path] if self._experts.gguf else [])]

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

    def forward_batch(self, requests: list[tuple[list[int], KVCache, bool]]) -> list[np.ndarray]:
        """Several sequences in one kernel call, every weight read once for all their rows: per request
        (ids, cache, every), the logits `forward` (`every`: `verify`) gives it alone, to the bit. A request
        its cache's sliding strip has no room for at once runs alone, after the others."""
        batch = [r for r in requests if self._room(r[0], r[1]) >= len(r[0])]
        out = dict(zip(map(id, batch), self._pieces(batch), strict=True)) if batch else {}
        logits = [out[id(r)] if id(r) in out else self._run(*r) for r in requests]
        return [rows if every else rows[0] for rows, (_ids, _cache, every) in zip(logits, requests, strict=True)]

    def _room(self, ids: list[int], cache: KVCache) -> int:
        """The ids a call can take for `cache` at once (checked: in the context, in the vocabulary)."""
        assert isinstance(cache, NativeCache) and cache.dtype == self.kv_dtype
        start, count = len(cache.ids), len(ids)
        if not ids:
            raise ValueError("forward needs at least one id")
        if start + count > self.context_limit:
            raise ValueError(f"{start + count} positions exceed the context limit {self.context_limit}")
        if min(ids) < 0 or max(ids) >= self.config.embed_rows:  # the kernel would read past the embedding
            raise IndexError(f"token id out of range for an embedding of {self.config.embed_rows} rows")
        return cache.strip.room if cache.strip is not None else count

    def _run(self, ids: list[int], cache: KVCache, every: bool) -> np.ndarray:
        """ids at positions len(cache).. -> logits [S or 1, V]; writes their keys and values into `cache`
        (in pieces a cache's sliding strip has room for: every row is computed alone, so the same bits)."""
        room, count = self._room(ids, cache), len(ids)
        pieces = [self._pieces([(ids[i : i + room], cache, every)])[0] for i in range(0, count, room)]
        return pieces[-1] if len(pieces) == 1 or not every else np.concatenate(pieces)

    def hidden_states(self, batch: list[list[int]]) -> list[np.ndarray]:
        """`ModelRunner.hidden_states` through the kernel, the sequences that fit together in one call (one
        prefill, each on a cache of its own): the model with an identity head of the final norm's weight
        (`_states_model`), whose "logits" are the normalised hidden states times that weight, to the bit."""
        model, caches = self._states_model(), [self.new_cache() for _ in batch]
        out: dict[int, list[np.ndarray]] = {i: [] for i in range(len(batch))}
        together = [i for i, ids in enumerate(batch) if self._room(ids, caches[i]) >= len(ids)]
        groups, rows = [[]], 0
        for i in together:  # calls of STATE_ROWS rows at most (the kernel's scratch grows with the rows)
            if groups[-1] and rows + len(batch[i]) > STATE_ROWS:
                groups, rows = [*groups, []], 0
            groups[-1].append(i)
            rows += len(batch[i])
        for group in (g for g in groups if g):
            for i, states in zip(group, self._pieces([(batch[i], caches[i], True) for i in group], model), strict=True):
                out[i].append(states)
        for i in (i for i in range(len(batch)) if i not in together):  # a sliding strip's room at a time
            room = self._room(batch[i], caches[i])
            for at in range(0, len(batch[i]), room):
                out[i] += self._pieces([(batch[i][at : at + room], caches[i], True)], model)
        return [np.concatenate(out[i]) for i in range(len(batch))]

    def _states_model(self) -> Model:
        """This model with the head an fp32 identity `[D, D]` (panels) whose norm is the final norm's weight
        (the lean file's where its kind keeps it apart, else its source's: `weights.final_norm`)."""
        if self._states is None:
            from chatcli.engine.weights.final_norm import final_norm

            d = self.config.hidden
            count = -(-d // 64)  # the kernel's fp32 panels: [ceil(n/64), k, 64]
            identity = np.eye(count * 64, d, dtype=np.float32).reshape(count, 64, d).transpose(0, 2, 1).copy()
            weight = final_norm(self.weights)
            weight = np.ones(d, np.float32) if weight is None else np.ascontiguousarray(weight, np.float32)
            model = Model.from_buffer_copy(self._model)
            model.head = Matrix(WEIGHT_F32, d, d, d, identity.ctypes.data, None, None)
            model.head.norm = weight.ctypes.data
            model.vocab = d
            self._states = (model, identity, weight)  # the arrays the struct points to live with it
        return self._states[0]

    def _pieces(self, requests: list, model: Model | None = None) -> list[np.ndarray]:
        """One kernel call over every request's rows (each fits its cache); their logits, soft-capped (or,
        with `model` from `_states_model`, their hidden states)."""
        self._experts.poll()  # layers of experts repacked since (native_experts), taken up between two calls
        segments = (Segment * len(requests))()
        views = []  # the caches' kernel views, alive through the call
        for segment, (ids, cache, every) in zip(segments, requests, strict=True):
            cache.reserve(len(cache.ids) + len(ids))
            views.append(cache.kernel_cache())  # after reserve: the arrays may have moved
            segment.cache, segment.pos = ctypes.pointer(views[-1]), len(cache.ids)
            segment.rows, segment.logit_rows = len(ids), len(ids) if every else 1
        wants = [segment.logit_rows for segment in segments]
        flat = [t for ids, _cache, _every in requests for t in ids]
        tokens = (ctypes.c_int64 * len(flat))(*flat)
        states, model = model is not None, ctypes.byref(self._model if model is None else model)
        logits = np.empty((sum(wants), self.config.hidden if states else self.config.vocab), dtype=np.float32)

        def call(threads: int) -> int:
            return self._lib.chatcli_decode_batch(model, segments, len(requests), tokens, logits.ctypes.data, threads)

        timed = self.team is not None and not states  # the team learns from the decode's calls only
        status = self.team.timed(len(flat), call) if timed else call(self.threads)
        if status:
            raise ValueError(f"the kernel refused {len(flat)} ids of {len(requests)} sequences (status {status})")
        if self.final_softcap and not states:  # Gemma 2: cap * tanh(logits / cap)
            cap = np.float32(self.final_softcap)
            np.multiply(np.tanh(logits / cap), cap, out=logits)
        if self.logits_scaling != 1.0 and not states:  # Granite: the logits divided by its scaling
            np.divide(logits, np.float32(self.logits_scaling), out=logits)
        for ids, cache, _every in requests:
            cache.ids.extend(ids)
        return np.split(logits, np.cumsum(wants)[:-1])
