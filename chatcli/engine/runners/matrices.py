"""The kernel's Matrix structs over a lean file's arrays: one block type's (`block_matrix`), or parts stacked along
the outputs (`parts_matrix`)."""

from __future__ import annotations

import ctypes

from chatcli.engine.runners.kernels.structs import BLOCK_KINDS, WEIGHT_PARTS, Matrix


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
