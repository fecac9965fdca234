"""The weights stage: model files on disk and what the runners read from them.

`gguf_convert` (a GGUF → a transformers model folder, cached, named by `identity`: the BLAKE3
of the file's bytes, remembered against its stat), `families` (which architectures
the lean runners compute exactly, and their shapes' extras), `lean_file` (the lean file format:
what a lean runner maps), `lean_convert` (a transformers model → a lean file), `quant_blocks`
(GGUF's Q4_0 / Q4_1 / Q8_0 blocks, packed for the kernel), `quantize` (int8 for torch and the
SmoothQuant measurements), `tensorfile` (safetensors, written atomically and memory-mapped),
`sidecar` (a cached file's size, mtime and BLAKE3 beside it: lean files, the kernel's builds).
The loader (`engine.load`) decides what to convert and when; nothing here starts it.
"""

from __future__ import annotations

from collections.abc import Callable

Status = Callable[..., None]  # a loader's progress callback: status(text, done=None, total=None)
