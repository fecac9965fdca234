"""What to load, and how: the options every loading command takes, checked before any load.

`LoadOptions` declares each loading flag once (`chatcli.flags` turns its fields into click
options; the config file's `ctx_size` is `--ctx-size`'s default); `pick_device`, `pick_dtype` and
`pick_kv_dtype` resolve "auto" for this machine; `cap_context` applies `--ctx-size`;
`check_quantize` refuses a `--quantize` that cannot run, and `resolve_quantize` says what
`--quantize auto` means for a model; `chosen_template` reads `--chat-template` and `--raw`
(`text.templates`). No torch is imported unless a GPU could answer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from chatcli.engine.text.templates import check_chat_template

DTYPE_NAMES = ("float32", "bfloat16", "float16")
KV_DTYPE_NAMES = (*DTYPE_NAMES, "q8_0")  # q8_0: GGUF's Q8_0 blocks, the native runner's only (load.lean)
DEVICES = ("auto", "cpu", "cuda", "mps")
RUNNERS = ("auto", "hf", "lean")
QUANTIZE_CHOICES = ("auto", "none", "int8", "q4", "q8")


class LoadError(RuntimeError):
    """Nothing could be loaded; the message says what was tried and how to fix it."""


# --model/-m, beside the LoadOptions flags
MODEL_HELP = "A model's name (qwen3:4b, hf.co/USER/REPO:QUANT; pulled on first use; default), hub id, folder or .gguf."


def _flag(
    default, text: str, choices: tuple[str, ...] | None = None, kind: type | None = None, metavar=None, check=None
):
    """A field and its flag: default, help, the values it takes (the flag refuses any other as it parses
    the command line: a usage error, exit 2), (where its default does not say) its value type (int: a
    count, 1 or more), the name its value goes by in --help, and `check`, a function that raises a
    ValueError for a value the flag refuses as it parses, as it refuses one outside its choices."""
    meta = {"help": text, "choices": choices, "type": kind, "metavar": metavar, "check": check}
    return field(default=default, metadata=meta)


@dataclass
class LoadOptions:
    """How to load a model. Each field is a flag of the commands that load one (`chatcli.flags`:
    `--kv-dtype` for kv_dtype), with this default and help."""

    device: str = _flag("auto", "Where the model runs.", DEVICES)
    dtype: str = _flag("auto", "The weights' dtype (auto: float32 on a CPU, else bfloat16).", ("auto", *DTYPE_NAMES))
    device_map: str | None = _flag(None, "'auto': let accelerate place the model.")  # then transformers' model
    trust_remote_code: bool = _flag(False, "Allow the model's own Python code.")
    runner: str = _flag("auto", "The forward pass (auto: lean for Llama models).", RUNNERS)  # a ModelRunner
    kv_dtype: str = _flag(  # the lean runner's KV cache: see pick_kv_dtype
        "auto",
        "KV cache dtype (auto: bf16 on CPUs with bf16 matmuls, fp16 beside a GGUF's blocks; q8_0: 8-bit codes "
        "with a scale per 32, about half of bf16's memory, the compiled kernel only).",
        ("auto", *KV_DTYPE_NAMES),
    )
    quantize: str | None = _flag(
        "auto",
        "auto: a GGUF's own Q4_0/Q4_1 (q4) or Q8_0 (q8) blocks where the compiled kernel runs, else none; "
        "none: the weights as loaded (a GGUF dequantized to fp32); int8: int8 weights and activations (CPU); "
        "q4 / q8: 4- or 8-bit weights in groups of 32 (the compiled kernel).",
        QUANTIZE_CHOICES,
    )  # see chatcli.engine.weights.quantize and resolve_quantize
    ctx_size: int | None = _flag(  # a cap on the runner's context_limit: see cap_context
        None,
        "Context in tokens (llama.cpp's -c, ollama's num_ctx): at most the model's own, which is the default; "
        "the KV cache grows with the conversation up to it.",
        kind=int,
    )
    chat_template: str | None = _flag(  # see chosen_template
        None,
        "The chat template: a built-in one by llama.cpp's name (chatml, llama3, gemma, mistral, phi3, zephyr, "
        "vicuna, deepseek, …) or a Jinja file. Default: the model's own, else a built-in one for its architecture.",
        metavar="NAME|FILE",
        check=check_chat_template,
    )
    raw: bool = _flag(False, "No chat template: the text is continued as it is (a base model's completion).")


def cuda_possible() -> bool:
    """Whether asking torch about CUDA could say yes (an NVIDIA device node); no import of torch."""
    return any(Path("/dev").glob("nvidia[0-9]*")) or os.name == "nt"


def mps_possible() -> bool:
    import platform

    return platform.system() == "Darwin" and platform.machine() == "arm64"


def pick_device(device: str) -> str:
    if device not in DEVICES:
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
    """The lean runners' KV cache dtype by name. auto: bf16 for fp32 compute on a CPU with bf16
    matmuls in hardware (attention over a long history runs ~2× faster and the cache takes half
    the memory, as llama.cpp's f16 cache does; perplexity +0.05 % on SmolLM2-135M): on the embedded
    Q4_1 file, decode after 4,096 tokens 96 tok/s against 63 with an fp32 cache, perplexity 28.50
    against 28.75 (`chatcli bench --depth 0,4096 --kv-dtype …`, `chatcli bench --quality --kv-dtype …`,
    AMD EPYC Zen 4, 2026-12-06); else the weights' dtype. Beside a GGUF's own blocks (q4, q8, gguf:
    the compiled kernel's alone) fp16 in its place, llama.cpp's default cache, the same bytes: its 11
    bits of mantissa against bf16's 8 keep the logits 6-10x closer to an fp32 cache's (SmolLM2-135M's
    GGUF dequantized to fp32: largest difference 0.024 against 0.145 over 32 greedy tokens), perplexity
    at 4,000 tokens 17.88 against bf16's 17.91 and fp32's 17.90 (`benchmarks/kv_perplexity.py`), decode
    at depth 0 and 4,096 as fast as bf16's (300 steps each, interleaved one by one: a step's time 0.98x
    and 0.99x bf16's, medians; AMD EPYC, 2026-12-07). Greedy text on the Q4_1 file still need not be llama.cpp's: their
    activations' int8 rounding decides near-ties. int8 keeps fp32: there the bf16 cache
    cost +3.6 % perplexity against +0.4 % with an fp32 cache (`chatcli bench --quantize int8
    --kv-dtype ...`). q8_0 only where asked."""
    if kv_dtype != "auto":
        if kv_dtype not in KV_DTYPE_NAMES:
            raise LoadError(f"--kv-dtype must be auto, {', '.join(KV_DTYPE_NAMES[:-1])} or q8_0, got {kv_dtype!r}")
        return kv_dtype
    from chatcli.engine.cpu import has_native_bf16

    bf16 = device == "cpu" and dtype == "float32" and quantize != "int8" and has_native_bf16()
    if bf16 and quantize in ("q4", "q8", "gguf"):  # the kernel's blocks: the kernel's fp16 cache
        return "float16"
    return "bfloat16" if bf16 else dtype


# A GGUF's `general.file_type` (llama.cpp's LLAMA_FTYPE_MOSTLY_*) → the kind that reads its blocks as they are.
GGUF_KINDS = {2: "q4", 3: "q4", 7: "q8"}  # Q4_0, Q4_1, Q8_0
FLOAT_FILE_TYPES = (0, 1, 32)  # ALL_F32, MOSTLY_F16, MOSTLY_BF16: nothing is lost dequantizing them


def explicit_quantize(quantize: str | None) -> str | None:
    """int8 / q4 / q8 as asked; None for none, and for auto before it is resolved (`resolve_quantize`)."""
    return None if quantize in (None, "auto", "none") else quantize


def resolve_quantize(quantize: str | None, folder: Path | None, native: bool, gguf: Path | None = None) -> str | None:
    """What `--quantize` means for this model: auto is, where the compiled kernel runs it, a GGUF's own
    tensors in their own types (`gguf`: read from the file itself, see `weights.gguf_lean`), or, for a
    GGUF that is not read so, its block kind (q4 for a Q4_0 or Q4_1 file, q8 for Q8_0); else none, as
    for any other source (quantizing a K-quant GGUF again would round twice). `gguf`: the GGUF file
    given, where `folder` is its metadata folder (never one the folder's manifest recorded, which may
    be gone: the load would then run the file dequantized)."""
    if quantize != "auto":
        return explicit_quantize(quantize)
    if not native or folder is None or gguf is None:
        return None
    from chatcli.engine.weights.gguf_convert import gguf_file_type, recorded_direct_reason  # not at start-up

    return "gguf" if recorded_direct_reason(folder) is None else GGUF_KINDS.get(gguf_file_type(gguf))


def check_quantize(quantize: str | None, device: str, dtype: str) -> None:
    if quantize in (None, "auto", "none"):
        return  # nothing to refuse (auto resolves to none where quantizing cannot run)
    if quantize not in QUANTIZE_CHOICES:
        raise LoadError(f"--quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {quantize!r}")
    if device != "cpu":
        raise LoadError(f"--quantize {quantize} runs on the CPU only (the model is on {device}); use --device cpu")
    if dtype != "float32":
        raise LoadError(f"--quantize {quantize} quantizes float32 weights; the model is {dtype} (use --dtype float32)")


def placement(options: LoadOptions) -> tuple[str, str]:
    """The device and weights' dtype `options` ask for here, after refusing what cannot work
    (every loader's first step)."""
    if options.runner not in RUNNERS:
        raise LoadError(f"--runner must be auto, hf or lean, got {options.runner!r}")
    device = pick_device(options.device)
    dtype = pick_dtype(options.dtype, device)
    check_quantize(options.quantize, device, dtype)
    if options.kv_dtype != "auto":
        pick_kv_dtype(options.kv_dtype, device, dtype)  # a bad --kv-dtype: refused before any load
    check_ctx_size(options.ctx_size)
    return device, dtype


def chosen_template(options: LoadOptions):
    """The `Template` `--raw` or `--chat-template NAME|FILE` asks for (read now: before any load), or
    None for the model's own (a built-in one where it has none); one LoadError line for a name that is
    no template, a file that cannot be read or does not parse, or both flags."""
    from chatcli.engine.text.template import ChatTemplateError, compile_template
    from chatcli.engine.text.templates import RAW, UnknownTemplate, choose

    if options.raw and options.chat_template:
        raise LoadError("--raw continues the text without a template: drop --chat-template, or --raw")
    if options.raw:
        return RAW
    if not options.chat_template:
        return None
    try:
        chosen = choose(options.chat_template)
    except UnknownTemplate as exc:
        raise LoadError(str(exc)) from None
    try:
        compile_template(chosen.source)
    except ChatTemplateError as exc:
        raise LoadError(f"--chat-template {options.chat_template}: {exc}") from None
    return chosen


def check_ctx_size(ctx_size) -> None:
    """Refuse a `--ctx-size` (or the config's `ctx_size`) that is not a whole number of tokens above 0."""
    if ctx_size is not None and (not isinstance(ctx_size, int) or isinstance(ctx_size, bool) or ctx_size < 1):
        raise LoadError(f"--ctx-size must be a whole number of tokens, 1 or more, got {ctx_size!r}")


def cap_context(runner, ctx_size: int | None) -> None:
    """`--ctx-size`: the runner's context (the overflow check, the stats' `context_limit`, the KV cache's
    bound) no longer than `ctx_size`; a larger one leaves the model's own."""
    if ctx_size is not None:
        runner.context_limit = min(runner.context_limit, ctx_size)
