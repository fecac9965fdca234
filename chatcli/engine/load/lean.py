"""A model of a lean family → an engine on a lean runner, over its lean files (converted here once).

Where the compiled kernel runs (the CPU, float32 weights, an fp32 or bf16 cache, attention shapes
it takes): `runners.native.NativeRunner`, and neither torch nor transformers is imported — start-up
is a file mapping. Elsewhere (no kernel, a GPU, bf16 weights, an fp16 cache): `runners.lean.LeanRunner`
on torch over the dense lean file. `lean_weights` is where a missing or stale lean file is converted
(`weights.lean_convert`); the file format itself (`weights.lean_file`) only opens files.
"""

from __future__ import annotations

from pathlib import Path

from chatcli.engine.engine import Engine
from chatcli.engine.load.options import FLOAT_FILE_TYPES, LoadError, pick_kv_dtype, resolve_quantize
from chatcli.engine.load.sources import Source, read_config
from chatcli.engine.runners import kernels
from chatcli.engine.weights import Status, sidecar
from chatcli.engine.weights.lean_file import (
    GGUF,
    GROUPED,
    INT8,
    SOURCE_FILE,
    LeanFileError,
    LeanWeights,
    lean_path,
    prune,
)
from chatcli.engine.weights.sidecar import unchanged


def lean_weights(
    folder: Path, kind: str, status: Status | None = None, model_loader=None, gguf: Path | None = None
) -> LeanWeights:
    """The lean file of `kind` for the model in `folder`, converted first where there is none
    that matches (one that does not is removed first): streamed from the folder's safetensors where
    the kind allows (`weights.lean_stream`), else through the whole transformers model (`model_loader()`
    gives it, where the caller holds one; see `weights.lean_convert`); a `gguf` file is written from
    `gguf`, the GGUF file `folder` (its `meta_folder`) was made from, see `weights.gguf_lean`."""
    path = lean_path(folder, kind)
    source = f"{path.parent.name}/{path.stem.rsplit('-', 1)[1]}"
    if path.is_file() and unchanged(path):
        try:
            return _with_gguf(LeanWeights(path, kind, source), gguf)
        except LeanFileError:
            pass  # converted again below
    sidecar.remove(path)  # found inconsistent, or not there: no half of an entry stays if converting fails
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / SOURCE_FILE).write_text(str(folder.resolve()))  # before any temporary: see lean_file.sweep
    if kind == GGUF:
        _convert_gguf(folder, path, source, status, gguf)
    else:  # torch and transformers: only to convert
        from chatcli.engine.weights.lean_convert import convert_lean
        from chatcli.engine.weights.lean_stream import convert_streamed

        # a folder's safetensors a block at a time, where the kind needs no forward pass; else the whole model
        if model_loader is not None or not convert_streamed(folder, path, kind, source, status):
            convert_lean(folder, path, kind, source, status=status, model_loader=model_loader)
    prune(path, kind)
    return _with_gguf(LeanWeights(path, kind, source), gguf)


def _with_gguf(weights: LeanWeights, gguf: Path | None) -> LeanWeights:
    """The lean file with the GGUF it was written from beside it (its experts may be read from there)."""
    weights.gguf = gguf
    return weights


