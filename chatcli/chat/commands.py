"""Slash commands: text typed at the prompt → a parsed `Command`, or a `CommandError`.

Pure: no Textual, no torch. The front end decides what a command does; this module
knows the names, their aliases, their one-line help, how to read their argument,
how to complete a half-typed name, and which name a typo was nearest to. The setting
commands come from the slash commands `SamplingParams` declares (`chatcli.engine.params`).

    parse("/temp 0.3")      → Command("temp", "0.3", setting=("temperature", 0.3))
    parse("/seed off")      → Command("seed", "off", setting=("seed", None))
    parse("/temp")          → Command("temp", field="temperature"): the value is shown, not changed
    parse("/tmep 1")        → CommandError("unknown command /tmep — did you mean /temp?")
"""

from __future__ import annotations

import difflib
import math
import os.path
from collections.abc import Callable
from dataclasses import dataclass

from chatcli.engine import BIAS, FLOAT, INT, SEED, settings


class CommandError(ValueError):
    """A line that starts with '/' but is not a valid command; the message is one line for the user."""


@dataclass(frozen=True)
class CommandSpec:
    name: str
    help: str
    usage: str = ""  # what follows the name, for /help
    aliases: tuple[str, ...] = ()
    field: str | None = None  # the SamplingParams field a setting command changes
    reader: Callable[[str], object] | None = None  # argument text → value; raises ValueError


@dataclass(frozen=True)
class Command:
    name: str  # canonical name, without the slash
    arg: str = ""  # the rest of the line, stripped
    setting: tuple[str, object] | None = None  # (SamplingParams field, value) for setting commands
    field: str | None = None  # a setting command's SamplingParams field (with no value: it is shown)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError
    return value


def _int(text: str) -> int:
    return int(text)


def _seed(text: str) -> int | None:
    if text.lower() in ("off", "none", "random"):
        return None
    return int(text)


def _bias(text: str) -> tuple[str, ...]:
    """`ID=BIAS …` (SamplingParams checks each pair), or 'off' for none."""
    if text.lower() in ("off", "none"):
        return ()
    pairs = tuple(text.split())
    if not pairs or not all("=" in p for p in pairs):
        raise ValueError
    return pairs


_KIND = {_float: "a number", _int: "a whole number", _seed: "a whole number or 'off'", _bias: "ID=BIAS pairs or 'off'"}
_READER = {FLOAT: _float, INT: _int, SEED: _seed, BIAS: _bias}


def _setting_commands() -> tuple[CommandSpec, ...]:
    """A command for each SamplingParams field that declares one (`Setting.slash`), in declaration order."""
    return tuple(
        CommandSpec(s.slash.name, s.slash.help, s.slash.usage, s.slash.aliases, name, _READER[s.kind])
        for name, s in settings()
        if s.slash is not None
    )


COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec("help", "list every command"),
    *_setting_commands(),
    CommandSpec("system", "set the system prompt (bare: show it)", "[TEXT]"),
    CommandSpec("preset", "a [presets.NAME] of the config: its system prompt and sampling (bare: list them)", "[NAME]"),
    CommandSpec("settings", "show the current settings"),
    CommandSpec("stats", "show the last turn's full statistics"),
    CommandSpec("backend", "show what answers: the model in this process, or a server (--api)"),
    CommandSpec("models", "list the models the backend has"),
    CommandSpec("model", "switch model: a name (default, qwen3:4b), hub id, folder, .gguf (bare: show it)", "[NAME]"),
    CommandSpec("clear", "start an empty conversation (the current one stays in the sidebar)"),
    CommandSpec("new", "start a new conversation"),
    CommandSpec("switch", "switch to conversation N of the sidebar", "N"),
    CommandSpec("rename", "rename the current conversation", "TEXT"),
    CommandSpec("delete", "delete the current conversation (asks first)"),
    CommandSpec("save", "export the current conversation (.md or .json)", "FILE"),
    CommandSpec("load", "import a JSON export as a new conversation", "FILE"),
    CommandSpec("file", "attach a text file to your next message (bare: list them; off: drop them)", "[PATH|off]"),
    CommandSpec("copy", "copy the last reply, its Nth code block, or message N, to the clipboard (F5)", "[code [N]|N]"),
    CommandSpec("search", "find saved messages with these words (ranked; Enter opens one)", "TEXT"),
    CommandSpec("edit", "edit your message #N (your last: F9); Enter sends it as a new branch", "[N]"),
    CommandSpec("branches", "list this conversation's branches (/switch N opens one)"),
    CommandSpec("retry", "regenerate the last reply"),
    CommandSpec("undo", "remove the last exchange"),
    CommandSpec("theme", "switch theme (bare: list them)", "[NAME]"),
    CommandSpec("tools", "list the MCP servers' tools (--mcp) and which run without asking"),
    CommandSpec("tokens", "show or hide the token inspector: the last turn's tokens and their probabilities (F4)"),
    CommandSpec("top-logprobs", "alternatives the token inspector records per token (default 5)", "N"),
    CommandSpec("quit", "leave chatcli", "", ("exit", "bye")),
)

_BY_NAME: dict[str, CommandSpec] = {}
for _spec in COMMANDS:
    for _n in (_spec.name, *_spec.aliases):
        _BY_NAME[_n] = _spec

NO_ARGUMENT = frozenset(
    {"help", "settings", "stats", "backend", "models", "clear", "new", "delete", "retry", "undo", "quit", "tools"}
)
NEEDS_ARGUMENT = frozenset({"switch", "rename", "save", "load"})
EXPORT_FORMATS = {".md": "md", ".json": "json"}


