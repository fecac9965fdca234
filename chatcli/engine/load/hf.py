"""Loading through transformers: `AutoModelForCausalLM` and its tokenizer (imports torch and transformers).

What `build.load_engine` falls back to for models the lean runners do not cover, `--runner hf`
and `--device-map`; also the bench's `generate()` baseline and the tests' reference model.
`build_engine` wraps a loaded model in an engine: the HF runner, or a lean runner over lean
files converted from the loaded model itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from chatcli.engine.engine import Engine
from chatcli.engine.load.lean import lean_engine
from chatcli.engine.load.options import LoadError, LoadOptions, check_quantize, explicit_quantize, placement
from chatcli.engine.load.sources import Source, each_candidate, hub_folder, resolve
from chatcli.engine.text.tokenize import TransformersTokenizer
from chatcli.engine.weights import Status
from chatcli.engine.weights.families import context_limit, lean_support


@dataclass
class LoadedModel:
    model: object
    tokenizer: object
    name: str  # what the user sees: a file name or a hub id
    source: str  # where it came from: a path or a hub id
    device: str
    dtype: str
    folder: Path | None = None  # the model's files (None: a hub model transformers fetched)
    extra: dict = field(default_factory=dict)


def load(
    model: str | None = None,
    options: LoadOptions | None = None,
    config_default: str | None = None,
    status: Status | None = None,
) -> LoadedModel:
    """The transformers model and tokenizer for `model` (see `sources.candidates`)."""
    options = options or LoadOptions()
    status = status or (lambda *_a, **_k: None)
    device, dtype = placement(options)
    return each_candidate(
        model,
        config_default,
        lambda name, explicit: load_source(resolve(name, explicit, status), options, device, dtype, status, explicit),
    )


def load_source(
    source: Source, options: LoadOptions, device: str, dtype: str, status: Status, explicit: bool = True
) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    weights = source.weights(status)
    where = str(weights) if weights is not None else source.hub_id
    kwargs = dict(
        trust_remote_code=options.trust_remote_code, local_files_only=source.folder is not None or not explicit
    )
    status(f"Loading {source.name}")
    tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    place = {"device_map": options.device_map} if options.device_map else {}
    model = AutoModelForCausalLM.from_pretrained(where, dtype=getattr(torch, dtype), **place, **kwargs)
    if not options.device_map:
        model.to(device)
    model.eval()
    extra = {"runner": options.runner, "quantize": options.quantize, "kv_dtype": options.kv_dtype}
    folder = weights
    if folder is None and source.hub_id:
        folder = hub_folder(source.hub_id)  # fetched now
    return LoadedModel(model, tokenizer, source.name, source.where, str(model.device.type), dtype, folder, extra)


def build_engine(
    loaded: LoadedModel,
    runner: str | None = None,
    quantize: str | None = None,
    kv_dtype: str | None = None,
    kernel: bool = True,
):
    """Wrap a loaded model in the engine.

    `runner`: "auto" (a lean runner for models of the lean families, else HF), "hf" or "lean";
    `quantize`: a --quantize value (auto: see `options.resolve_quantize`); `kv_dtype`: see
    `options.pick_kv_dtype`; `kernel`: the lean runner may be the native one (the compiled kernel)
    where it runs. Each defaults to what `LoadOptions` asked for at load.
    """
    model = loaded.model
    runner = runner or loaded.extra.get("runner") or "auto"
    quantize = quantize or loaded.extra.get("quantize")
    kv_dtype = kv_dtype or loaded.extra.get("kv_dtype") or "auto"
    if runner not in ("auto", "hf", "lean"):
        raise LoadError(f"--runner must be auto, hf or lean, got {runner!r}")
    device, dtype = str(model.device.type), str(model.dtype).removeprefix("torch.")
    check_quantize(quantize, device, dtype)
    tokenizer = TransformersTokenizer(loaded.tokenizer, model.config, getattr(model, "generation_config", None))
    reason = lean_support(model.config) or (
        "the model is split across devices (--device-map)" if getattr(model, "hf_device_map", None) else None
    )
    if runner == "lean" and reason:
        raise LoadError(f"--runner lean: {reason} (use --runner hf)")
    if runner == "hf" or reason:
        engine = Engine(
            make_hf_runner(model, context_limit(model.config, loaded.tokenizer), explicit_quantize(quantize), kv_dtype),
            tokenizer,
            loaded.name,
        )
        engine.source = loaded.source
        return engine
    folder = loaded.folder
    if folder is None:
        raise LoadError(f"{loaded.name}: the lean runner needs the model's files on disk (use --runner hf)")
    source = Source(folder, loaded.name, loaded.source)
    return lean_engine(
        source,
        device,
        dtype,
        kv_dtype,
        quantize,
        lambda *_a, **_k: None,
        model_loader=lambda: (model, loaded.tokenizer),
        kernel=kernel,
        tokenizer=tokenizer,
    )


def make_hf_runner(model, limit: int, quantize: str | None = None, kv_dtype: str = "auto"):
    """The transformers runner for `model`; a LoadError (one line) for a choice that cannot work."""
    from chatcli.engine.runners.hf import HFRunner

    if kv_dtype not in ("auto", str(model.dtype).removeprefix("torch.")):
        raise LoadError(
            f"--kv-dtype {kv_dtype}: the HF runner keeps its cache in the model's dtype "
            f"({str(model.dtype).removeprefix('torch.')}); use --dtype, or --runner lean for a model of a lean family"
        )
    if quantize in ("q4", "q8"):
        raise LoadError(
            f"--quantize {quantize} runs on the lean path in the compiled kernel; this model takes the HF runner"
        )
    if quantize == "int8":
        from chatcli.engine.weights.quantize import QuantizeError, pick_engine, quantize_hf_model

        try:
            pick_engine()
        except QuantizeError as exc:
            raise LoadError(str(exc)) from None
        return HFRunner(quantize_hf_model(model), limit, quantized=True)
    return HFRunner(model, limit)
