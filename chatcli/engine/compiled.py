"""The lean runner's decode steps and draft checks through the compiled kernel.

`kernels/decode.cpp` runs a whole decode step (every layer, the KV cache writes, the
head) in one call and one OpenMP team, where the torch path dispatches ~1,300 small ops.
It also takes several rows at once, computing each exactly as it would alone: a draft of
S tokens is checked for the price of reading the weights once, and its logits are the
ones S single steps would give, int8 included (activations get a scale per row).

- `Int8Rows`: a projection with int8 weights in the kernel's layout and per-row int8
  activations; what `--quantize int8` uses where the kernel runs (else `Int8Dense`).
- `CompiledDecode`: built over a `LeanRunner`'s weights (fp32 `w_t`, or `Int8Rows`),
  called by its `decode_one_token` and `verify`.
- `compile_decode(runner)`: the step, or None with the reason where it cannot run.
"""

from __future__ import annotations

import ctypes

import torch

from chatcli.engine import kernels
from chatcli.engine.kernels.structs import CACHE_BF16, CACHE_F32, WEIGHT_F32, WEIGHT_I8, Cache, Layer, Matrix, Model

CACHE_KINDS = {torch.float32: CACHE_F32, torch.bfloat16: CACHE_BF16}


def _threads() -> int:
    return max(1, torch.get_num_threads())


