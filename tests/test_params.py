"""Each SamplingParams field reaches exactly the surfaces its `Setting` declares: a `chatcli` flag, a
config key, a slash command (with a /settings line), the TUI header, the OpenAI request; and the
model flags reach LoadOptions from every command that loads a model. Fast: no model."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, fields

import click
import pytest

from chatcli.chat import commands
from chatcli.cli import app, pull, start_options
from chatcli.config import ConfigError, load_config
from chatcli.engine.load.options import LoadOptions
from chatcli.engine.params import (
    STRINGS,
    ResponseFormat,
    SamplingParams,
    Setting,
    ToolCalls,
    collect,
    setting_of,
    settings,
)
from chatcli.server.schema import parse_request
from chatcli.ui.format import sampling_line, settings_lines

# A value other than the default for every field; a new field needs one here (see the first test).
SAMPLE = {
    "temperature": 0.3,
    "top_k": 7,
    "top_p": 0.5,
    "min_p": 0.2,
    "repeat_penalty": 1.25,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "repeat_last_n": 32,
    "max_tokens": 99,
    "lookup": 2,
    "seed": 5,
    "stop": ("END",),
    "logprobs": 3,
    "logit_bias": ((42, -100.0),),
    "response_format": ResponseFormat("json_object"),
    "tools": ToolCalls.of([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
}
# Where each field shows today: a change here is a change users see.
SURFACES = {
    **dict.fromkeys(
        ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "max_tokens", "seed"),
        {"flag", "config", "slash", "header", "api"},
    ),
    **dict.fromkeys(("presence_penalty", "frequency_penalty"), {"flag", "config", "slash", "api"}),
    "repeat_last_n": set(),
    "lookup": {"flag", "config", "slash"},
    "stop": {"flag", "api"},
    "logprobs": {"flag"},
    "logit_bias": {"flag", "config", "slash", "api"},
    # read by each surface itself: the server's logprobs / top_logprobs (schema._logprobs) and response_format,
    # the one-shot's --logprobs flag and --json-schema
    "response_format": set(),
    "tools": set(),  # the server's tools, tool_choice and parallel_tool_calls (server.tools.parse_tools)
}
FIELDS = SamplingParams.field_names()
# app's own flags
NOT_START = ("prompt", "json_out", "json_schema", "stats", "continue_last", "conversation", "cache_budget", "verify")
USER = [{"role": "user", "content": "hi"}]


def declared(setting: Setting) -> set[str]:
    flags = {
        "flag": setting.flag is not None,
        "config": setting.config,
        "slash": setting.slash is not None,
        "header": setting.header is not None,
        "api": bool(setting.api),
    }
    return {surface for surface, on in flags.items() if on}


@pytest.fixture(autouse=True)
def no_config(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATCLI_CONFIG", str(tmp_path / "none.toml"))


def test_every_field_declares_a_setting_a_sample_and_its_surfaces():
    assert [name for name, _ in settings()] == FIELDS
    assert set(SAMPLE) == set(FIELDS) == set(SURFACES)
    assert all(SAMPLE[f] != getattr(SamplingParams(), f) for f in FIELDS)
    assert {f: declared(setting_of(f)) for f in FIELDS} == SURFACES


def test_a_field_without_a_setting_is_refused_at_once():
    @dataclass(frozen=True)
    class Extra:
        temperature: float = 0.8

    with pytest.raises(TypeError, match="Extra.temperature declares no Setting"):
        collect(Extra)


def test_a_range_message_uses_the_declared_name():
    for name, setting in settings():
        if setting.valid is not None:
            bad = {"lookup": 99, "presence_penalty": 9, "frequency_penalty": 9, "logit_bias": {"1": 500}}.get(name, -1)
            with pytest.raises(ValueError, match=f"^{setting.name} must be"):
                SamplingParams(**{name: bad})


def flag_args(name: str, value) -> list[str]:
    flag = f"--{setting_of(name).name}"
    if name == "logit_bias":  # ID=BIAS, repeatable
        return [a for t, b in value for a in (flag, f"{t}={b}")]
    return [a for v in value for a in (flag, v)] if isinstance(value, tuple) else [flag, str(value)]


def from_flags(command: click.Command, args: list[str]):
    ctx = command.make_context("chatcli", args)
    values = {k: v for k, v in ctx.params.items() if k not in NOT_START}
    return start_options(**values)


@pytest.mark.parametrize("name", FIELDS)
def test_a_flag_sets_the_field_when_declared(name):
    options = {p.name: p for p in app.params}
    if "flag" not in SURFACES[name]:
        assert name not in options
        with pytest.raises(click.UsageError):
            app.make_context("chatcli", flag_args(name, SAMPLE[name]))
        return
    assert options[name].opts == [f"--{setting_of(name).name}"] and options[name].help == setting_of(name).flag
    assert getattr(from_flags(app, flag_args(name, SAMPLE[name])).params, name) == SAMPLE[name]
    assert getattr(from_flags(app, []).params, name) == getattr(SamplingParams(), name)  # not given: the default


def toml(value) -> str:
    if value == SAMPLE["logit_bias"]:
        return "{ " + ", ".join(f'"{t}" = {b}' for t, b in value) + " }"
    if isinstance(value, ResponseFormat):
        return f'"{value.kind}"'
    if isinstance(value, ToolCalls):
        return f'"{value.choice}"'
    return "[" + ", ".join(f'"{v}"' for v in value) + "]" if isinstance(value, tuple) else repr(value)


@pytest.mark.parametrize("name", FIELDS)
def test_a_config_key_sets_the_field_when_declared(name, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(f"[sampling]\n{name} = {toml(SAMPLE[name])}\n", encoding="utf-8")
    if "config" not in SURFACES[name]:
        with pytest.raises(ConfigError, match=f"unknown \\[sampling\\] key '{name}'"):
            load_config(path)
        return
    assert getattr(load_config(path).params(), name) == SAMPLE[name]


@pytest.mark.parametrize("name", FIELDS)
def test_a_slash_command_sets_the_field_when_declared(name):
    specs = [s for s in commands.COMMANDS if s.field == name]
    if "slash" not in SURFACES[name]:
        assert specs == []
        return
    slash = setting_of(name).slash
    assert [s.name for s in specs] == [slash.name]
    for word in (slash.name, *slash.aliases):
        command = commands.parse(f"/{word} {setting_of(name).show(SAMPLE[name])}")
        assert getattr(commands.apply_setting(SamplingParams(), command), name) == SAMPLE[name]


def test_the_setting_commands_follow_help_in_declaration_order():
    names = [s.name for s in commands.COMMANDS]
    slashes = [s.slash.name for _, s in settings() if s.slash is not None]
    assert names[: len(slashes) + 1] == ["help", *slashes]
    assert names[len(slashes) + 1] == "system"


@pytest.mark.parametrize("name", FIELDS)
def test_the_header_and_settings_show_the_field_when_declared(name):
    default, changed = SamplingParams(), SamplingParams(**{name: SAMPLE[name]})
    if "header" in SURFACES[name]:
        assert sampling_line(changed) != sampling_line(default)
        assert f"{setting_of(name).header} {SAMPLE[name]}" in sampling_line(changed)
    else:
        assert sampling_line(changed) == sampling_line(default)
    before, after = settings_lines(default, None, "dark", "m"), settings_lines(changed, None, "dark", "m")
    if "slash" in SURFACES[name]:  # /settings lists what a slash command changes
        (line,) = [a for a, b in zip(after, before, strict=True) if a != b]
        assert line.split() == [setting_of(name).name, setting_of(name).show(SAMPLE[name])]
    else:
        assert after == before


def json_value(value):
    if value == SAMPLE["logit_bias"]:  # OpenAI's shape: {"token id": bias}
        return {str(t): b for t, b in value}
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("name", FIELDS)
def test_a_request_field_sets_the_field_when_declared(name):
    keys = setting_of(name).api
    if name == "logprobs":  # OpenAI's boolean and its top_logprobs, read by the schema itself
        body = {"messages": USER, "logprobs": True, "top_logprobs": SAMPLE[name]}
        assert parse_request(body, SamplingParams()).params.logprobs == SAMPLE[name]
        return
    if name == "response_format":  # OpenAI's object, read by the schema itself (schema._response_format)
        body = {"messages": USER, "response_format": {"type": "json_object"}}
        assert parse_request(body, SamplingParams()).params.response_format == SAMPLE[name]
        return
    if name == "tools":  # OpenAI's tools, read by the schema itself (server.tools.parse_tools)
        body = {"messages": USER, "tools": SAMPLE[name].offered()}
        assert parse_request(body, SamplingParams()).params.tools == SAMPLE[name]
        return
    if "api" not in SURFACES[name]:
        assert keys == ()
        for key in (name, setting_of(name).name):
            body = {"messages": USER, key: json_value(SAMPLE[name])}
            assert parse_request(body, SamplingParams()).params == SamplingParams()  # an unknown field is ignored
        return
    for key in keys:
        params = parse_request({"messages": USER, key: json_value(SAMPLE[name])}, SamplingParams()).params
        assert getattr(params, name) == SAMPLE[name], key


def test_the_newest_name_of_a_request_field_wins():
    body = {"messages": USER, "max_completion_tokens": 3, "max_tokens": 20}
    assert parse_request(body, SamplingParams()).params.max_tokens == 3


# -- the model flags ------------------------------------------------------------------


def model_commands():
    from chatcli.bench import bench_command
    from chatcli.server.cli import serve_command

    # command → the LoadOptions fields it has no flag for (on purpose), and --device's default
    return {
        "app": (app, set(), "auto"),
        "pull": (pull, {"device_map", "runner", "kv_dtype", "chat_template", "raw"}, "cpu"),  # pull renders nothing
        "serve": (serve_command, set(), "auto"),
        "bench": (bench_command, {"device_map", "trust_remote_code", "raw"}, "auto"),
    }


@pytest.mark.parametrize("which", ["app", "pull", "serve", "bench"])
def test_every_command_that_loads_a_model_has_the_declared_flags(which):
    command, left_out, device = model_commands()[which]
    options = {p.name: p for p in command.params}
    assert options["model"].opts == ["--model", "-m"]
    for f in fields(LoadOptions):
        if f.name in left_out:
            assert f.name not in options
            continue
        option = options[f.name]
        assert option.opts == ["--" + f.name.replace("_", "-")] and option.help == f.metadata["help"]
        assert option.default == (device if f.name == "device" else f.default)


def test_the_model_flags_reach_load_options():
    args = [
        "-m",
        "x.gguf",
        "--device",
        "cpu",
        "--dtype",
        "float16",
        "--device-map",
        "auto",
        "--trust-remote-code",
        "--runner",
        "hf",
        "--kv-dtype",
        "float32",
        "--quantize",
        "int8",
    ]
    start = from_flags(app, args)
    assert start.model == "x.gguf"
    assert start.load == LoadOptions(
        device="cpu",
        dtype="float16",
        device_map="auto",
        trust_remote_code=True,
        runner="hf",
        kv_dtype="float32",
        quantize="int8",
    )
    assert from_flags(pull, []).load == LoadOptions(device="cpu")


def test_serve_passes_every_model_flag_to_load_options(monkeypatch):
    from click.testing import CliRunner

    from chatcli.engine.load.options import LoadError
    from chatcli.options import StartOptions
    from chatcli.server.cli import serve_command
    from tests.servers import free_port

    seen = []

    def load_engine(self, status=None):
        seen.append((self.model, self.load))
        raise LoadError("stop here")

    monkeypatch.setattr(StartOptions, "load_engine", load_engine)
    result = CliRunner().invoke(
        serve_command,
        ["-m", "x.gguf", "--device-map", "auto", "--trust-remote-code", "--kv-dtype", "float32", *free_port()],
    )
    assert result.exit_code == 1 and "stop here" in result.output
    assert seen == [("x.gguf", LoadOptions(device_map="auto", trust_remote_code=True, kv_dtype="float32"))]
    shown = CliRunner().invoke(serve_command, ["--help"]).output
    assert "--device-map" in shown and "--trust-remote-code" in shown


def test_the_flags_module_imports_nothing_heavy():
    """`chatcli --help`, `chatcli serve --help` and a bad flag pay for click and the engine's data types only."""
    code = (
        "import sys, chatcli.cli, chatcli.flags, chatcli.server.cli\n"
        "heavy = ('torch', 'transformers', 'textual', 'numpy', 'llguidance', 'tokenizers', 'uvicorn')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_repeatable_flags_gather_a_tuple():
    assert STRINGS == setting_of("stop").kind
    assert from_flags(app, ["--stop", "a", "--stop", "b"]).params.stop == ("a", "b")


# -- options on several commands: declared once (chatcli.flags) ----------------------------------

# Options of `chatcli bench` that share a name with another command's but are its own declaration
# (chatcli/bench: the benchmark's run sizes and its JSON report); the test below fails once they fold.
NOT_FOLDED = {("bench", "--json"), ("bench", "--max-tokens"), ("bench", "--lookup")}


def every_command() -> dict[str, click.Command]:
    ctx = click.Context(app)
    return {"app": app, **{name: app.get_command(ctx, name) for name in app.list_commands(ctx)}}


def test_an_option_on_several_commands_comes_from_one_declaration():
    from chatcli.flags import Declared

    by_name: dict[str, list[tuple[str, click.Parameter]]] = {}
    for which, command in every_command().items():
        for param in command.params:
            if not isinstance(param, click.Option):  # a positional argument (pull's and rm's NAME) is no flag
                continue
            for name in {*param.opts, *param.secondary_opts}:
                by_name.setdefault(name, []).append((which, param))
    shared = {name: uses for name, uses in by_name.items() if len(uses) > 1}
    assert {"--cache-budget", "--api-key", "--json", "--model", "-m", "--device", "--max-tokens"} <= set(shared)
    left = set()
    for name, uses in shared.items():
        own = {(which, name) for which, param in uses if not isinstance(param, Declared)}
        left |= own
        declared = [param.source for which, param in uses if (which, name) not in own]
        assert all(source is declared[0] for source in declared), f"{name}: more than one declaration"
    assert left == NOT_FOLDED


def option_names_written(tree) -> list[str]:
    """The option names written as strings in calls to click.option(...) or Shared(...)."""
    import ast

    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
            "option",
            "Shared",
        ):
            for arg in node.args:
                for item in arg.elts if isinstance(arg, ast.Tuple) else [arg]:
                    if isinstance(item, ast.Constant) and isinstance(item.value, str) and item.value.startswith("-"):
                        names.extend(n for n in item.value.split("/") if n)  # --baseline/--no-baseline
    return names


