"""`chatcli serve`: serve the OpenAI-compatible API with uvicorn, loading the model meanwhile.

`serve_command` is a click command; `chatcli.cli` names it as a lazy subcommand. Also runnable
alone: `python -m chatcli.server --port 8000`.

Imported at CLI start-up, so nothing heavy (torch, transformers, starlette,
uvicorn) is imported at module level. The model flags, --api-key and --cache-budget are declared
once, for `chatcli` too, in `chatcli.flags`; the options below are serve's own.
"""

from __future__ import annotations

import re
import sys

import click

from chatcli.flags import API_KEY, CACHE_BUDGET, CONTEXT, load_options, model_options, run_command, sampling_option
from chatcli.server.hosts import is_loopback

MIB = 1 << 20
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def bind_warning(host: str, api_key: str | None) -> str | None:
    """The warning for a server reachable from other machines without a key; None when fine."""
    if is_loopback(host) or api_key:
        return None
    return (
        f"warning: serving on {host} without --api-key: anyone who can reach this address can use the model "
        "(pass --api-key KEY, or bind to 127.0.0.1)"
    )


def serving_line(host: str, port: int) -> str:
    """What `chatcli serve` prints once its socket is bound: the API's URL (an IPv6 host in brackets, once)."""
    bare = host.strip().strip("[]")
    shown = f"[{bare}]" if ":" in bare else bare
    return (
        f"Serving at http://{shown}:{port}/v1 (OpenAI's API; Anthropic's at /v1/messages, Ollama's at /api; "
        "/health says loading until the model is ready; Ctrl-C stops)"
    )


def _fail(message: str, code: int = 1):
    click.echo(f"chatcli: error: {message}", err=True)
    raise click.exceptions.Exit(code)


@click.command("serve", context_settings=CONTEXT)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; loopback by default.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="TCP port.")
@API_KEY.option(help="Require 'Authorization: Bearer KEY' on every request.")
@model_options()
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1),
    default=MIB,
    show_default=True,
    help="Largest request body accepted (413 past it).",
)
@CACHE_BUDGET.option()
@click.option(
    "--max-queue",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Requests running or waiting before more get a 503.",
)
@click.option(
    "--parallel",
    type=click.IntRange(1, 64),
    default=None,
    metavar="N",
    help="Requests generated at once, their steps batched [default: 4 where the compiled kernel runs, else 1].",
)
@sampling_option(
    "max_tokens",
    help="Most tokens in the reply to a request that sends no max_tokens "
    "[default: the config file's [sampling] max_tokens, else up to the context limit].",
)
@click.option(
    "--log-level", default="info", show_default=True, help="uvicorn's log level: debug, info, warning, error."
)
@click.option(
    "--cors-origins",
    default=None,
    metavar="ORIGINS",
    help="Web origins whose pages may call the server, comma-separated ('*': any). Off by default.",
)
@click.option(
    "--alias",
    "aliases",
    multiple=True,
    metavar="NAME",
    help="Another name the model answers to in requests' model field (repeatable); besides its id and file name.",
)
def serve_command(
    host,
    port,
    api_key,
    model,
    max_body_bytes,
    cache_budget,
    max_queue,
    parallel,
    max_tokens,
    log_level,
    cors_origins,
    aliases,
    **load,
) -> None:
    """Serve the model over HTTP: OpenAI's, Anthropic's and Ollama's APIs (SSE streaming)."""
    from chatcli.config import ConfigError, load_config
    from chatcli.options import StartOptions

    if log_level.lower() not in LOG_LEVELS:
        _fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}", 2)
    origins = cors_list(cors_origins)
    for alias in aliases:
        if not alias.strip():
            _fail("--alias takes a non-empty name", 2)
    warning = bind_warning(host, api_key)
    if warning:
        click.echo(warning, err=True)
    try:
        config = load_config()
        params = serve_defaults(config.params(), config.sampling, max_tokens)
        start = StartOptions(model=model, load=config.load_options(load_options(load)), params=params, config=config)
    except ConfigError as exc:
        _fail(str(exc))
    except ValueError as exc:  # InvalidParameter: --max-tokens out of range
        _fail(str(exc), 2)

    def load_model():
        """In the app's loading thread, while /health says loading; a LoadError stops the server in one line."""
        from chatcli.engine import release_cpu_threads

        engine = start.load_engine(status=_status_lines())
        release_cpu_threads()  # requests run in the generation thread: see engine/runners/threads.py
        if engine.note:
            click.echo(f"Note: {engine.note}", err=True)
        click.echo(f"Ready: {engine.name} ({engine.weights})", err=True)
        return engine

    serve(
        load_model,
        host=host,
        port=port,
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        cache_budget_bytes=cache_budget,
        defaults=start.params,
        max_queue=max_queue,
        parallel=parallel,
        log_level=log_level,
        cors_origins=origins,
        aliases=tuple(aliases),
    )


