"""The in-process engine: load → tokenize → prefill → KV cache → decode → sample → detokenize → stats.

This module is the engine's public surface: the front ends (`chatcli.ui`, `chatcli.server`,
`chatcli.oneshot`, `chatcli.chat`, `chatcli.cli`) import only the names below, never a module
inside (an import contract in pyproject.toml checks it). They load an engine (`load_engine`,
`LoadOptions`, `LoadError`), run turns through the `ChatEngine` protocol with `SamplingParams`,
and read the events a turn yields (`Prefilled`, `Token`, `Finished`, with `TurnStats`).

The stages live in a folder each, one layer above the next (each imports only those below it):

    load/      what to load: options, sources, the engine builder
    engine.py  the turn loop (`Engine`); remote.py, the same protocol over HTTP (`RemoteEngine`)
    runners/   the forward: native (the compiled kernel), torch lean, transformers; threads
    kv/        the KV cache: memory, sessions, prefixes, the pool, caches on disk
    weights/   files on disk: GGUF, lean files, blocks, quantization, tensor files, families
    sample/    logits → ids: sampling, grammar, prompt lookup, logprobs
    text/      tokenize (chat template + BPE) and detokenize
    events.py, params.py, stats.py, cpu.py: what every stage shares

No UI imports anywhere below this package. Importing it is cheap: torch and transformers are
imported by the modules that need them, when they run.
"""

from __future__ import annotations

from chatcli.engine.engine import ContextOverflow, Engine
from chatcli.engine.events import ChatEngine, Event, Finished, FinishReason, Prefilled, Token
from chatcli.engine.kv.pool import LeaseKind, SessionPool, default_budget_bytes, fork_session
from chatcli.engine.load.build import load_engine
from chatcli.engine.load.options import MODEL_HELP, LoadError, LoadOptions
from chatcli.engine.params import (
    BIAS,
    FLOAT,
    INT,
    MAX_TOP_LOGPROBS,
    SEED,
    STRINGS,
    InvalidParameter,
    ResponseFormat,
    SamplingParams,
    Setting,
    Slash,
    setting_of,
    settings,
)
from chatcli.engine.remote import RemoteEngine, RemoteError
from chatcli.engine.runners.threads import release_cpu_threads
from chatcli.engine.sample.grammar import GrammarError
from chatcli.engine.sample.logprobs import token_entry
from chatcli.engine.stats import TurnStats, known

__all__ = [
    "BIAS",
    "FLOAT",
    "INT",
    "MAX_TOP_LOGPROBS",
    "MODEL_HELP",
    "SEED",
    "STRINGS",
    "ChatEngine",
    "ContextOverflow",
    "Engine",
    "Event",
    "FinishReason",
    "Finished",
    "GrammarError",
    "InvalidParameter",
    "LeaseKind",
    "LoadError",
    "LoadOptions",
    "Prefilled",
    "RemoteEngine",
    "RemoteError",
    "ResponseFormat",
    "SamplingParams",
    "SessionPool",
    "Setting",
    "Slash",
    "Token",
    "TurnStats",
    "default_budget_bytes",
    "fork_session",
    "known",
    "load_engine",
    "release_cpu_threads",
    "setting_of",
    "settings",
    "token_entry",
]