def test_no_option_name_is_written_twice_in_the_code():
    import ast
    from collections import Counter
    from pathlib import Path

    import chatcli

    written = Counter()
    for path in Path(chatcli.__file__).parent.rglob("*.py"):
        written.update(option_names_written(ast.parse(path.read_text(encoding="utf-8"))))
    assert {"--cache-budget", "--api-key", "--json", "--model", "--host"} <= set(written)  # the scan reads them
    assert {name: n for name, n in written.items() if n > 1} == {"--json": 2}  # flags.JSON and bench's own


SIZES = [("1024", 1 << 30), ("0", 0), ("64M", 64 << 20), ("64mib", 64 << 20), ("1.5G", 3 << 29), ("2GiB", 2 << 30)]
SIZES += [("512K", 512 << 10), ("4096B", 4096), (" 8 M ", 8 << 20), ("1T", 1 << 40)]
NOT_SIZES = ["bad", "-1", "64X", "1e3", "", "M", "1.", "2 GB B"]


@pytest.mark.parametrize("which", ["app", "serve"])
def test_cache_budget_parses_the_same_on_each_command(which):
    command = every_command()[which]
    assert command.make_context("chatcli", []).params["cache_budget"] is None  # the pool's default: RAM/8
    for text, size in SIZES:
        assert command.make_context("chatcli", ["--cache-budget", text]).params["cache_budget"] == size, text
    for text in NOT_SIZES:
        with pytest.raises(click.BadParameter) as info:
            command.make_context("chatcli", ["--cache-budget", text])
        assert info.value.exit_code == 2
        assert info.value.format_message() == (
            f"Invalid value for '--cache-budget': {text!r} is not a size: MiB (1024) or a number with a unit (512M, 2G)"
        )