def serve_defaults(params, sampling: dict, max_tokens: int | None):
    """The sampling defaults of a request: the config file's `params`, and max_tokens from --max-tokens,
    else from its [sampling] table (`sampling`), else up to the context limit (`schema.TO_CONTEXT`): most
    clients send none, and a reply cut at a default of ours would end `length` (OpenAI's and llama-server's
    run to the context limit)."""
    from chatcli.server.schema import TO_CONTEXT

    if max_tokens is None and "max_tokens" not in sampling:
        max_tokens = TO_CONTEXT
    return params if max_tokens is None else params.with_(max_tokens=max_tokens)


def cors_list(value: str | None) -> tuple[str, ...]:
    """--cors-origins: comma-separated origins (scheme://host[:port]) or '*'; one line and exit 2 otherwise."""
    if not value:
        return ()
    origins = tuple(o.strip().rstrip("/") for o in value.split(",") if o.strip())
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            _fail(f"--cors-origins takes origins like http://localhost:3000 (or '*'), got {origin!r}", 2)
    return origins


def _status_lines():
    """Loading messages on stderr, one line each (a conversion's per-tensor steps once)."""
    last = []

    def status(text: str, done: int | None = None, total: int | None = None) -> None:
        if not last or last[-1] != text:
            last.append(text)
            click.echo(text, err=True)

    return status


def serve(
    load,
    *,
    host: str,
    port: int,
    api_key: str | None = None,
    max_body_bytes: int = MIB,
    cache_budget_bytes: int | None = None,
    defaults=None,
    max_queue: int = 64,
    parallel: int | None = None,
    log_level: str = "info",
    cors_origins: tuple[str, ...] = (),
    aliases: tuple[str, ...] = (),
) -> None:
    """Run the server in this thread until Ctrl-C: it listens at once and loads the model (`load()`)
    in a thread meanwhile; a failed load stops it with that one line and exit 1. `cache_budget_bytes`
    None: the pool's default (an eighth of RAM, as the TUI's). Ctrl-C ends the replies in flight at
    once, each stream with an error event (`http.StoppingServer`), and the process exits."""
    from chatcli.engine import default_budget_bytes
    from chatcli.server.app import LOOPBACK_HOSTS, create_app
    from chatcli.server.http import StoppingServer, bind, uvicorn_config

    if cache_budget_bytes is None:
        cache_budget_bytes = default_budget_bytes()

    failed: list[str] = []

    def on_load_failure(message: str) -> None:
        failed.append(message)
        server.should_exit = True

    app = create_app(
        None,
        load=load,
        on_load_failure=on_load_failure,
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        cache_budget_bytes=cache_budget_bytes,
        defaults=defaults,
        max_pending=max_queue,
        parallel=parallel,
        cors_origins=cors_origins,
        allowed_hosts=LOOPBACK_HOSTS if is_loopback(host) else None,
        aliases=aliases,
    )
    bare = host.strip("[]")
    config = uvicorn_config(app, host=bare, port=port, log_level=log_level.lower())
    server = StoppingServer(config)  # Ctrl+C: the replies in flight end with an error event, no wait
    try:
        sock = bind(bare, port)  # before "Serving at": a port in use is one line, and nothing else
    except OSError as exc:
        _fail(f"cannot serve on {host}:{port}: {exc.strerror or exc}")
    click.echo(serving_line(host, port), err=True)
    try:
        server.run(sockets=[sock])
    except OSError as exc:
        _fail(f"cannot serve on {host}:{port}: {exc.strerror or exc}")
    if failed:
        _fail(failed[0])


def main() -> None:
    """`python -m chatcli.server`: serve alone, with chatcli's one-line errors."""
    run_command(serve_command, prog_name="python -m chatcli.server")


if __name__ == "__main__":
    sys.exit(main())