class Int8Rows:
    """`x [S, in] -> [S, out]` through int8 weights (symmetric per output row) and int8 activations
    with a scale and zero point per row, so each row's result is the one it would get alone."""

    def __init__(self, weight: torch.Tensor) -> None:  # weight: [out, in] float
        lib = kernels.library()
        if lib is None:
            raise RuntimeError(f"the int8 kernel is not available: {kernels.why_not()}")
        self._lib = lib
        w = weight.detach().float()
        n, k = w.shape
        kp, blocks = -(-k // 4) * 4, -(-n // 16)
        self.scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-8).contiguous()  # [out]
        q = torch.round(w / self.scale[:, None]).clamp_(-127, 127).to(torch.int8)  # [out, in]
        self.wsum = q.sum(dim=1, dtype=torch.int32).contiguous()  # [out]
        padded = torch.zeros(blocks * 16, kp, dtype=torch.int8)
        padded[:n, :k] = q
        # [blocks, 16, kp/4, 4] -> [blocks, kp/4, 16, 4]: 16 outputs' 4 consecutive inputs per 64 bytes
        self.packed = padded.view(blocks, 16, kp // 4, 4).transpose(1, 2).contiguous()
        self.matrix = Matrix(WEIGHT_I8, n, k, kp, self.packed.data_ptr(), self.scale.data_ptr(), self.wsum.data_ptr())
        self.nbytes = self.packed.numel() + 8 * n

    def dequantized(self) -> torch.Tensor:
        """The weight as the kernel sees it, `[out, in]` float (for tests)."""
        n, k = self.matrix.n, self.matrix.k
        q = self.packed.transpose(1, 2).reshape(-1, self.matrix.kp)[:n, :k]
        return q.float() * self.scale[:, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.matrix.k:
            raise ValueError(f"Int8Rows takes [S, {self.matrix.k}], got {tuple(x.shape)}")
        x = x.float().contiguous()  # [S, in]
        y = torch.empty(x.shape[0], self.matrix.n)  # [S, out]
        if self._lib.chatcli_project(ctypes.byref(self.matrix), x.data_ptr(), x.shape[0], y.data_ptr(), _threads()):
            raise ValueError(f"int8 projection of {tuple(x.shape)} failed")
        return y


def _matrix(projection) -> tuple[Matrix, object] | None:
    """The kernel's view of a projection, and the object that owns the memory it points into."""
    if isinstance(projection.decode, Int8Rows):
        return projection.decode.matrix, projection.decode
    w_t = projection.w_t
    if projection.decode is None and w_t is not None and w_t.dtype == torch.float32 and w_t.is_contiguous():
        return Matrix(WEIGHT_F32, w_t.shape[1], w_t.shape[0], w_t.shape[0], w_t.data_ptr(), None, None), w_t
    return None


def compile_decode(runner) -> tuple[CompiledDecode | None, str]:
    """The compiled step over `runner`'s weights, or None and why not (one line)."""
    lib = kernels.library()
    if lib is None:
        return None, kernels.why_not()
    if runner.device.type != "cpu" or runner.dtype != torch.float32:
        return None, "the kernel runs float32 models on the CPU"
    if runner.kv_dtype not in CACHE_KINDS:
        return None, f"the kernel keeps no {runner.kv_dtype} KV cache"
    if runner.head_dim % 16:
        return None, "the kernel needs a head size that is a multiple of 16"
    if runner.heads % runner.kv_heads:
        return None, "the kernel needs query heads in whole groups per key/value head"
    projections = [[layer.qkv, layer.out, layer.gate_up, layer.down] for layer in runner.layers]
    views = [_matrix(p) for group in projections for p in group] + [_matrix(runner.head)]
    if any(v is None for v in views):
        return None, "a projection's weights are in a form the kernel does not read"
    matrices = [[m for m, _ in views[i : i + 4]] for i in range(0, 4 * len(projections), 4)]
    head, owners = views[-1][0], [owner for _, owner in views]
    return CompiledDecode(lib, runner, matrices, head, owners), ""


class CompiledDecode:
    """tokens at positions start.. -> logits, through every layer in one call of the kernel."""

    def __init__(self, lib, runner, matrices: list[list[Matrix]], head: Matrix, owners: list) -> None:
        """`owners`: what owns the memory the matrices point into (weights, `Int8Rows`), kept alive
        here; the runner itself is not kept (it holds this step: a cycle would outlive `del`)."""
        self._lib = lib
        self._owners = owners
        self._layers = (Layer * len(matrices))(*[Layer(*group) for group in matrices])
        self._rope = torch.view_as_real(runner.rope).contiguous()  # [T, 1, hd/2, 2]
        self._embed = runner.embed.float().contiguous()  # [V_in, D]: kept alive here
        self.positions = self._rope.shape[0]  # the rope table's length: the most positions a call may reach
        self.vocab = head.n  # the head's outputs: a logits row
        self._model = Model(
            len(matrices), runner.hidden, runner.heads, runner.kv_heads, runner.head_dim,
            matrices[0][3].k, self.vocab, runner.eps,
            self._embed.data_ptr(), self._rope.data_ptr(), self._layers, head,
        )

    def __call__(self, ids: list[int], k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, every: bool) -> torch.Tensor:
        """ids [S] -> logits [S, V] if `every`, else [V] of the last; k/v_cache [L, KV, capacity, hd] written at start.."""
        if not ids or start + len(ids) > min(self.positions, k_cache.shape[2]):
            raise ValueError(f"{len(ids)} ids at position {start} do not fit in {k_cache.shape[2]} cache positions")
        if min(ids) < 0 or max(ids) >= self._embed.shape[0]:  # C would read past the embedding
            raise IndexError(f"token id out of range for an embedding of {self._embed.shape[0]} rows")
        tokens = torch.tensor(ids, dtype=torch.int64)  # [S]
        rows = len(ids) if every else 1
        logits = torch.empty(rows, self.vocab)  # [rows, V]
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("the compiled step needs a contiguous KV cache")
        cache = Cache(CACHE_KINDS[k_cache.dtype], k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[2])
        status = self._lib.chatcli_decode(ctypes.byref(self._model), ctypes.byref(cache), tokens.data_ptr(), len(ids),
                                          start, logits.data_ptr(), rows, _threads())
        if status:
            raise ValueError(f"the compiled step refused {len(ids)} ids at position {start}")
        return logits if every else logits[0]
