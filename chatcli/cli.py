"""The command line: `chatcli` (TUI), `chatcli -p`/piped stdin (one-shot), `chatcli bench`, `chatcli serve`.

Every failure a user can cause ends as one line on stderr and a non-zero exit:
2 for bad usage or values, 1 for a model or context problem, 130 for Ctrl+C.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Optional

import typer

from chatcli.config import ConfigError, load_config
from chatcli.engine.load import LoadError, LoadOptions
from chatcli.engine.params import InvalidParameter
from chatcli.options import StartOptions

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="A terminal chat for local LLMs. Run it bare for the TUI, or pipe a prompt in for one answer.",
)


class UserError(Exception):
    """One line for the user, and an exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# Options shared by every command that loads a model.
ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="Hub id, model folder or .gguf file.")]
DeviceOpt = Annotated[str, typer.Option(help="auto | cpu | cuda | mps")]
DtypeOpt = Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16")]
DeviceMapOpt = Annotated[Optional[str], typer.Option("--device-map", help="'auto': let accelerate place the model.")]
RemoteCodeOpt = Annotated[bool, typer.Option("--trust-remote-code", help="Allow the model's own Python code.")]
RunnerOpt = Annotated[str, typer.Option(help="auto | hf | lean: the forward pass (auto: lean for Llama models).")]
QuantizeOpt = Annotated[Optional[str], typer.Option(help="int8: dynamic int8 weights and activations (CPU).")]
KvDtypeOpt = Annotated[str, typer.Option(help="KV cache dtype: auto (bf16 on CPUs with bf16 matmuls) | float32 | bfloat16 | float16")]


def start_options(
    *,
    model=None,
    device="auto",
    dtype="auto",
    device_map=None,
    trust_remote_code=False,
    runner="auto",
    quantize=None,
    kv_dtype="auto",
    system=None,
    theme=None,
    **sampling,
) -> StartOptions:
    """Config file first, then the flags that were given."""
    try:
        config = load_config()
        given = {k: v for k, v in sampling.items() if v is not None and v != []}
        if "stop" in given:
            given["stop"] = tuple(given["stop"])
        params = config.params().with_(**given)
    except ConfigError as exc:
        raise UserError(f"config: {exc}", 2) from None
    except InvalidParameter as exc:
        raise UserError(str(exc), 2) from None
    return StartOptions(
        model=model,
        load=LoadOptions(
            device=device,
            dtype=dtype,
            device_map=device_map,
            trust_remote_code=trust_remote_code,
            runner=runner,
            quantize=quantize,
            kv_dtype=kv_dtype,
        ),
        params=params,
        system=system if system is not None else config.system,
        system_given=system is not None,
        theme=theme or config.theme,
        config=config,
    )


