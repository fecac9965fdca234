"""A GGUF's sliding-window layers and their rope as llama.cpp reads them (`gguf_lean`, `gguf_meta`).

llama.cpp gives each family a fixed pattern (of every n layers the last attends to all, the rest slide)
unless the file says otherwise in `<arch>.attention.sliding_window_pattern`: each layer's flag, or its own
n. OLMo 3's files are `olmo2` ones with a window and that list of flags; their sliding layers rotate
unscaled (the file's YaRN is its full layers'), as Gemma 3's rotate by their own base.
"""

from __future__ import annotations

import numpy as np

from chatcli.engine.weights import gguf_oai
from chatcli.engine.weights.gguf_file import GGUFFile

SWA_PATTERN = {
    "gemma2": 2,
    "gemma3": 6,
    gguf_oai.ARCH: 2,
    "olmo2": 4,
}  # llama.cpp's: of every n layers the last attends to all, the rest slide (where the file gives no pattern)
WINDOWED = ("olmo2",)  # families that slide only where the file sets `attention.sliding_window` (OLMo 3 does)
OWN_SLIDING_ROPE = ("gemma3", "olmo2")  # sliding layers rotate unscaled, by `rope.freq_base_swa` where set
SWA_DEFAULT = {"gemma2": 4096}  # the window where the file does not say (llama.cpp's)


def sliding_layers(meta: GGUFFile) -> tuple:
    """Per layer, whether it slides, as llama.cpp reads it: `attention.sliding_window_pattern` where the
    file has it (each layer's flag, or an n: of every n layers the last attends to all), else the family's
    fixed n; a `WINDOWED` family only where the file sets a window. Empty where none slide."""
    pattern = SWA_PATTERN.get(meta.arch)
    if pattern is None or (meta.arch in WINDOWED and not meta.hp("attention.sliding_window")):
        return ()
    layers = int(meta.hp("block_count"))
    given = meta.hp("attention.sliding_window_pattern")
    if given is not None and not np.isscalar(given):
        flags = tuple(bool(flag) for flag in given)
        if len(flags) != layers:
            raise ValueError(f"attention.sliding_window_pattern has {len(flags)} flags for {layers} layers")
        return flags if any(flags) else ()
    pattern = int(given or pattern)
    return tuple(i % pattern < pattern - 1 for i in range(layers))


def rope_bases(meta: GGUFFile) -> tuple[float, float]:
    """The rope base of the full layers (`rope.freq_base`) and of the sliding ones (`rope.freq_base_swa`, else
    Gemma 3's 10000, the full layers' for any other family), as llama.cpp reads them."""
    base = float(meta.hp("rope.freq_base", 10000.0) or 10000.0)
    return base, float(meta.hp("rope.freq_base_swa", 10000.0 if meta.arch == "gemma3" else base) or base)


def own_sliding_rope(meta: GGUFFile, sliding: tuple) -> bool:
    """Whether the sliding layers get a rope table of their own: Gemma 3's (a base of 10000 where the file
    gives none), OLMo 3's where its table differs (the file's YaRN or linear scaling is the full layers' alone)."""
    if meta.arch not in OWN_SLIDING_ROPE or not any(sliding):
        return False
    if meta.arch == "gemma3":
        return True
    full, local = rope_bases(meta)
    return str(meta.hp("rope.scaling.type", "none") or "none") != "none" or local != full
