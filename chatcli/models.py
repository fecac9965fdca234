"""`chatcli models` (the models on disk, or the catalogue's names) and `chatcli rm NAME` (one removed, with
what chatcli converted from it). `chatcli pull NAME` fetches one (`chatcli.cli`).

Lazy subcommands of `chatcli.cli`, as `serve` is: a one-shot imports neither. What they list and remove
is the engine's (`chatcli.engine.local_models`, `remove_model`): this module only prints.
"""

from __future__ import annotations

import json

import click

from chatcli.flags import CONTEXT, JSON


def size_text(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def when_text(epoch: float | None) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M") if epoch else "-"


@click.command("models", context_settings=CONTEXT)
@JSON.option(help="A JSON list.")
@click.option("--catalogue", is_flag=True, help="The built-in names `pull` and -m take (each pulled on first use).")
def models_command(json_out, catalogue) -> None:
    """List the models on disk: the embedded one (default), each GGUF pulled from the Hugging Face hub and
    each file chatcli converted by its path, with the name -m and /model take, its file, size, the size of
    chatcli's cache made from it, quant, architecture, context and last use."""
    from chatcli.engine import catalogue_names, local_models

    if catalogue:
        names = catalogue_names()
        if json_out:
            click.echo(json.dumps(names, indent=1))
        for name, where in names.items() if not json_out else ():
            click.echo(f"{name:<22} {where}")
        return
    entries = local_models()
    if json_out:
        click.echo(json.dumps([e.to_dict() for e in entries], ensure_ascii=False, indent=1))
        return
    rows = [("NAME", "FILE", "SIZE", "CACHE", "QUANT", "ARCH", "CONTEXT", "LAST USED")]
    for e in entries:
        file = e.file + (f" (+{len(e.files) - 1} more parts)" if len(e.files) > 1 else "")
        context = f"{e.context:,}" if e.context else "-"
        cache = size_text(e.cache) if e.cache else "-"
        rows.append(
            (
                e.name,
                file,
                size_text(e.size),
                cache,
                e.quant or "-",
                e.architecture or "-",
                context,
                when_text(e.last_used),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@click.command("rm", context_settings=CONTEXT)
@click.argument("name", metavar="NAME")
def rm_command(name) -> None:
    """Remove a model pulled by name (as `chatcli models` lists it) and everything chatcli converted from it;
    for a file by its path, only chatcli's cache made from it (the file stays)."""
    from chatcli.engine import LoadError, remove_model
    from chatcli.errors import UserError

    try:
        entry, folders = remove_model(name)
    except LoadError as exc:
        raise UserError(str(exc)) from None
    count = f"{len(folders)} folder{'s' if len(folders) != 1 else ''}"
    if entry.local:
        click.echo(f"removed chatcli's cache of {entry.path}: {count} ({size_text(entry.cache or 0)}); the file stays")
        return
    cache = f", and {count} of its converted cache" if folders else ""
    click.echo(f"removed {entry.name}: {entry.file} ({size_text(entry.size)}){cache}")
