"""The in-process engine: load → tokenize → prefill → KV cache → decode → sample → detokenize → stats.

This module is the engine's public surface: the front ends (`chatcli.ui`, `chatcli.server`,
`chatcli.oneshot`, `chatcli.chat`, `chatcli.cli`) import only the names below, never a module
inside (an import contract in pyproject.toml checks it). They load an engine (`load_engine`,
`LoadOptions`, `LoadError`), run turns through the `ChatEngine` protocol with `SamplingParams`,
and read the events a turn yields (`Prefilled`, `Token`, `Finished`, with `TurnStats`).

The stages live in a folder each, one layer above the next (each imports only those below it):

    process/   the engine in a generation process of its own (`ProcessEngine`: the TUI's)
    load/      what to load: options, sources, the engine builder
    engine.py  the turn loop (`Engine`); remote.py, the same protocol over HTTP (`RemoteEngine`)
    runners/   the forward: native (the compiled kernel), torch lean, transformers; threads
    kv/        the KV cache: memory, sessions, prefixes, the pool, caches on disk
    weights/   files on disk: GGUF, lean files, blocks, quantization, tensor files, families
    sample/    logits → ids: sampling, grammar (tool calls too), prompt lookup, logprobs
    text/      tokenize (chat template + BPE), detokenize, tool calls as text
    events.py, params.py, stats.py, cpu.py: what every stage shares

No UI imports anywhere below this package. Importing it is cheap (`chatcli --help` pays for it):
the data types are imported at once, stdlib only; the names that bring numpy, the turn loop or the
loader are imported on first use (PEP 562 `__getattr__`), and torch and transformers only by the
modules that run them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from chatcli.engine.events import ChatEngine, Event, Finished, FinishReason, Prefilled, Token, call_syntax
from chatcli.engine.kv.memory import default_budget_bytes
from chatcli.engine.load.options import MODEL_HELP, LoadError, LoadOptions, check_ctx_size
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
    ToolCalls,
    setting_of,
    settings,
)
from chatcli.engine.remote import RemoteEngine, RemoteError
from chatcli.engine.runners.threads import release_cpu_threads
from chatcli.engine.sample.logprobs import token_entry
from chatcli.engine.stats import TurnStats, known
from chatcli.engine.text.template import ChatTemplateError
from chatcli.engine.text.templates import check_chat_template
from chatcli.engine.text.toolcalls import HERMES, Call, CallScanner, new_call_id, parse_calls

if TYPE_CHECKING:
    from chatcli.engine.engine import ContextOverflow, Engine, PromptCancelled
    from chatcli.engine.kv.pool import LeaseKind, SessionPool, fork_session
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.library import catalogue_names, local_models, model_names, remove_model
    from chatcli.engine.load.verify import verify_model_files
    from chatcli.engine.process.pipe import ProcessLost
    from chatcli.engine.process.proxy import ProcessEngine
    from chatcli.engine.runners.pooling import EmbeddingError, Embeddings
    from chatcli.engine.sample.grammar import GrammarError

_LAZY = {  # name -> the module that defines it, imported on first use (these bring numpy)
    "ContextOverflow": "chatcli.engine.engine",
    "Engine": "chatcli.engine.engine",
    "PromptCancelled": "chatcli.engine.engine",
    "LeaseKind": "chatcli.engine.kv.pool",
    "SessionPool": "chatcli.engine.kv.pool",
    "fork_session": "chatcli.engine.kv.pool",
    "load_engine": "chatcli.engine.load.build",
    "catalogue_names": "chatcli.engine.load.library",  # models by name: `chatcli models`, `rm`, /model's Tab
    "local_models": "chatcli.engine.load.library",
    "model_names": "chatcli.engine.load.library",
    "remove_model": "chatcli.engine.load.library",
    "verify_model_files": "chatcli.engine.load.verify",
    "ProcessEngine": "chatcli.engine.process.proxy",  # the engine in a generation process (the TUI's)
    "ProcessLost": "chatcli.engine.process.pipe",
    "EmbeddingError": "chatcli.engine.runners.pooling",  # Engine.embed's (serve's /v1/embeddings)
    "Embeddings": "chatcli.engine.runners.pooling",
    "GrammarError": "chatcli.engine.sample.grammar",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BIAS",
    "FLOAT",
    "HERMES",
    "INT",
    "MAX_TOP_LOGPROBS",
    "MODEL_HELP",
    "SEED",
    "STRINGS",
    "Call",
    "CallScanner",
    "ChatEngine",
    "ChatTemplateError",
    "ContextOverflow",
    "EmbeddingError",
    "Embeddings",
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
    "ProcessEngine",
    "ProcessLost",
    "PromptCancelled",
    "RemoteEngine",
    "RemoteError",
    "ResponseFormat",
    "SamplingParams",
    "SessionPool",
    "Setting",
    "Slash",
    "Token",
    "ToolCalls",
    "TurnStats",
    "call_syntax",
    "catalogue_names",
    "check_chat_template",
    "check_ctx_size",
    "default_budget_bytes",
    "fork_session",
    "known",
    "load_engine",
    "local_models",
    "model_names",
    "new_call_id",
    "parse_calls",
    "release_cpu_threads",
    "remove_model",
    "setting_of",
    "settings",
    "token_entry",
    "verify_model_files",
]
