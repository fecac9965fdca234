"""Click options from the declarations, so each flag is written once: the sampling flags from the
`Setting` of each `SamplingParams` field (`chatcli.engine.params`), the model flags from the fields
of `LoadOptions` (`chatcli.engine.load`). A flag's value arrives under its field's name.

Imported at every start, one-shots included: click and those two pure modules only.
"""

from __future__ import annotations

from dataclasses import fields

import click

from chatcli.engine.load import MODEL_HELP, LoadOptions
from chatcli.engine.params import BIAS, FLOAT, INT, SEED, STRINGS, settings

LOAD_FIELDS = tuple(f.name for f in fields(LoadOptions))
_TYPES = {FLOAT: float, INT: int, SEED: int}


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
            options.append(click.option(f"--{setting.name}", name, multiple=True, help=setting.flag))
        else:
            options.append(
                click.option(f"--{setting.name}", name, type=_TYPES[setting.kind], default=None, help=setting.flag)
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
    options = [click.option("--model", "-m", default=None, help=MODEL_HELP)]
    for f in fields(LoadOptions):
        if f.name in without:
            continue
        default = device if f.name == "device" and device is not None else f.default
        flag, text = "--" + f.name.replace("_", "-"), f.metadata["help"]
        if isinstance(default, bool):
            options.append(click.option(flag, f.name, is_flag=True, default=default, help=text))
        else:
            options.append(click.option(flag, f.name, default=default, show_default=default is not None, help=text))
    return _stack(options)


def load_options(values: dict) -> LoadOptions:
    """LoadOptions from the model flags' values (fields a command has no flag for keep their defaults)."""
    return LoadOptions(**{k: v for k, v in values.items() if k in LOAD_FIELDS})
