"""Click options from the declarations, so each flag is written once: the sampling flags from the
`Setting` of each `SamplingParams` field (`chatcli.engine.params`), the model flags from the fields
of `LoadOptions` (`chatcli.engine.load.options`), and the other options that more than one command
takes from a `Shared` below (`--cache-budget`, `--api-key`, `--json`). A flag's value arrives under
its field's name. Every option made here is a `Declared`, naming the declaration it came from: a
test checks that an option on several commands comes from one (tests/test_params.py).

Imported at every start, one-shots included: click and the engine's public surface (its data types,
stdlib only; no numpy, no torch: a test checks it).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, fields

import click
from click.core import ParameterSource

from chatcli.engine import (
    BIAS,
    FLOAT,
    INT,
    MODEL_HELP,
    SEED,
    STRINGS,
    LoadOptions,
    default_budget_bytes,
    settings,
)
from chatcli.errors import UserError, shown

LOAD_FIELDS = tuple(f.name for f in fields(LoadOptions))
_TYPES = {FLOAT: float, INT: int, SEED: int}
CONTEXT = {"help_option_names": ["-h", "--help"]}  # every command's context_settings


class Declared(click.Option):
    """A click option made from one declaration, which `source` is: the `Shared`, the LoadOptions
    field or the sampling `Setting` (or MODEL_HELP, for --model)."""

    def __init__(self, param_decls=None, *, source, **attrs):
        super().__init__(param_decls, **attrs)
        self.source = source

    def get_error_hint(self, ctx) -> str:
        """The flag a bad value came from; its env var only when the value did (click names it either way)."""
        hint = click.Parameter.get_error_hint(self, ctx)
        if self.envvar and ctx is not None and ctx.get_parameter_source(self.name) is ParameterSource.ENVIRONMENT:
            hint += f" (from ${self.envvar})"
        return hint


class Size(click.ParamType):
    """A memory size, in bytes: a number of MiB (`1024`, as llama-server's --cache-ram), or a number
    with a binary unit (`512M`, `1.5G`, `2GiB`, `64K`, `4096B`)."""

    name = "size"
    _UNITS = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    _FORM = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|(b))?", re.IGNORECASE)

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            return value  # bytes already
        found = self._FORM.fullmatch(str(value).strip())
        if not found:
            self.fail(f"{value!r} is not a size: MiB (1024) or a number with a unit (512M, 2G)", param, ctx)
        number, unit, byte = found.groups()
        return int(float(number) * self._UNITS[(unit or byte or "m").lower()])  # a bare number: MiB


class Key(click.ParamType):
    """An API key as given; one that could never travel in an 'Authorization: Bearer KEY' header
    (a control character, a space at either end) is refused. The message never shows the key."""

    name = "key"

    def convert(self, value, param, ctx):
        if value != value.strip() or any(ord(c) < 32 or ord(c) == 127 for c in value):
            self.fail("the key holds a control character or a space at an end (it could never match)", param, ctx)
        return value


@dataclass(frozen=True)
class Shared:
    """An option that more than one command takes, declared once: its flags, the parameter its value
    arrives as, its parsing and validation (`type`), env var and help. A command whose meaning
    differs gives its own help (`option(help=...)`); nothing else varies."""

    decls: tuple[str, ...]
    dest: str
    help: str | None = None  # None: each command gives its own
    type: click.ParamType | None = None
    metavar: str | None = None
    envvar: str | None = None
    is_flag: bool = False

    @property
    def name(self) -> str:
        return self.decls[0]

    def option(self, help: str | None = None):
        text = help or self.help
        if not text:
            raise ValueError(f"{self.name}: each command gives its own help")
        if self.is_flag:
            return click.option(*self.decls, self.dest, cls=Declared, source=self, is_flag=True, help=text)
        return click.option(
            *self.decls,
            self.dest,
            cls=Declared,
            source=self,
            type=self.type,
            default=None,
            metavar=self.metavar,
            envvar=self.envvar,
            show_envvar=self.envvar is not None,
            help=text,
        )


# `chatcli` (the TUI's conversations) and `chatcli serve` (the requests' prefixes) keep KV caches in one
# SessionPool each; None: chatcli.engine.default_budget_bytes().
CACHE_BUDGET = Shared(
    ("--cache-budget",),
    "cache_budget",
    help="KV cache kept in memory for reuse (the TUI's conversations, the server's requests): MiB, or a "
    f"size such as 512M or 2G; 0 keeps none. Default: RAM/8 within 256 MiB-4 GiB ({default_budget_bytes() >> 20} "
    "MiB here).",
    type=Size(),
    metavar="SIZE",
)
# `chatcli`: the key sent to the --api server; `chatcli serve`: the key it requires of clients.
API_KEY = Shared(("--api-key",), "api_key", type=Key(), metavar="KEY", envvar="CHATCLI_API_KEY")
JSON = Shared(("--json",), "json_out", is_flag=True)  # each command says what it prints


def _stack(options: list):
    """One decorator applying click options so that --help lists them in this order."""

    def apply(f):
        for option in reversed(options):
            f = option(f)
        return f

    return apply


def sampling_options():
    """A flag for each SamplingParams field that declares one (`--top-k` for top_k), repeatable for a
    list; None (or ()) when not given, so the config file's value stands (see `given_sampling`)."""
    options = []
    for name, setting in settings():
        if setting.flag is None:
            continue
        if setting.kind in (STRINGS, BIAS):
            options.append(
                click.option(f"--{setting.name}", name, cls=Declared, source=setting, multiple=True, help=setting.flag)
            )
        else:
            options.append(
                click.option(
                    f"--{setting.name}",
                    name,
                    cls=Declared,
                    source=setting,
                    type=_TYPES[setting.kind],
                    default=None,
                    help=setting.flag,
                )
            )
    return _stack(options)


def given_sampling(values: dict) -> dict:
    """The SamplingParams changes the sampling flags ask for: the ones given (a repeatable one as a tuple)."""
    return {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in values.items() if v not in (None, (), [])}


def model_options(*, device: str | None = None, without: tuple[str, ...] = ()):
    """--model/-m and a flag for each LoadOptions field (`--device-map` for device_map) but those in
    `without`, with the field's default (`device` replaces --device's) and help."""
    unknown = set(without) - set(LOAD_FIELDS)
    if unknown:
        raise ValueError(f"not LoadOptions fields: {sorted(unknown)}")
    options = [click.option("--model", "-m", cls=Declared, source=MODEL_HELP, default=None, help=MODEL_HELP)]
    for f in fields(LoadOptions):
        if f.name in without:
            continue
        default = device if f.name == "device" and device is not None else f.default
        flag, text, declared = "--" + f.name.replace("_", "-"), f.metadata["help"], {"cls": Declared, "source": f}
        if f.metadata.get("choices"):  # a value none of them is refused as the line is parsed (exit 2)
            declared["type"] = click.Choice(f.metadata["choices"])
        elif f.metadata.get("type") is int:  # where its default does not say it (--ctx-size): 1 or more
            declared["type"] = click.IntRange(min=1)
        if f.metadata.get("metavar"):
            declared["metavar"] = f.metadata["metavar"]
        if f.metadata.get("check"):  # a value it refuses is a usage error too (exit 2)
            declared["callback"] = _checked(f.metadata["check"], flag)
        if isinstance(default, bool):
            options.append(click.option(flag, f.name, is_flag=True, default=default, help=text, **declared))
        else:
            options.append(
                click.option(flag, f.name, default=default, show_default=default is not None, help=text, **declared)
            )
    return _stack(options)


def _checked(check, flag: str):
    """A click callback that passes a flag's value through `check`, its ValueError a bad parameter (its
    message without the `--flag ` it starts with, which click says itself)."""

    def callback(_ctx, _param, value):
        try:
            check(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc).removeprefix(f"{flag} ")) from None
        return value

    return callback


def load_options(values: dict) -> LoadOptions:
    """LoadOptions from the model flags' values (fields a command has no flag for keep their defaults)."""
    return LoadOptions(**{k: v for k, v in values.items() if k in LOAD_FIELDS})


def run_command(command: click.Command, argv: list[str] | None = None, prog_name: str = "chatcli") -> None:
    """Run a command line's click command (`chatcli`'s app; `python -m chatcli.server` runs `serve`
    alone) and exit, turning every user error into one line and its exit code."""
    try:
        code = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except UserError as exc:
        _fail(str(exc), exc.code)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        sys.stderr.write("\n")
        sys.exit(130)
    except click.ClickException as exc:  # unknown option, bad value, missing argument
        ctx = getattr(exc, "ctx", None)  # a usage error's command: 'chatcli serve --help' for serve's options
        _fail(f"{exc.format_message()} (see '{ctx.command_path if ctx else prog_name} --help')", exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    sys.stderr.write(f"chatcli: error: {shown(message)}\n")  # it may quote a server, a file, a model
    sys.exit(code)