@pytest.mark.parametrize("which", ["app", "serve"])
def test_api_key_is_read_and_checked_the_same_on_each_command(which, monkeypatch):
    command = every_command()[which]
    monkeypatch.delenv("CHATCLI_API_KEY", raising=False)
    assert command.make_context("chatcli", []).params["api_key"] is None
    assert command.make_context("chatcli", ["--api-key", "sk-1 2"]).params["api_key"] == "sk-1 2"
    monkeypatch.setenv("CHATCLI_API_KEY", "from-env")
    assert command.make_context("chatcli", []).params["api_key"] == "from-env"
    assert command.make_context("chatcli", ["--api-key", "given"]).params["api_key"] == "given"
    for bad in (" s3cret", "s3cret\n", "s3\x7fcret"):
        with pytest.raises(click.BadParameter) as info:
            command.make_context("chatcli", ["--api-key", bad])
        message = info.value.format_message()
        assert message.startswith("Invalid value for '--api-key': the key holds a control character")
        assert "s3" not in message  # the key is never shown
    monkeypatch.setenv("CHATCLI_API_KEY", "k\r")
    with pytest.raises(click.BadParameter) as info:
        command.make_context("chatcli", [])
    assert info.value.format_message().startswith("Invalid value for '--api-key' (from $CHATCLI_API_KEY): the key")