def export_format(path: str) -> str:
    """'md' or 'json' from a file name's extension; ValueError for any other."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in EXPORT_FORMATS:
        raise ValueError(f"cannot tell the format of {path!r}: name it .md or .json")
    return EXPORT_FORMATS[ext]


def _check_argument(name: str, arg: str) -> None:
    """Raise `CommandError` when a conversation command's argument is missing or malformed."""
    if name in NEEDS_ARGUMENT and not arg:
        raise CommandError(f"/{name} needs a value: /{name} {_BY_NAME[name].usage}")
    if name == "switch" and not (arg.isdigit() and int(arg) >= 1):
        raise CommandError(f"/switch: {arg!r} is not a conversation number (the numbers in the sidebar, F3)")
    if name == "save":
        try:
            export_format(arg)
        except ValueError as exc:
            raise CommandError(f"/save: {exc}") from None


def is_command(text: str) -> bool:
    """A line is a command when it starts with '/' followed by a letter ('/ ' and '//x' are prompts)."""
    text = text.lstrip()
    return len(text) > 1 and text[0] == "/" and text[1].isalpha()


def names() -> list[str]:
    """Every name a command answers to, canonical ones first."""
    return [s.name for s in COMMANDS] + [a for s in COMMANDS for a in s.aliases]


def spec(name: str) -> CommandSpec | None:
    return _BY_NAME.get(name.lower())


def nearest(name: str) -> str | None:
    """The command name closest to a typo, if any is close enough."""
    name = name.lower()
    prefixed = [n for n in names() if n.startswith(name)]
    if prefixed:
        return _BY_NAME[prefixed[0]].name
    close = difflib.get_close_matches(name, names(), n=1, cutoff=0.5)
    return _BY_NAME[close[0]].name if close else None


def parse(text: str) -> Command:
    """Parse one command line; raise `CommandError` with a one-line message if it is not valid."""
    text = text.strip()
    if not is_command(text):
        raise CommandError("not a command (commands start with '/')")
    head, _, arg = text[1:].partition(" ")
    arg = arg.strip()
    found = spec(head)
    if found is None:
        guess = nearest(head)
        hint = f" — did you mean /{guess}?" if guess else " — type /help for the list"
        raise CommandError(f"unknown command /{head}{hint}")
    if found.name in NO_ARGUMENT and arg:
        raise CommandError(f"/{found.name} takes no argument")
    if found.reader is None:
        _check_argument(found.name, arg)
        return Command(found.name, arg)
    if not arg:  # a setting without a value: the front end shows the one it has
        return Command(found.name, field=found.field)
    try:
        value = found.reader(arg)
    except ValueError:
        raise CommandError(f"/{head}: {arg!r} is not {_KIND[found.reader]}") from None
    return Command(found.name, arg, (found.field, value), found.field)


PATH_ARGUMENTS = ("file", "load", "save", "model")  # commands whose argument may be a path: Tab completes it
PATH_SUFFIXES = {"load": (".json",), "save": tuple(EXPORT_FORMATS)}  # the only files Tab offers them


def complete(text: str, choices: Callable[[str], list[str]] | None = None) -> list[str]:
    """Completions of a half-typed command name ('/te' → ['/temp', '/temperature']), or of its
    argument: a path for the PATH_ARGUMENTS commands, and one of `choices(command)` (themes, presets, models)."""
    text = text.lstrip()
    if not text.startswith("/"):
        return []
    head, space, arg = text.partition(" ")
    if not space:
        stem = text[1:].lower()
        return [f"/{n}" for n in names() if n.startswith(stem)]
    found = spec(head[1:])
    if found is None or " " in arg.strip():
        return []
    paths = complete_path(arg) if found.name in PATH_ARGUMENTS else []
    if found.name in PATH_SUFFIXES:  # the files it takes, and the folders that may hold them
        paths = [v for v in paths if v.endswith("/") or v.lower().endswith(PATH_SUFFIXES[found.name])]
    values = paths + (choices(found.name) if choices else [])
    return [f"{head} {v}" for v in values if v.startswith(arg) and v != arg]


def complete_path(partial: str) -> list[str]:
    """Files and folders (these end with /) whose path starts with `partial` (~ expanded), sorted;
    hidden ones only where `partial` names a dot."""
    folder, slash, stem = partial.rpartition("/")
    prefix = folder + slash  # "" for a bare name: the current folder
    try:
        entries = sorted(os.scandir(os.path.expanduser(prefix or ".")), key=lambda e: e.name)
    except OSError:
        return []
    return [
        prefix + e.name + ("/" if e.is_dir() else "")
        for e in entries
        if e.name.startswith(stem) and (stem.startswith(".") or not e.name.startswith("."))
    ]


def common_completion(text: str, choices: Callable[[str], list[str]] | None = None) -> str | None:
    """What Tab turns `text` into: the one match plus a space (none after a folder), or the longest
    common prefix of all matches; None where Tab adds nothing (several matches: they cycle)."""
    matches = complete(text, choices)
    if not matches:
        return None
    if len(matches) == 1:
        return matches[0] + ("" if matches[0].endswith("/") else " ")
    prefix = os.path.commonprefix(matches)
    return prefix if len(prefix) > len(text.strip()) else None


def help_lines() -> list[tuple[str, str]]:
    """(usage, description) for every command, in /help order."""
    rows = []
    for s in COMMANDS:
        usage = f"/{s.name}" + (f" {s.usage}" if s.usage else "")
        if s.aliases:
            usage += " (" + ", ".join(f"/{a}" for a in s.aliases) + ")"
        rows.append((usage, s.help))
    return rows


def apply_setting(params, command: Command):
    """A copy of `params` (a SamplingParams) with the command's setting; ValueError (its range message) if invalid."""
    if command.setting is None:
        raise ValueError(f"/{command.name} is not a setting")
    field, value = command.setting
    return params.with_(**{field: value})