def lean_engine(
    source: Source,
    device: str,
    dtype: str,
    kv: str,
    quantize: str | None,
    status: Status,
    model_loader=None,
    kernel: bool = True,
    tokenizer=None,
):
    """A lean runner (native where the kernel runs, else torch) over `source`'s lean files;
    `model_loader()` gives the transformers model and tokenizer to convert where a file is missing.
    `kv`: the --kv-dtype (auto: see `pick_kv_dtype`); `quantize`: the --quantize (auto: `resolve_quantize`)."""
    asked = quantize
    native, quantize = plan(source.folder, device, dtype, kv, quantize, kernel, source.gguf)
    blocks_only_native(source, native, quantize, lambda: _why_no_kernel(kernel, device, dtype, kv))
    kv = pick_kv_dtype(kv, device, dtype, quantize)  # float32, bfloat16, float16 or q8_0 where native: dtype is float32
    if kv == "q8_0":
        q8_only_native(source, native, lambda: _why_no_kernel(kernel, device, dtype, kv))
    status(f"Loading {source.name}")
    folder = source.folder if quantize == GGUF else source.weights(status)  # a GGUF read as it is needs no model
    if native:
        from chatcli.engine.runners.native import NativeRunner

        (kind,) = kinds(native, quantize, dtype)
        runner = NativeRunner(lean_weights(folder, kind, status, model_loader, source.gguf), kv_dtype=kv)
        runner.start_repacking()  # experts read from the GGUF's rows, until they are repacked
        note = "; ".join(n for n in (dequantized_note(source, asked, quantize, kind), runner.repacking_note()) if n)
    else:
        if quantize in GROUPED:
            raise LoadError(
                f"--quantize {quantize} needs the compiled kernel: {_why_no_kernel(kernel, device, dtype, kv)}"
            )
        import torch

        from chatcli.engine.runners.lean import DTYPES, LeanRunner

        dense = lean_weights(folder, f"{dtype}-dense", status, model_loader)
        int8 = lean_weights(folder, INT8, status, model_loader) if quantize else None
        runner = LeanRunner(dense, device=torch.device(device), kv_dtype=DTYPES[kv], int8=int8)
        runner.kernel_off = _why_no_kernel(kernel, device, dtype, kv) if kernel else "the torch lean runner, asked"
        note = dequantized_note(source, asked, quantize, f"{dtype}-dense on {device}", runner.kernel_off)
    engine = Engine(runner, tokenizer or folder_tokenizer(source.folder), source.name)
    engine.note, engine.source = note, source.where
    return engine


def dequantized_note(source: Source, asked: str | None, quantize: str | None, runs: str, why: str | None = None) -> str:
    """The start's one line where a quantized GGUF runs dequantized without `--quantize none` asking
    for it (`runs`: what it runs as; `why`: why its blocks are not read, by default the reason its
    metadata folder recorded that the kernel does not read the file), else ""."""
    if source.gguf is None or asked != "auto" or quantize is not None:
        return ""
    from chatcli.engine.weights.gguf_convert import gguf_file_type, recorded_direct_reason

    file_type = gguf_file_type(source.gguf)
    if file_type in (None, *FLOAT_FILE_TYPES):
        return ""  # its weights are floats already: nothing is lost
    import gguf

    try:
        name = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except ValueError:
        name = f"file type {file_type}"
    why = why or f"the kernel does not read the file as it is: {recorded_direct_reason(source.folder)}"
    return (
        f"{source.name} is {name}, but its blocks are not read here ({why}): it runs dequantized, as {runs}, "
        "slower and in several times the memory (--quantize none asks for that)"
    )


def blocks_only_native(source: Source, native: bool, quantize: str | None, why_no_kernel) -> None:
    """A mixture of experts (`families.MOE_FAMILIES`), or a GGUF of an architecture transformers' GGUF reader
    lacks (SmolLM3's, Granite's, OLMo 2's and 3's), runs on the kernel from the file's own blocks only: one line
    where it would not (`why_no_kernel()`: why the kernel does not run here), not transformers' text."""
    from chatcli.engine.weights.families import MOE_FAMILIES

    kind = read_config(source.folder).get("model_type")
    if native and quantize == GGUF:
        return
    if kind in MOE_FAMILIES:
        what = f"a mixture of experts ({kind})"
    else:
        arch = transformers_reads_no(source.gguf)
        if arch is None:
            return
        what = f"a GGUF of architecture {arch} (transformers reads none)"
    if not native:
        why = f"the kernel does not run here: {why_no_kernel()}"
    elif quantize is None:
        from chatcli.engine.weights.gguf_convert import recorded_direct_reason

        reason = recorded_direct_reason(source.folder)
        why = f"its blocks are not read directly: {reason}" if reason else "--quantize none asks for fp32 weights"
    else:
        why = f"--quantize {quantize} asks for other weights"
    raise LoadError(
        f"{source.name}: {what} runs only on the compiled kernel from the GGUF's own blocks, "
        f"and {why} (--runner hf tries transformers)"
    )


