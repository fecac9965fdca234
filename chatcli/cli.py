"""The command line: `chatcli` (TUI), `chatcli -p`/piped stdin (one-shot), `chatcli bench`, `chatcli serve`,
`chatcli models` / `rm` (`chatcli.models`).

Every failure a user can cause ends as one line on stderr and a non-zero exit:
2 for bad usage or values, 1 for a model or context problem, 130 for Ctrl+C.
Built on click directly: a one-shot's start-up pays for the parser it uses and nothing more.
"""

from __future__ import annotations

import os
import sys

import click

from chatcli.config import ConfigError, load_config
from chatcli.engine import InvalidParameter, LoadError
from chatcli.errors import UserError
from chatcli.flags import (
    API_KEY,
    CACHE_BUDGET,
    CONTEXT,
    JSON,
    LOAD_FIELDS,
    given_sampling,
    load_options,
    model_options,
    run_command,
    sampling_options,
)
from chatcli.options import StartOptions


class LazyGroup(click.Group):
    """Subcommands imported only when named (click's documented lazy-loading pattern): a one-shot
    imports neither the bench nor the server."""

    lazy = {"bench": "chatcli.bench:bench_command", "serve": "chatcli.server.cli:serve_command"}
    lazy |= {"models": "chatcli.models:models_command", "rm": "chatcli.models:rm_command"}
    lazy |= {"history": "chatcli.history:history_command", "export": "chatcli.history:export_command"}

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx, name):
        if name in self.lazy:
            import importlib

            module, _, attr = self.lazy[name].partition(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


def read_json_schema(value: str):
    """--json-schema's value: a file holding a JSON schema, or the schema's own JSON text."""
    from pathlib import Path

    from chatcli.engine import ResponseFormat

    text, name = value, ""
    path = Path(value).expanduser()
    if path.is_file() or not _json_text(value):
        try:
            text, name = path.read_text(encoding="utf-8"), path.stem
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"--json-schema: cannot read {value}: {getattr(exc, 'strerror', None) or exc}", 2) from None
    try:
        return ResponseFormat.json_schema(text, name)
    except InvalidParameter as exc:
        raise UserError(f"--json-schema: {exc}", 2) from None


def with_files(text: str, files: tuple[str, ...]) -> str:
    """The prompt with each -f file before it (`chat.attach`); a file that cannot be attached is a usage error."""
    from chatcli.chat.attach import AttachError, read_attachment, with_attachments

    try:
        return with_attachments(text, [read_attachment(name, sys.stdin.buffer) for name in files])
    except AttachError as exc:
        raise UserError(f"-f {exc}", 2) from None


def mcp_servers(config, names: tuple[str, ...], allow_tools: bool) -> list:
    """The [mcp.NAME] servers --mcp picks; a name the config lacks, or --allow-tools alone, is a usage error."""
    if allow_tools and not names:
        raise UserError("--allow-tools runs the tools of --mcp NAME: name a server too", 2)
    try:
        return config.mcp_servers(names)
    except ConfigError as exc:
        raise UserError(f"--mcp: {exc}", 2) from None


def _json_text(value: str) -> bool:
    """Whether a --json-schema value is JSON text rather than a file name: it parses, or it opens an object."""
    import json

    try:
        json.loads(value)
    except ValueError:
        return value.lstrip().startswith("{")
    return True


def start_options(
    *,
    model=None,
    system=None,
    theme=None,
    api=None,
    api_key=None,
    preset=None,
    json_schema=None,
    mcp=(),
    allow_tools=False,
    **flags,
) -> StartOptions:
    """Config file first, then the preset (`--preset`), then the flags that were given. `flags`: the
    values of the model flags and the sampling flags (`chatcli.flags`), by field name; `mcp`: the
    --mcp names, resolved to the config's [mcp.NAME] servers."""
    load = load_options({k: flags.pop(k) for k in LOAD_FIELDS if k in flags})
    if json_schema is not None:
        flags["response_format"] = read_json_schema(json_schema)
    try:
        config = load_config()
        chosen = config.preset(preset) if preset else None
        params = config.params()
        if chosen is not None:
            params = chosen.params(params)
            if system is None and chosen.system is not None:
                system = chosen.system  # a chosen preset's prompt, as if given on the command line
        params = params.with_(**given_sampling(flags))
    except ConfigError as exc:
        raise UserError(f"config: {exc}", 2) from None
    except InvalidParameter as exc:
        raise UserError(str(exc), 2) from None
    servers = mcp_servers(config, mcp, allow_tools)
    return StartOptions(
        model=model,
        load=config.load_options(load),
        params=params,
        system=system if system is not None else config.system,
        system_given=system is not None,
        theme=theme or config.theme,
        config=config,
        api=api or config.api,
        # the config's key goes only to the config's server, never to another --api URL
        api_key=api_key or (config.api_key if api in (None, config.api) else None),
        mcp=servers,
        allow_tools=allow_tools,
    )


