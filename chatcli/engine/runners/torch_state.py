"""Between torch tensors and the (safetensors code, numpy array) pairs that `KVCache.state()` gives.

numpy has no bfloat16: a bf16 tensor travels as its raw bits in uint16, tagged "BF16".
"""

from __future__ import annotations

import numpy as np
import torch

_CODES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}


def to_state(tensor: torch.Tensor) -> tuple[str, np.ndarray]:
    """A CPU copy of `tensor` as (code, numpy array)."""
    tensor = tensor.detach().to("cpu").contiguous()
    code = _CODES[tensor.dtype]
    if tensor.dtype == torch.bfloat16:
        return code, tensor.view(torch.int16).numpy().view(np.uint16)
    return code, tensor.numpy()


def from_state(value: tuple[str, np.ndarray], device=None) -> torch.Tensor:
    """(code, numpy array) back to a tensor (a copy, on `device`)."""
    code, array = value
    tensor = torch.from_numpy(np.array(array, copy=True))
    if code == "BF16":
        tensor = tensor.view(torch.bfloat16)
    elif tensor.dtype != _DTYPES[code]:
        raise ValueError(f"a {code} entry holds {array.dtype} data")
    return tensor.to(device) if device is not None else tensor


def logits_out(logits: torch.Tensor) -> np.ndarray:
    """A runner's fp32 logits for the engine: numpy, on the CPU."""
    return logits.detach().float().cpu().numpy()
