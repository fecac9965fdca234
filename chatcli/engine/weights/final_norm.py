"""The final RMSNorm's multiplier of a lean file's model: what its last hidden states are scaled by
before the head, and so what an embedding pools (`ModelRunner.hidden_states`).

The kinds whose norms are kept apart (q4, q8, gguf) hold it as `final_norm`; the others fold it into the
head (`lean_convert`), so it is read from the model folder the file was converted from (its lean folder's
`source.txt`), as the conversion read it: `model.norm.weight` (Gemma's norms multiply by 1 + weight).
Numpy only (`tensorfile.MappedTensors`): no torch, no transformers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from chatcli.engine.weights.families import GEMMA
from chatcli.engine.weights.lean_file import SOURCE_FILE, LeanWeights

NAMES = ("model.norm.weight", "model.language_model.norm.weight", "language_model.model.norm.weight")


def _float32(array: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":  # stored as uint16: the high half of a float32
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


def final_norm(weights: LeanWeights) -> np.ndarray | None:
    """The final norm's multiplier [hidden] fp32, or None where neither the file nor its source has it."""
    from chatcli.engine.weights.tensorfile import MappedTensors, TensorFileError

    c = weights.config
    if "final_norm" in weights.file.tensors:
        return np.array(weights.array("final_norm"), dtype=np.float32)[: c.hidden]
    try:
        folder = Path((weights.file.path.parent / SOURCE_FILE).read_text().strip())
        files = sorted(folder.glob("*.safetensors"))
    except OSError:
        return None
    for path in files:
        try:
            tensors = MappedTensors(path)
        except (OSError, TensorFileError):
            continue
        for name in NAMES:
            if name in tensors:
                weight = _float32(tensors.array(name), tensors.tensors[name].dtype)[: c.hidden]
                return weight + 1 if c.family in GEMMA else weight
    return None
