"""Lean tensors in the layout their reader wants, from torch weights (used at conversion only).

`panels` (the kernel's fp32 panels of 64 outputs), `pack_int8` / `unpack_int8` (int8 with a scale
and a row sum per output, in VNNI's order), `dense` (the torch lean runner's `w_t [k, n]`),
`grouped_arrays` (q4 / q8 blocks, a GGUF's own where it has them: `quant_blocks`) and
`padded_vector` (a per-layer vector padded to the file's 64-byte alignment). See `lean_file`.
"""

from __future__ import annotations

import torch

from chatcli.engine.weights.lean_file import PANEL, norm_before, padded16
from chatcli.engine.weights.quant_blocks import GGUFBlocks, concat, pack, quantize_q4, quantize_q8


def panels(w_t: torch.Tensor) -> torch.Tensor:
    """`w_t [k, n]` → `[ceil(n/64), k, 64]` fp32, zero past n: the kernel's fp32 layout."""
    k, n = w_t.shape
    count = -(-n // PANEL)
    out = torch.zeros(count * PANEL, k, dtype=torch.float32)
    out[:n] = w_t.t()
    return out.view(count, PANEL, k).transpose(1, 2).contiguous()


def pack_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`weight [n, k]` → (packed `[ceil(n/16), kp/4, 16, 4]` int8, scale `[ceil16(n)]`, row sums
    `[ceil16(n)]` int32): symmetric per row, 16 outputs' 4 consecutive inputs per 64 bytes."""
    w = weight.detach().float()
    n, k = w.shape
    kp, blocks = -(-k // 4) * 4, -(-n // 16)
    scale = torch.ones(blocks * 16)
    scale[:n] = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-8)
    q = torch.zeros(blocks * 16, kp, dtype=torch.int8)
    q[:n, :k] = torch.round(w / scale[:n, None]).clamp_(-127, 127).to(torch.int8)
    wsum = q.sum(dim=1, dtype=torch.int32)
    packed = q.view(blocks, 16, kp // 4, 4).transpose(1, 2).contiguous()
    return packed, scale, wsum


def unpack_int8(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """`pack_int8`'s packed weights back to `[n, k]` int8."""
    blocks, quads = packed.shape[0], packed.shape[1]
    return packed.transpose(1, 2).reshape(blocks * 16, quads * 4)[:n, :k]


def padded_vector(v: torch.Tensor) -> torch.Tensor:
    """A stored fp32 vector: zero past its length up to `padded16` (the file's 64-byte alignment)."""
    return torch.nn.functional.pad(v.detach().float(), (0, padded16(len(v)) - len(v)))


def dense(w_t: torch.Tensor, dtype: str):
    """`w_t [k, n]` in `dtype` for the torch lean runner (bf16 as its uint16 bits, safetensors' BF16)."""
    tensor = w_t.to(getattr(torch, dtype)).contiguous()
    if tensor.dtype == torch.bfloat16:
        return ("BF16", tensor.view(torch.int16).numpy().view("uint16"))
    return tensor.numpy()


def grouped_arrays(parts_of: dict, names: dict, kind: str, gguf: GGUFBlocks | None = None, status=None) -> dict:
    """A `q4` / `q8` lean file's projections (`<name>.w/.d/.m`, see `pack`) and the RMSNorm weights kept
    apart, from `lean_convert.projection_parts` (`names`: parameter name by data pointer): each weight as
    the GGUF's own blocks where `gguf` has them exactly, else quantized here (q4: layers 4-bit, head 8-bit)."""
    status = status or (lambda *_a, **_k: None)
    arrays = {}
    for i, (name, (parts, norm)) in enumerate(parts_of.items()):
        status("Writing the lean weights", i, len(parts_of))
        outer = name in ("head", "embed")
        bits = 8 if kind == "q8" or outer else 4
        codes = [gguf.codes(names.get(w.data_ptr()), w, rows) if gguf else None for w, rows in parts]
        if outer and kind == "q4" and all(c is not None and c.bits == 4 for c in codes):
            bits = 4  # the GGUF's 4-bit head (or embedding) as it is
        if not all(c is not None and c.bits == bits for c in codes):
            quantize = quantize_q4 if bits == 4 else quantize_q8
            codes = [quantize((w if rows is None else w[rows]).detach().float().numpy()) for w, rows in parts]
        for key, value in pack(concat(codes)).items():
            arrays[f"{name}.{key}"] = value
        if norm is not None:
            arrays[norm_before(name)] = padded_vector(norm).numpy()
    status("Writing the lean weights", len(parts_of), len(parts_of))
    return arrays
