"""Sampling settings: the values every front end passes to the engine, validated on creation.

Each field declares, once, a `Setting` in its metadata: the name users see, its range, and how it
appears on each surface — a command-line flag, a `[sampling]` key of the config file, a slash
command (and so a /settings line), a label in the TUI header, fields of an OpenAI request. The
front ends derive theirs from `settings()`, so a new field is one declaration here.

Pure data (no torch, no click), so the command line can check values before anything heavy is imported.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs
MAX_LOOKUP = 16  # drafted tokens per verifying pass; past a few, a draft is rarely accepted to its end

# Value kinds. SEED: a whole number, or None for a fresh seed each turn ("off"); STRINGS: a tuple of strings;
# BIAS: token id → logit bias, kept as sorted (id, bias) pairs (given as {"id": bias} or "ID=BIAS" strings);
# FORMAT: a `ResponseFormat` or None (each surface reads its own spelling: a schema file, OpenAI's response_format).
FLOAT, INT, SEED, STRINGS, BIAS, FORMAT = "float", "int", "seed", "strings", "bias", "format"


class InvalidParameter(ValueError):
    """A sampling value outside its range; the message names the value and the range."""


@dataclass(frozen=True)
class Slash:
    """The slash command that sets a field: `/name usage` (or an alias), with its /help line."""

    name: str
    help: str
    usage: str
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Setting:
    """One SamplingParams field as users see it; None, False or () where a surface lacks it."""

    name: str  # `--name`, range messages, /settings and the note after a slash command
    kind: str  # FLOAT | INT | SEED | STRINGS | BIAS | FORMAT
    flag: str | None = None  # the help of its `chatcli` flag
    config: bool = False  # a [sampling] key of the config file, spelled like the field
    slash: Slash | None = None  # its TUI command; a setting with one has a /settings line too
    header: str | None = None  # its label in the TUI header line (what shapes a reply)
    api: tuple[str, ...] = ()  # the request fields that set it, newest name first (the first one sent wins)
    valid: Callable[[Any], bool] | None = None  # the range check
    expected: str = ""  # the range, as the message says it

    def show(self, value) -> str:
        """A value as the TUI writes it: 'off' for no seed, numbers without trailing zeros."""
        if value is None or (self.kind == BIAS and not value):
            return "off"
        if self.kind == BIAS:
            return " ".join(f"{token}={bias:g}" for token, bias in value)
        return f"{value:g}" if self.kind == FLOAT else str(value)


@dataclass(frozen=True)
class ResponseFormat:
    """What a reply must be: any JSON object (`json_object`), or JSON valid against a JSON schema
    (`json_schema`; `schema` is its JSON text, `name` and `strict` what the client sent). The engine
    holds the reply to it by constrained decoding (`chatcli.engine.sample.grammar`), strict or not."""

    kind: str
    schema: str = ""
    name: str = ""
    strict: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("json_object", "json_schema"):
            raise InvalidParameter(f"a response format is json_object or json_schema, got {self.kind!r}")
        if self.kind == "json_schema":
            try:
                parsed = json.loads(self.schema)
            except ValueError as exc:
                raise InvalidParameter(f"the JSON schema does not parse: {exc}") from None
            if parsed is False:
                raise InvalidParameter("the JSON schema is false: no reply could match it")
            if not isinstance(parsed, (dict, bool)):
                raise InvalidParameter("a JSON schema is an object (or true)")

    @classmethod
    def json_schema(cls, schema, name: str = "", strict: bool = False) -> ResponseFormat:
        """From a decoded schema (a dict) or its JSON text."""
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema), name, strict)

    def schema_object(self) -> dict:
        """The schema the reply is held to: the given one (`true`: any JSON), or for json_object any object."""
        if self.kind != "json_schema":
            return {"type": "object"}
        parsed = json.loads(self.schema)
        return {} if parsed is True else parsed

    def to_openai(self) -> dict:
        """As an OpenAI request's `response_format` (what the remote engine sends; OpenAI's names are
        [A-Za-z0-9_-]{1,64})."""
        if self.kind == "json_object":
            return {"type": "json_object"}
        name = re.sub(r"[^A-Za-z0-9_-]", "_", self.name)[:64] or "reply"
        spec = {"name": name, "schema": self.schema_object(), "strict": self.strict}
        return {"type": "json_schema", "json_schema": spec}


AUTO, REQUIRED, NONE = "auto", "required", "none"  # a ToolCalls' choices, besides a function's name


@dataclass(frozen=True)
class ToolCalls:
    """The functions a reply may call: OpenAI's `tools` (its list as JSON text: hashable); `choice` auto
    (text or calls), required (calls only), none (text only, no tools shown) or a function's name (a call
    of it), held by the grammar when not auto (`chatcli.engine.sample.tools`); `parallel`: several calls."""

    tools: str
    choice: str = AUTO
    parallel: bool = True

    def __post_init__(self) -> None:
        if self.choice not in (AUTO, REQUIRED, NONE, *(f.get("name") for f in self.functions())):
            raise InvalidParameter(f"tool choice {self.choice!r} names no function of the tools")

    @classmethod
    def of(cls, tools: list[dict], choice: str = AUTO, parallel: bool = True) -> ToolCalls:
        return cls(json.dumps(tools, ensure_ascii=False), choice, parallel)

    def functions(self) -> list[dict]:
        return [tool["function"] for tool in json.loads(self.tools)]

    def offered(self) -> list[dict] | None:  # the tools the chat template shows the model
        return None if self.choice == NONE else json.loads(self.tools)

    @property
    def forced(self) -> bool:  # the reply must be calls
        return self.choice not in (AUTO, NONE)

    def callable(self) -> list[dict]:  # the functions a call may name
        return [f for f in self.functions() if self.choice in (AUTO, REQUIRED, f["name"])]


def _declare(default, setting: Setting):
    return field(default=default, metadata={"setting": setting})


def _finite(value) -> bool:
    return math.isfinite(value)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = _declare(
        0.8,
        Setting(
            "temperature",
            FLOAT,
            flag="0 is greedy.",
            config=True,
            header="temp",
            api=("temperature",),
            slash=Slash("temp", "sampling temperature (0 = greedy)", "X", ("temperature",)),
            valid=lambda v: _finite(v) and v >= 0,
            expected=">= 0",
        ),
    )
    top_k: int = _declare(
        40,
        Setting(
            "top-k",
            INT,
            flag="0 disables.",
            config=True,
            header="top-k",
            api=("top_k",),
            slash=Slash("top-k", "keep the K most likely tokens (0 = off)", "N"),
            valid=lambda v: v >= 0,
            expected=">= 0 (0 disables it)",
        ),
    )
    top_p: float = _declare(
        0.95,
        Setting(
            "top-p",
            FLOAT,
            flag="In (0, 1]; 1 disables.",
            config=True,
            header="top-p",
            api=("top_p",),
            slash=Slash("top-p", "nucleus sampling threshold (1 = off)", "P"),
            valid=lambda v: _finite(v) and 0 < v <= 1,
            expected="in (0, 1]",
        ),
    )
    min_p: float = _declare(
        0.05,
        Setting(
            "min-p",
            FLOAT,
            flag="In [0, 1]; 0 disables.",
            config=True,
            header="min-p",
            api=("min_p",),
            slash=Slash("min-p", "drop tokens below P × the top probability (0 = off)", "P"),
            valid=lambda v: _finite(v) and 0 <= v <= 1,
            expected="in [0, 1]",
        ),
    )
    repeat_penalty: float = _declare(
        1.0,
        Setting(
            "repeat-penalty",
            FLOAT,
            flag="1 disables.",
            config=True,
            header="rep",
            api=("repetition_penalty", "repeat_penalty"),  # vLLM's spelling, then llama.cpp's
            slash=Slash("repeat-penalty", "penalty on recently seen tokens (1 = off)", "X"),
            valid=lambda v: _finite(v) and v > 0,
            expected="> 0 (1 disables it)",
        ),
    )
    presence_penalty: float = _declare(
        0.0,
        Setting(
            "presence-penalty",
            FLOAT,
            flag="Subtract this from the logit of each token seen in the last repeat-last-n (OpenAI's; 0 disables).",
            config=True,
            api=("presence_penalty",),
            slash=Slash("presence-penalty", "subtract X from tokens already seen (0 = off)", "X"),
            valid=lambda v: _finite(v) and -2 <= v <= 2,
            expected="in [-2, 2]",
        ),
    )
    frequency_penalty: float = _declare(
        0.0,
        Setting(
            "frequency-penalty",
            FLOAT,
            flag="Subtract this times its count from the logit of each token seen (OpenAI's; 0 disables).",
            config=True,
            api=("frequency_penalty",),
            slash=Slash("frequency-penalty", "subtract X per time a token was seen (0 = off)", "X"),
            valid=lambda v: _finite(v) and -2 <= v <= 2,
            expected="in [-2, 2]",
        ),
    )
    # How many recent context tokens the penalties look at: the engine's own, on no surface.
    repeat_last_n: int = _declare(64, Setting("repeat-last-n", INT, valid=lambda v: v >= 0, expected=">= 0"))
    max_tokens: int = _declare(
        1024,
        Setting(
            "max-tokens",
            INT,
            flag="Most tokens in a reply.",
            config=True,
            header="max",
            api=("max_completion_tokens", "max_tokens"),
            slash=Slash("max-tokens", "longest reply, in tokens", "N"),
            valid=lambda v: v >= 1,
            expected=">= 1",
        ),
    )
    # Prompt lookup: draft up to this many tokens, verified in one pass (a reply's speed: not in the header).
    lookup: int = _declare(
        4,
        Setting(
            "lookup",
            INT,
            flag="Draft up to N tokens from the conversation, verified in one pass (0 disables).",
            config=True,
            slash=Slash("lookup", "draft up to N tokens from the conversation (0 = off)", "N"),
            valid=lambda v: 0 <= v <= MAX_LOOKUP,
            expected=f"in [0, {MAX_LOOKUP}] (0 disables it)",
        ),
    )
    seed: int | None = _declare(
        None,
        Setting(
            "seed",
            SEED,
            flag="Seed the sampler for a reproducible run.",
            config=True,
            header="seed",
            api=("seed",),
            slash=Slash("seed", "fix the random seed, or 'off' for a fresh one each turn", "N|off"),
            valid=lambda v: v is None or 0 <= v < 2**64,
            expected="in [0, 2**64) (or off)",
        ),
    )
    stop: tuple[str, ...] = _declare(
        (), Setting("stop", STRINGS, flag="Stop at this string (repeatable).", api=("stop",))
    )
    logit_bias: tuple[tuple[int, float], ...] = _declare(
        (),
        Setting(
            "logit-bias",
            BIAS,
            flag="ID=BIAS: add BIAS (-100..100) to that token id's logit; -100 bans it (repeatable).",
            config=True,
            api=("logit_bias",),
            slash=Slash("logit-bias", "add BIAS to token ID's logit; -100 bans it ('off' clears)", "ID=BIAS …|off"),
            valid=lambda v: all(t >= 0 and _finite(b) and -100 <= b <= 100 for t, b in v),
            expected="token ids >= 0 with biases in [-100, 100]",
        ),
    )
    # Per-token log-probabilities with the N most likely alternatives (None: none computed); the
    # server sets it from `logprobs` / `top_logprobs`, the one-shot from --logprobs.
    logprobs: int | None = _declare(
        None,
        Setting(
            "logprobs",
            SEED,
            flag="With --json: each token's log-probability and the N most likely alternatives (0-20).",
            valid=lambda v: v is None or 0 <= v <= MAX_TOP_LOGPROBS,
            expected=f"in [0, {MAX_TOP_LOGPROBS}]",
        ),
    )

    # Structured output: the reply held to JSON (a schema) by a token mask each step; the one-shot's
    # --json-schema and the server's response_format set it.
    response_format: ResponseFormat | None = _declare(
        None,
        Setting(
            "response-format",
            FORMAT,
            valid=lambda v: v is None or isinstance(v, ResponseFormat),
            expected="a ResponseFormat (or None)",
        ),
    )

    # The server's tools and tool_choice: shown to the model by its chat template, a forced choice held.
    tools: ToolCalls | None = _declare(None, Setting("tools", FORMAT, valid=lambda v: isinstance(v, ToolCalls | None)))

    def __post_init__(self) -> None:
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        for name, setting in _SETTINGS.items():
            value = getattr(self, name)
            if setting.valid is not None and not setting.valid(value):
                shown = setting.show(value) if setting.kind == BIAS else value  # a bias as ID=BIAS pairs
                raise InvalidParameter(f"{setting.name} must be {setting.expected}, got {shown}")
        if any(not s for s in self.stop):
            raise InvalidParameter(f"{_SETTINGS['stop'].name} strings must not be empty")

    def with_(self, **changes) -> SamplingParams:
        """A copy with some values changed, validated like the original."""
        return replace(self, **changes)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def _bias_pairs(value) -> tuple[tuple[int, float], ...]:
    """A logit bias as sorted (id, bias) pairs, from {"id": bias}, "ID=BIAS" strings or pairs."""
    items = value.items() if isinstance(value, dict) else value
    pairs = {}
    item = value
    try:
        for item in items:
            token, bias = item.split("=", 1) if isinstance(item, str) else item
            if isinstance(bias, bool) or (isinstance(token, float) and not token.is_integer()):
                raise ValueError
            pairs[int(str(token).strip())] = float(bias)
    except (TypeError, ValueError):
        shown = item if isinstance(item, str) else "=".join(map(str, item)) if isinstance(item, tuple) else repr(item)
        raise InvalidParameter(
            f'logit-bias takes token ids with biases (ID=BIAS, or {{"ID": BIAS}}), got {shown}'
        ) from None
    return tuple(sorted(pairs.items()))


def collect(cls) -> dict[str, Setting]:
    """Field name → Setting for a dataclass whose every field declares one; TypeError naming a field that does not."""
    found = {}
    for f in fields(cls):
        if not isinstance(f.metadata.get("setting"), Setting):
            raise TypeError(f"{cls.__name__}.{f.name} declares no Setting")
        found[f.name] = f.metadata["setting"]
    return found


_SETTINGS = collect(SamplingParams)  # at import: a field without a Setting stops every front end at once


def settings() -> list[tuple[str, Setting]]:
    """(field name, Setting) for every SamplingParams field, in declaration order (the order every surface lists)."""
    return list(_SETTINGS.items())


def setting_of(name: str) -> Setting:
    """The Setting of a SamplingParams field; KeyError for a name that is not one."""
    return _SETTINGS[name]