TRANSFORMERS_NAMES = {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe", "gpt-oss": "gpt_oss"}  # its spellings


def transformers_reads_no(gguf: Path | None) -> str | None:
    """The architecture of the GGUF `gguf` where transformers' GGUF reader has none (None: it has one, or
    this is no GGUF)."""
    if gguf is None:
        return None
    from chatcli.engine.load.refuse import header_architecture

    arch = header_architecture(gguf)
    try:
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    except ImportError:  # a transformers without a GGUF reader reads none
        return arch
    return arch if arch and TRANSFORMERS_NAMES.get(arch, arch) not in GGUF_CONFIG_MAPPING else None


def plan(folder: Path, device: str, dtype: str, kv: str, quantize: str | None, kernel: bool, gguf: Path | None = None):
    """(whether the native runner runs it, the resolved --quantize; `gguf`: the GGUF file given, where
    `folder` is its `meta_folder`)."""
    native = (
        kernel
        and device == "cpu"
        and dtype == "float32"
        and kv in ("auto", "float32", "bfloat16", "float16", "q8_0")
        and _native_shapes(read_config(folder))
        and _kernel()
    )
    return bool(native), resolve_quantize(quantize, folder, bool(native), gguf)


def q8_only_native(source: Source, native: bool, why) -> None:
    """A LoadError for `--kv-dtype q8_0` where the compiled kernel does not run the model (`why()`: why
    not) or where its heads take no scale per 32 dimensions: no other runner holds such a cache."""
    if not native:
        raise LoadError(f"--kv-dtype q8_0 needs the compiled kernel (the native runner): {why()}")
    from chatcli.engine.runners.native_cache import q8_reason

    reason = q8_reason(_head_dim(read_config(source.folder)))
    if reason:
        raise LoadError(f"--kv-dtype q8_0: {reason}")


def kinds(native: bool, quantize: str | None, dtype: str) -> list[str]:
    """The lean files' kinds a runner opens (none where `lean_engine` refuses the combination)."""
    if native:
        return [quantize if quantize in (*GROUPED, GGUF) else INT8 if quantize else "float32-panels"]
    if quantize in GROUPED:
        return []
    return [f"{dtype}-dense", *([INT8] if quantize else [])]


def _convert_gguf(folder: Path, path: Path, source: str, status: Status | None, gguf: Path | None) -> None:
    """Write the `gguf` lean file from `gguf`, the GGUF file given (never one `folder`'s manifest
    recorded: `folder`, its `meta_folder`, is named by its bytes); then the GGUF's old dequantized
    conversion, if an earlier chatcli made one, goes (its lean files with it: `prune`)."""
    import shutil

    from chatcli.engine.weights.gguf_convert import folder_for
    from chatcli.engine.weights.gguf_lean import convert_gguf_lean

    if gguf is None:
        raise LoadError(f"{folder.name}: no GGUF file to read its blocks from")
    limit = int(read_config(folder).get("max_position_embeddings") or 2048)
    # the experts left in the GGUF where the kernel reads their rows fast (AVX-512: kernels/project_raw.h)
    raw = kernels.build_name() == "avx512"
    convert_gguf_lean(gguf, path, limit, source, status, packer=kernels.library(), raw_experts=raw)
    shutil.rmtree(folder_for(gguf), ignore_errors=True)


def _native_shapes(config: dict) -> bool:
    """The kernel takes this model's attention shapes (else the torch lean runner runs it)."""
    from chatcli.engine.runners.native import shape_reason

    heads = config.get("num_attention_heads") or 1
    return shape_reason(_head_dim(config), heads, config.get("num_key_value_heads") or heads) is None


def _head_dim(config: dict) -> int:
    return config.get("head_dim") or (config.get("hidden_size") or 0) // (config.get("num_attention_heads") or 1)


def _why_no_kernel(kernel: bool, device: str, dtype: str, kv: str) -> str:
    if not kernel or device != "cpu":
        return "it runs on the CPU only"
    if dtype != "float32" or kv not in ("auto", "float32", "bfloat16", "float16", "q8_0"):  # as `plan` takes them
        return "it takes float32 weights and a float32, bfloat16, float16 or q8_0 KV cache"
    return kernels.why_not() or "the model's attention shapes are not the kernel's; use --quantize int8"


def _kernel() -> bool:
    return kernels.library() is not None


def folder_tokenizer(folder: Path):
    """The folder's tokenizer without transformers where it can be read so, else transformers'."""
    from chatcli.engine.text.tokenize import FolderTokenizer, TransformersTokenizer, UnsupportedTokenizer

    try:
        return FolderTokenizer(folder)
    except UnsupportedTokenizer:
        from transformers import AutoConfig, AutoTokenizer

        return TransformersTokenizer(
            AutoTokenizer.from_pretrained(str(folder), local_files_only=True),
            AutoConfig.from_pretrained(str(folder), local_files_only=True),
        )
