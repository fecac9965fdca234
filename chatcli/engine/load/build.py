"""Loading: a model name → a ready `Engine`, on the fastest path that computes the model exactly here.

A start sweeps the cache (`sweep`: what killed processes and vanished GGUF files left) before the
load and after it. The model's files come from `sources` (a hub id, a folder, a `.gguf` file, or the embedded
model); then, for a model folder:

- a model of a lean family (`weights.families`): a lean runner over its lean files (`load.lean`):
  the native one where the compiled kernel runs (no torch, no transformers imported), else torch's;
- anything else, `--runner hf` or `--device-map`: transformers' own model (`load.hf`).

A quantized GGUF whose blocks are not what runs (without `--quantize none` asking for that) says
why and what runs instead in the engine's `note`: one line that the front ends show at the start; so
does a model without a chat template of its own, which built-in one it got and why (`use_template`).
`--chat-template NAME|FILE` and `--raw` are read before the load and put in place after it.

This module imports neither torch nor transformers at the top.
"""

from __future__ import annotations

from chatcli.engine.load.lean import dequantized_note, lean_engine
from chatcli.engine.load.options import LoadError, LoadOptions, cap_context, chosen_template, placement
from chatcli.engine.load.sources import Source, each_candidate, read_config, resolve
from chatcli.engine.load.sweep import sweep_cache
from chatcli.engine.weights import Status
from chatcli.engine.weights.families import lean_support


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
    device, dtype = placement(options)
    template = chosen_template(options)  # a name that is no template: refused before any load
    sweep_cache()  # before the load: room for a conversion

    def attempt(name: str, explicit: bool):
        source = resolve(name, explicit, status, options.runner)
        if source.folder is None and not explicit:
            raise FileNotFoundError("not in the local Hugging Face cache")  # implicit ids are never fetched
        reason = why_not_lean(options, source)
        if reason is None:
            return lean_engine(source, device, dtype, options.kv_dtype, options.quantize, status, kernel=kernel)
        if options.runner == "lean":
            raise LoadError(f"--runner lean: {reason} (use --runner hf)")
        from chatcli.engine.load.hf import build_engine, load_source  # torch and transformers

        loaded = load_source(source, options, device, dtype, status)
        engine = build_engine(loaded, runner="hf", kv_dtype=options.kv_dtype)
        engine.note = dequantized_note(source, options.quantize, None, "transformers' model", reason)
        return engine

    try:
        engine = each_candidate(model, config_default, attempt)
    finally:
        sweep_cache()  # and after it: the file given is identified by now, so the entry of its former bytes goes
    cap_context(engine.runner, options.ctx_size)
    use_template(engine, template)
    return engine


def use_template(engine, template) -> None:
    """`template` (`chosen_template`'s: None for the model's own) in the engine's tokenizer; where the
    model has none and none was asked for, the note says which built-in one renders its turns."""
    tokenizer = engine.tokenizer
    if template is not None:
        tokenizer.use_template(template)
    elif tokenizer.chosen_why:
        said = (
            f"{engine.name} has no chat template: the {tokenizer.template_label} template renders its turns "
            f"({tokenizer.chosen_why}); --chat-template NAME|FILE picks another, --raw continues text as it is"
        )
        engine.note = "; ".join(n for n in (engine.note, said) if n)


def why_not_lean(options: LoadOptions, source: Source) -> str | None:
    """Why `source` takes transformers' runner (one line), or None where a lean runner runs it."""
    reason = "--runner hf" if options.runner == "hf" else "--device-map" if options.device_map else None
    if source.folder is None:
        return reason or "not in the local Hugging Face cache"
    return reason or lean_support(read_config(source.folder))