def test_help_shows_the_shared_options_with_each_commands_meaning():
    from click.testing import CliRunner

    from chatcli.flags import CACHE_BUDGET

    tops, serves = (
        " ".join(CliRunner().invoke(app, args).output.split()) for args in (["--help"], ["serve", "--help"])
    )
    budget = " ".join(CACHE_BUDGET.help.split())
    for shown in (tops, serves):
        assert "--cache-budget SIZE" in shown and budget in shown
        assert "--api-key KEY" in shown and "[env var: CHATCLI_API_KEY]" in shown
        assert "-m, --model TEXT" in shown
    assert "The --api server's key." in tops and "Require 'Authorization: Bearer KEY'" not in tops
    assert "Require 'Authorization: Bearer KEY' on every request." in serves and "The --api server's key" not in serves
    history = " ".join(CliRunner().invoke(app, ["history", "--help"]).output.split())
    assert "--json A JSON list." in history and "--json One-shot: print one JSON object." in tops


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["-m", "chatcli", "-p", "hi"], "chatcli"),
        (["-m", "chatcli", "serve"], "chatcli serve"),
        (["-m", "chatcli.server"], "python -m chatcli.server"),
    ],
)
def test_a_bad_cache_budget_is_one_line_and_exit_2_everywhere(argv, hint, tmp_path):
    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "none.toml")}
    env.pop("CHATCLI_API_KEY", None)
    result = subprocess.run(
        [sys.executable, *argv, "--cache-budget", "64X"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "chatcli: error: Invalid value for '--cache-budget': '64X' is not a size: MiB (1024) or a number with a unit"
        f" (512M, 2G) (see '{hint} --help')\n"
    )


def test_serve_passes_the_budget_and_its_default_is_the_pools(monkeypatch):
    """serve's pool: the --cache-budget given, else default_budget_bytes() (an eighth of RAM, as the TUI's)."""
    from click.testing import CliRunner

    import chatcli.server.app
    from chatcli.engine import default_budget_bytes
    from chatcli.server import cli as server_cli

    seen = []

    def create_app(engine, **kwargs):
        seen.append(kwargs["cache_budget_bytes"])
        raise click.exceptions.Exit(0)  # no server

    monkeypatch.setattr(chatcli.server.app, "create_app", create_app)
    for args in ([], ["--cache-budget", "64M"], ["--cache-budget", "0"]):
        result = CliRunner().invoke(server_cli.serve_command, args)
        assert result.exit_code == 0, result.output
    assert seen == [default_budget_bytes(), 64 << 20, 0]
