"""`chatcli history` (the saved conversations, a search of their messages, `--recover` of a damaged
database) and `chatcli export ID` (one conversation as Markdown or JSON).

Lazy subcommands of `chatcli.cli`, as `models` is. Each line as a terminal may show it (`errors.shown`):
what a model, a tool or a server wrote never acts on the terminal; `--json` and an export to a file or a
pipe keep the exact text.
"""

from __future__ import annotations

import sys

import click

from chatcli.errors import UserError, shown, shown_json
from chatcli.flags import CONTEXT, JSON


@click.command("history", context_settings=CONTEXT)
@JSON.option(help="A JSON list.")
@click.option("--search", "text", default=None, metavar="TEXT", help="Saved messages with these words, best first.")
@click.option("--recover", is_flag=True, help="Copy what a damaged database still holds into a new one.")
def history_command(json_out, text, recover) -> None:
    """List saved conversations, most recent first (or, with --search, the messages that match).
    Each line as a terminal may show it (`errors.shown`); --json gives the exact text."""
    import json
    from datetime import datetime

    if recover:
        from chatcli.chat.salvage import salvage
        from chatcli.chat.store import database_path

        path = database_path()
        click.echo(salvage(path).line(path))
        return

    if text is not None:
        hits = _store().search(text)
        if json_out:
            click.echo(shown_json(json.dumps([h.to_dict() for h in hits], ensure_ascii=False, indent=1)))
        elif not hits:  # an answer, not an error (as grep finding nothing): --json gives []
            click.echo(shown(f"no saved message holds {text!r}"))
        for h in hits if not json_out else ():
            click.echo(shown(f"{h.conversation_id}  #{h.index + 1} {h.role:<9}  {h.title}\n    {h.snippet}"))
            if h.copies:  # the same message in a branch or an import: folded under it
                click.echo(shown(f"    {h.also_in()}"))
        return
    store = _store()
    summaries = [s.to_dict() for s in store.summaries()]
    if store.damage:  # listed around a damaged page: the ones it holds are marked
        click.echo(f"warning: {store.damage}", err=True)
    if json_out:
        click.echo(shown_json(json.dumps(summaries, ensure_ascii=False, indent=1)))
        return
    for s in summaries:
        when = datetime.fromtimestamp(s["updated"]).strftime("%Y-%m-%d %H:%M")
        count = "damaged " if s["damaged"] else f"{s['messages']:>3} msgs"
        click.echo(shown(f"{s['id']}  {when}  {count}  {s['model'] or '-'}  {s['title']}"))


@click.command("export", context_settings=CONTEXT)
@click.argument("conversation_id", metavar="ID")
@click.option("--format", "fmt", default="md", show_default=True, help="md | json")
def export_command(conversation_id, fmt) -> None:
    """Print one saved conversation as Markdown or JSON: exact where stdout is a file or a pipe; on a
    terminal, Markdown's control characters written out (`errors.shown`; JSON escapes them)."""
    from chatcli.chat.export import render_export

    if fmt not in ("md", "json"):
        raise UserError(f"--format must be md or json, got {fmt!r}", 2)
    store = _store()
    found = store.find(conversation_id)
    data = store.export(found) if found else None
    if data is None:
        from chatcli.chat.saved import not_found

        raise UserError(not_found(store, conversation_id))
    text = render_export(data, fmt)
    click.echo(shown(text) if sys.stdout.isatty() else text, color=True)  # color: click strips no escape


def _store():
    from chatcli.chat.store import Store, StoreError

    try:
        store = Store()
    except StoreError as exc:
        raise UserError(str(exc)) from None
    if store.recovered:  # a `history --recover` killed half way, finished on opening
        click.echo(f"note: {store.recovered}", err=True)
    return store
