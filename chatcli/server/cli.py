"""`chatcli serve`: load the model, then serve the OpenAI-compatible API with uvicorn.

`serve_command` is a plain function with typer options; `chatcli.cli` registers it
with `app.command("serve")(serve_command)`. Also runnable alone:
`python -m chatcli.server --port 8000`.

Imported at CLI start-up, so nothing heavy (torch, transformers, starlette,
uvicorn) is imported at module level.
"""

from __future__ import annotations

import ipaddress
import sys
from typing import Annotated, Optional

import typer

MIB = 1 << 20
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost: could resolve anywhere


def bind_warning(host: str, api_key: str | None) -> str | None:
    """The warning for a server reachable from other machines without a key; None when fine."""
    if is_loopback(host) or api_key:
        return None
    return (
        f"warning: serving on {host} without --api-key: anyone who can reach this address can use the model "
        "(pass --api-key KEY, or bind to 127.0.0.1)"
    )


def _fail(message: str, code: int = 1):
    typer.echo(f"chatcli: error: {message}", err=True)
    raise typer.Exit(code)


def serve_command(
    host: Annotated[str, typer.Option(help="Address to bind; loopback by default.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8000,
    api_key: Annotated[
        Optional[str],
        typer.Option("--api-key", envvar="CHATCLI_API_KEY", help="Require 'Authorization: Bearer KEY' on every request."),
    ] = None,
    model: Annotated[Optional[str], typer.Option(help="A .gguf file, a model folder or a hub id.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or mps.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16.")] = "auto",
    runner: Annotated[str, typer.Option(help="auto, hf or lean: the forward pass.")] = "auto",
    quantize: Annotated[Optional[str], typer.Option(help="int8: dynamic int8 weights and activations (CPU).")] = None,
    kv_dtype: Annotated[str, typer.Option(help="KV cache dtype: auto, float32, bfloat16 or float16.")] = "auto",
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest request body accepted (413 past it).")] = MIB,
    cache_budget: Annotated[
        int, typer.Option(min=0, help="MiB of KV cache kept across requests for prefix reuse (0 keeps none).")
    ] = 1024,
    max_queue: Annotated[int, typer.Option(min=1, help="Requests running or waiting before more get a 503.")] = 64,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level: debug, info, warning, error.")] = "info",
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API (chat completions, SSE streaming)."""
    from chatcli.config import ConfigError, load_config
    from chatcli.engine.load import LoadError, LoadOptions
    from chatcli.options import StartOptions

    if log_level.lower() not in LOG_LEVELS:
        _fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}", 2)
    warning = bind_warning(host, api_key)
    if warning:
        typer.echo(warning, err=True)
    try:
        config = load_config()
        start = StartOptions(model=model, load=LoadOptions(device=device, dtype=dtype, runner=runner, quantize=quantize,
                                                                 kv_dtype=kv_dtype), params=config.params(),
                             config=config)
        engine = start.load_engine(status=lambda msg: typer.echo(msg, err=True))
    except (ConfigError, LoadError) as exc:
        _fail(str(exc))
    from chatcli.engine.threads import release_cpu_threads

    release_cpu_threads()  # requests run in the generation thread: see engine/threads.py
    serve(engine, host=host, port=port, api_key=api_key, max_body_bytes=max_body_bytes,
          cache_budget_bytes=cache_budget * MIB, defaults=start.params, max_queue=max_queue, log_level=log_level)


def serve(engine, *, host: str, port: int, api_key: str | None = None, max_body_bytes: int = MIB,
          cache_budget_bytes: int = 1024 * MIB, defaults=None, max_queue: int = 64, log_level: str = "info") -> None:
    """Run the server in this thread until Ctrl-C."""
    import uvicorn

    from chatcli.server.app import create_app

    app = create_app(engine, api_key=api_key, max_body_bytes=max_body_bytes,
                     cache_budget_bytes=cache_budget_bytes, defaults=defaults, max_pending=max_queue)
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"Serving {engine.name} at http://{shown}:{port}/v1 (OpenAI-compatible; Ctrl-C stops)", err=True)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(), timeout_graceful_shutdown=5)
    try:
        uvicorn.Server(config).run()
    except OSError as exc:  # e.g. the port is taken
        _fail(f"cannot serve on {host}:{port}: {exc.strerror or exc}")


def main() -> None:
    typer.run(serve_command)


if __name__ == "__main__":
    sys.exit(main())