@app.callback(invoke_without_command=True)
def chat(
    ctx: typer.Context,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="Answer this once and exit.")] = None,
    model: ModelOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    device_map: DeviceMapOpt = None,
    trust_remote_code: RemoteCodeOpt = False,
    runner: RunnerOpt = "auto",
    quantize: QuantizeOpt = None,
    kv_dtype: KvDtypeOpt = "auto",
    temperature: Annotated[Optional[float], typer.Option(help="0 is greedy.")] = None,
    top_k: Annotated[Optional[int], typer.Option(help="0 disables.")] = None,
    top_p: Annotated[Optional[float], typer.Option(help="In (0, 1]; 1 disables.")] = None,
    min_p: Annotated[Optional[float], typer.Option(help="In [0, 1]; 0 disables.")] = None,
    repeat_penalty: Annotated[Optional[float], typer.Option(help="1 disables.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed the sampler for a reproducible run.")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Most tokens in a reply.")] = None,
    lookup: Annotated[
        Optional[int], typer.Option(help="Draft up to N tokens from the conversation, verified in one pass (0 disables).")
    ] = None,
    stop: Annotated[Optional[list[str]], typer.Option(help="Stop at this string (repeatable).")] = None,
    system: Annotated[Optional[str], typer.Option(help="System prompt.")] = None,
    theme: Annotated[Optional[str], typer.Option(help="TUI theme.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One-shot: print one JSON object.")] = False,
    stats: Annotated[bool, typer.Option("--stats", help="One-shot: a stats line on stderr.")] = False,
    continue_last: Annotated[bool, typer.Option("--continue", "-c", help="Continue the most recent conversation.")] = False,
    conversation: Annotated[Optional[str], typer.Option(help="Continue this conversation (an id from 'chatcli history').")] = None,
    cache_budget: Annotated[
        Optional[int], typer.Option(min=0, help="MiB of KV caches kept in memory across conversations (default: RAM/8).")
    ] = None,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    start = start_options(
        model=model,
        device=device,
        dtype=dtype,
        device_map=device_map,
        trust_remote_code=trust_remote_code,
        runner=runner,
        quantize=quantize,
        kv_dtype=kv_dtype,
        system=system,
        theme=theme,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repeat_penalty=repeat_penalty,
        seed=seed,
        max_tokens=max_tokens,
        lookup=lookup,
        stop=stop,
    )
    start.continue_last, start.conversation = continue_last, conversation
    start.cache_budget_bytes = cache_budget * (1 << 20) if cache_budget is not None else None
    piped = not sys.stdin.isatty()
    if prompt is None and not piped:
        if not (sys.stdout.isatty() and sys.stderr.isatty()):  # Textual draws on stderr
            raise UserError("no prompt: pass -p TEXT or pipe text in (the TUI needs a terminal)", 2)
        from chatcli.ui.app import run_tui

        raise typer.Exit(run_tui(start))
    from chatcli.oneshot import read_prompt, run_oneshot

    text = read_prompt(sys.stdin.buffer if piped else None, prompt)
    code = run_oneshot(start, text, json_out=json_out, show_stats=stats, resume=conversation, continue_last=continue_last)
    # Everything is written and committed: skip the interpreter's teardown of torch (about half a second).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@app.command()
def pull(
    model: ModelOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "auto",
    trust_remote_code: RemoteCodeOpt = False,
) -> None:
    """Load a model once (converting a GGUF into the cache) and say where it is."""
    from chatcli.oneshot import load_engine

    start = start_options(model=model, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    engine = load_engine(start)
    typer.echo(f"ready: {engine.name} ({engine.context_limit} tokens of context)")


@app.command()
def history(json_out: Annotated[bool, typer.Option("--json", help="A JSON list.")] = False) -> None:
    """List saved conversations, most recent first."""
    import json
    from datetime import datetime

    summaries = [s.to_dict() for s in _store().summaries()]
    if json_out:
        typer.echo(json.dumps(summaries, ensure_ascii=False, indent=1))
        return
    for s in summaries:
        when = datetime.fromtimestamp(s["updated"]).strftime("%Y-%m-%d %H:%M")
        typer.echo(f"{s['id']}  {when}  {s['messages']:>3} msgs  {s['model'] or '-'}  {s['title']}")


@app.command()
def export(
    conversation_id: Annotated[str, typer.Argument(metavar="ID", help="An id (or a unique prefix) from 'chatcli history'.")],
    fmt: Annotated[str, typer.Option("--format", help="md | json")] = "md",
) -> None:
    """Print one saved conversation as Markdown or JSON."""
    import json

    from chatcli.chat.store import to_markdown

    if fmt not in ("md", "json"):
        raise UserError(f"--format must be md or json, got {fmt!r}", 2)
    store = _store()
    found = store.find(conversation_id)
    data = store.export(found) if found else None
    if data is None:
        raise UserError(f"no conversation {conversation_id!r} (see 'chatcli history')")
    typer.echo(json.dumps(data, ensure_ascii=False, indent=1) if fmt == "json" else to_markdown(data))


def _store():
    from chatcli.chat.store import Store, StoreError

    try:
        return Store()
    except StoreError as exc:
        raise UserError(str(exc)) from None


from chatcli.bench import bench_command  # noqa: E402 - cheap: both import torch lazily
from chatcli.server.cli import serve_command  # noqa: E402

app.command("bench")(bench_command)
app.command("serve")(serve_command)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the typer app, turning every user error into one line."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="chatcli", standalone_mode=False)
    except UserError as exc:
        _fail(str(exc), exc.code)
    except typer.Exit as exc:
        code = exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("\n")
        sys.exit(130)
    except _usage_errors() as exc:  # unknown option, bad value, missing argument
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        _fail(f"{message} (see 'chatcli --help')", getattr(exc, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)


def _usage_errors() -> tuple[type[Exception], ...]:
    """The parser's exception classes: typer >= 0.20 vendors click, older typer uses click itself."""
    classes: list[type[Exception]] = [typer.exceptions.TyperException]
    try:
        import click

        classes.append(click.ClickException)
    except ImportError:
        pass
    return tuple(classes)


def _fail(message: str, code: int) -> None:
    sys.stderr.write(f"chatcli: error: {message}\n")
    sys.exit(code)


__all__ = ["app", "main", "UserError", "start_options", "LoadError"]