@click.group(
    cls=LazyGroup,
    invoke_without_command=True,
    context_settings=CONTEXT,
    help="A terminal chat for local LLMs. Run it bare for the TUI, or pipe a prompt in for one answer.",
)
@click.option("--prompt", "-p", default=None, help="Answer this once and exit.")
@click.option(
    "--file",
    "-f",
    "files",
    multiple=True,
    metavar="FILE",
    help="One-shot: attach this text file to the prompt ('-': stdin); repeatable.",
)
@model_options()
@sampling_options()
@click.option("--api", default=None, metavar="URL", help="Answer from this OpenAI-compatible server (…/v1).")
@API_KEY.option(help="The --api server's key.")
@click.option("--system", default=None, help="System prompt.")
@click.option(
    "--preset",
    default=None,
    metavar="NAME",
    help="A [presets.NAME] of the config file: its system prompt and sampling.",
)
@click.option("--theme", default=None, help="TUI theme.")
@click.option(
    "--mcp",
    "mcp",
    multiple=True,
    metavar="NAME",
    help="Offer the model the tools of the config's [mcp.NAME] MCP server; repeatable.",
)
@click.option(
    "--allow-tools",
    is_flag=True,
    help="Run the --mcp tools the model calls without asking (without it the one-shot runs none, the TUI asks).",
)
@JSON.option(help="One-shot: print one JSON object.")
@click.option(
    "--json-schema",
    default=None,
    metavar="FILE|JSON",
    help="One-shot: hold the reply to this JSON schema (a file, or the schema's text; '{}': any JSON).",
)
@click.option("--stats", is_flag=True, help="One-shot: a stats line on stderr.")
@click.option("--continue", "-c", "continue_last", is_flag=True, help="Continue the most recent conversation.")
@click.option("--conversation", default=None, help="Continue this conversation (an id from 'chatcli history').")
@click.option(
    "--save/--no-save",
    default=None,
    help="One-shot: save the exchange as a conversation (default: yes, or the config's save = false).",
)
@CACHE_BUDGET.option()
@click.pass_context
def app(
    ctx,
    prompt,
    files,
    model,
    api,
    api_key,
    system,
    preset,
    theme,
    mcp,
    allow_tools,
    json_out,
    json_schema,
    stats,
    continue_last,
    conversation,
    save,
    cache_budget,
    **flags,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    start = start_options(
        model=model,
        system=system,
        theme=theme,
        api=api,
        api_key=api_key,
        preset=preset,
        json_schema=json_schema,
        mcp=mcp,
        allow_tools=allow_tools,
        **flags,
    )
    start.continue_last, start.conversation = continue_last, conversation
    start.save = start.config.save if save is None else save
    start.cache_budget_bytes = cache_budget  # bytes (flags.Size); None: the pool's default
    piped = not sys.stdin.isatty() and "-" not in files  # `-f -` takes stdin as a file
    if prompt is None and not piped and not files:
        if not (sys.stdout.isatty() and sys.stderr.isatty()):  # Textual draws on stderr
            raise UserError("no prompt: pass -p TEXT or pipe text in (the TUI needs a terminal)", 2)
        if json_schema is not None:
            raise UserError("--json-schema is for one-shot replies: pass -p TEXT or pipe text in", 2)
        if start.params.logprobs is not None:
            raise UserError("--logprobs is for one-shot replies with --json (in the TUI, F4 shows each token's)", 2)
        from chatcli.ui.typeahead import hold_typeahead

        terminal = hold_typeahead()  # before Textual's import: an Enter typed meanwhile stays Enter
        from chatcli.ui.app import run_tui

        raise click.exceptions.Exit(run_tui(start, terminal))
    from chatcli.oneshot import read_prompt, run_oneshot

    if start.params.logprobs is not None and not json_out:
        raise UserError("--logprobs shows in the --json output: add --json", 2)
    text = with_files(read_prompt(sys.stdin.buffer if piped else None, prompt, required=not files), files)
    code = run_oneshot(
        start, text, json_out=json_out, show_stats=stats, resume=conversation, continue_last=continue_last
    )
    # Everything is written and committed: skip the interpreter's teardown of torch (about half a second).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@app.command(context_settings=CONTEXT)
@click.argument("name", required=False, metavar="[NAME]")
@model_options(device="cpu", without=("device_map", "runner", "kv_dtype", "chat_template", "raw"))
@click.option(
    "--verify",
    is_flag=True,
    help="First rehash every cached file a start reads (a start checks only sizes and mtimes); "
    "a damaged one is removed and converted again.",
)
def pull(name, model, verify, **load) -> None:
    """Make a model ready: convert a GGUF into the cache and write the lean file(s) a start
    memory-maps (by default a Q4/Q8 GGUF's own blocks where the kernel runs, else fp32; --quantize
    picks another), then say where they are. With --verify, each cached file is rehashed first and
    said ok or damaged; a damaged one is converted again (exit 0 once all are good). NAME (or -m): a
    model by name, fetched from the Hugging Face hub first (qwen3:4b, hf.co/USER/REPO[:QUANT],
    USER/REPO:QUANT; `chatcli models --catalogue` lists the built-in names)."""
    from chatcli.oneshot import load_engine

    start = start_options(model=name or model, **load)
    damaged = _verify(start) if verify else 0
    engine = load_engine(start)
    click.echo(f"ready: {engine.name} ({engine.context_limit} tokens of context, {type(engine.runner).__name__})")
    for path in engine.runner.files():
        click.echo(f"  {path} ({path.stat().st_size / 2**20:,.0f} MiB, memory-mapped at each start)")
    if damaged:
        click.echo(f"{damaged} damaged file{'s' if damaged > 1 else ''} converted again: all good now")


def _verify(start) -> int:
    """`pull --verify`: one line per cached file the start reads, ok or damaged (then removed)."""
    from chatcli.engine import verify_model_files
    from chatcli.oneshot import loading_status

    try:
        with loading_status() as status:
            checks = verify_model_files(start.model, start.load, config_default=start.config.model, status=status)
    except LoadError as exc:
        raise UserError(str(exc)) from None
    for check in checks:
        if check.ok:
            click.echo(f"ok       {check.path}")
        else:
            click.echo(f"damaged  {check.path}: {check.problem}; removed, converting it again")
    if not checks:
        click.echo("nothing to verify yet: the files are converted now")
    return sum(not check.ok for check in checks)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the click app, turning every user error into one line."""
    run_command(app, argv, prog_name="chatcli")


__all__ = ["app", "main", "UserError", "start_options", "LoadError"]
