"""The runners the measuring aids compare, by name: `native`, `native-int8` (the compiled
kernel over lean files), `lean`, `lean-int8` (the torch lean runner over the same files) and
`hf` (transformers). Each comes as an engine on the CPU with an fp32 KV cache."""

from __future__ import annotations

from chatcli.engine.load.build import load_engine
from chatcli.engine.load.options import LoadOptions

NAMES = ("native", "native-int8", "native-q4", "native-q8", "lean", "lean-int8", "hf")


def engine_named(name: str, model: str | None = None):
    if name not in NAMES:
        raise SystemExit(f"unknown runner {name!r}: one of {', '.join(NAMES)}")
    if name == "hf":
        from chatcli.engine.load.hf import build_engine, load

        return build_engine(load(model, LoadOptions(device="cpu")), runner="hf")
    kind, _, quant = name.partition("-")
    options = LoadOptions(device="cpu", runner="lean", quantize=quant or None, kv_dtype="float32")
    engine = load_engine(model, options, kernel=kind == "native")
    want = "NativeRunner" if kind == "native" else "LeanRunner"
    if type(engine.runner).__name__ != want:
        raise SystemExit(f"{name}: the compiled kernel does not run here")
    return engine
