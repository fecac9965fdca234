"""The TOML config file: defaults that command-line flags override.

Lives at `<user config dir>/config.toml` (or `$CHATCLI_CONFIG`):

    model = "/path/to/model.gguf"    # with `api`: the server's model name
    api = "http://gpu-box:8000/v1"    # optional: answer from an OpenAI-compatible server
    api_key = "..."                   # optional ($CHATCLI_API_KEY and --api-key win)
    theme = "dark"
    system = "You are terse."
    ctx_size = 8192                   # optional: --ctx-size's default, the context in tokens
    chat_template = "gemma"           # optional: --chat-template's default (a built-in name or a Jinja file)
    [sampling]
    temperature = 0.7
    top_k = 40
    [presets.coder]                   # `--preset coder`, `/preset coder`
    system = "You write Python. Code first, then one line of explanation."
    temperature = 0.2                 # a preset may set any [sampling] key too
    [mcp.time]                        # `--mcp time`: an MCP server (stdio) whose tools the model may call
    command = "uvx"                   # the keys of other MCP clients' `mcpServers`: command, args, env (, cwd)
    args = ["mcp-server-time"]
    env = { TZ = "Europe/Paris" }
    timeout = 60                      # seconds a call may take (default 60); startup_timeout: to start (30)

`[sampling]` takes the SamplingParams fields whose `Setting` says `config=True`, each checked
against its declared kind and range; a preset's keys are checked the same way.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from chatcli.engine import (
    BIAS,
    FLOAT,
    INT,
    SEED,
    STRINGS,
    InvalidParameter,
    LoadError,
    LoadOptions,
    SamplingParams,
    check_chat_template,
    check_ctx_size,
    setting_of,
    settings,
)
from chatcli.paths import config_file

if TYPE_CHECKING:
    from chatcli.chat.mcp import Server

SAMPLING_KEYS = tuple(name for name, setting in settings() if setting.config)  # the SamplingParams fields
TOP_KEYS = ("model", "api", "api_key", "theme", "system", "save", "ctx_size", "chat_template", "sampling", "presets")
TOP_KEYS += ("mcp",)
MCP_KEYS = ("command", "args", "env", "cwd", "timeout", "startup_timeout")
TEXT_KEYS = ("model", "api", "api_key", "theme", "system", "chat_template")


class ConfigError(ValueError):
    """A malformed config file; the message names the file (and the line, where known)."""


@dataclass
class Config:
    path: Path | None = None
    model: str | None = None
    theme: str | None = None
    system: str | None = None
    sampling: dict = field(default_factory=dict)
    api: str | None = None  # an OpenAI-compatible server's URL: the replies come from there
    api_key: str | None = None
    presets: dict[str, Preset] = field(default_factory=dict)
    save: bool = True  # one-shots saved as conversations (`save = false`: --no-save by default)
    mcp: dict[str, Server] = field(default_factory=dict)  # [mcp.NAME]: the MCP servers --mcp picks from
    ctx_size: int | None = None  # --ctx-size where the command line does not give it
    chat_template: str | None = None  # --chat-template where the command line gives neither it nor --raw

    def load_options(self, given: LoadOptions) -> LoadOptions:
        """The model flags' values with this file's defaults where a flag was not given (`ctx_size`,
        `chat_template`: not beside --raw)."""
        ctx_size = given.ctx_size if given.ctx_size is not None else self.ctx_size
        template = given.chat_template or (None if given.raw else self.chat_template)
        return replace(given, ctx_size=ctx_size, chat_template=template)

    def params(self, base: SamplingParams | None = None) -> SamplingParams:
        """`base` (the defaults) with the [sampling] values; ConfigError for a wrong type or range."""
        return _with(self.path, "[sampling]", self.sampling, base or SamplingParams())

    def preset(self, name: str) -> Preset:
        """The preset `name`; ConfigError naming the ones there are."""
        if name not in self.presets:
            known = ", ".join(sorted(self.presets)) or f"none: add a [presets.{name}] table to {self.path}"
            raise ConfigError(f"no preset {name!r} (known: {known})")
        return self.presets[name]

    def mcp_servers(self, names) -> list[Server]:
        """The [mcp.NAME] servers `names` picks (--mcp), each once; ConfigError naming the ones there are."""
        for name in names:
            if name not in self.mcp:
                known = ", ".join(sorted(self.mcp)) or f"none: add an [mcp.{name}] table to {self.path}"
                raise ConfigError(f"no MCP server {name!r} (known: {known})")
        return [self.mcp[name] for name in dict.fromkeys(names)]


@dataclass
class Preset:
    """A named system prompt, and the sampling values that go with it (`[presets.NAME]`)."""

    name: str
    system: str | None = None
    sampling: dict = field(default_factory=dict)
    path: Path | None = None

    def params(self, base: SamplingParams) -> SamplingParams:
        return _with(self.path, f"[presets.{self.name}]", self.sampling, base)


def _with(path: Path | None, table: str, sampling: dict, base: SamplingParams) -> SamplingParams:
    values = {key: _typed(path, key, value, table) for key, value in sampling.items()}
    try:
        return base.with_(**values)
    except InvalidParameter as exc:
        raise ConfigError(f"{path}: {table} {exc}") from None


# A value kind → the TOML types it takes, and how the message says them (TOML has no null: no seed "off").
_TYPES = {
    FLOAT: ((int, float), "a number"),
    INT: (int, "a whole number"),
    SEED: (int, "a whole number"),
    STRINGS: (list, "a list of strings"),
    BIAS: (dict, 'a table of token ids to biases ({ "123" = -100 })'),
}


def _typed(path: Path | None, key: str, value, table: str = "[sampling]"):
    """A [sampling] value of the declared kind (a float for a number), else ConfigError naming the key."""
    kind = setting_of(key).kind
    types, expected = _TYPES[kind]
    ok = isinstance(value, types) and not isinstance(value, bool)
    if ok and kind == STRINGS:
        ok = all(isinstance(s, str) for s in value)
    if not ok:
        shown = str(value).lower() if isinstance(value, bool) else repr(value)  # TOML's spelling of a boolean
        raise ConfigError(f"{path}: {table} {key} must be {expected}, got {shown}")
    return float(value) if kind == FLOAT else tuple(value) if kind == STRINGS else value


def config_path() -> Path:
    return config_file()


def load_config(path: Path | None = None) -> Config:
    path = path or config_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a BOM (Notepad writes one) is not TOML
    except FileNotFoundError:
        return Config(path=path)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None  # the message carries "(at line N, column M)"
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(TOP_KEYS)})")
    for key in TEXT_KEYS:
        if key in data and not isinstance(data[key], str):
            raise ConfigError(f"{path}: {key} must be a string")
    sampling = data.get("sampling", {})
    if not isinstance(sampling, dict):
        raise ConfigError(f"{path}: [sampling] must be a table")
    bad = sorted(set(sampling) - set(SAMPLING_KEYS))
    if bad:
        raise ConfigError(f"{path}: unknown [sampling] key {bad[0]!r} (known: {', '.join(SAMPLING_KEYS)})")
    config = Config(path, data.get("model"), data.get("theme"), data.get("system"), dict(sampling))
    config.api, config.api_key = data.get("api"), data.get("api_key")
    if not isinstance(data.get("save", True), bool):
        raise ConfigError(f"{path}: save must be true or false")
    config.save = data.get("save", True)
    config.ctx_size = data.get("ctx_size")
    try:
        check_ctx_size(config.ctx_size)
    except LoadError:
        raise ConfigError(
            f"{path}: ctx_size must be a whole number of tokens, 1 or more, got {config.ctx_size!r}"
        ) from None
    config.chat_template = data.get("chat_template")
    try:
        check_chat_template(config.chat_template)
    except ValueError as exc:
        raise ConfigError(f"{path}: chat_template: {str(exc).removeprefix('--chat-template ')}") from None
    config.presets = _presets(path, data.get("presets", {}))
    config.mcp = _mcp(path, data.get("mcp", {}))
    config.params()  # validate the values now, with the file's name in the message
    for preset in config.presets.values():
        preset.params(SamplingParams())
    return config


def _presets(path: Path, tables) -> dict[str, Preset]:
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise ConfigError(f"{path}: [presets] must hold tables, one a preset: [presets.NAME]")
    out = {}
    for name, table in tables.items():
        where = f"[presets.{name}]"
        system = table.get("system")
        if system is not None and not isinstance(system, str):
            raise ConfigError(f"{path}: {where} system must be a string")
        bad = sorted(set(table) - {"system", *SAMPLING_KEYS})
        if bad:
            raise ConfigError(f"{path}: unknown {where} key {bad[0]!r} (known: system, {', '.join(SAMPLING_KEYS)})")
        out[name] = Preset(name, system, {k: v for k, v in table.items() if k != "system"}, path)
    return out


def _mcp(path: Path, tables) -> dict[str, Server]:
    """[mcp.NAME] tables: stdio MCP servers, as other MCP clients write them (command, args, env)."""
    if not tables:
        return {}
    from chatcli.chat.mcp import STARTUP_TIMEOUT_S, TIMEOUT_S, Server  # only where there are servers

    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise ConfigError(f"{path}: [mcp] must hold tables, one a server: [mcp.NAME] with command = ...")
    out = {}
    for name, table in tables.items():
        where = f"{path}: [mcp.{name}]"
        bad = sorted(set(table) - set(MCP_KEYS))
        if bad:
            raise ConfigError(f"{where}: unknown key {bad[0]!r} (known: {', '.join(MCP_KEYS)})")
        command, args, env = table.get("command"), table.get("args", []), table.get("env", {})
        if not isinstance(command, str) or not command.strip():
            raise ConfigError(f"{where}: command must be a string: the program that starts the server")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConfigError(f"{where}: args must be a list of strings")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ConfigError(f'{where}: env must be a table of strings ({{ NAME = "value" }})')
        if not isinstance(table.get("cwd", ""), str):
            raise ConfigError(f"{where}: cwd must be a string")
        limits = {}
        for key, default in (("timeout", TIMEOUT_S), ("startup_timeout", STARTUP_TIMEOUT_S)):
            value = table.get(key, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
                raise ConfigError(f"{where}: {key} must be a number of seconds > 0, got {value!r}")
            limits[key] = float(value)
        out[name] = Server(name, command, tuple(args), dict(env), table.get("cwd"), **limits)
    return out
