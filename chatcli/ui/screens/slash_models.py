"""The slash commands about what answers: /model (load another), /backend, /models (what /model takes)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from chatcli.engine import local_models
from chatcli.errors import one_line

if TYPE_CHECKING:
    from chatcli.ui.screens.slash_target import SlashTarget


async def model(screen: SlashTarget, arg: str) -> None:
    """/model NAME: load another model (hub id, folder, .gguf, or the server's model with --api) in
    the background; the current one answers until it is ready. Bare: what answers now."""
    name = arg.strip()
    if not name:
        current = getattr(screen.engine, "name", None) or "(loading)"
        screen.note(
            f"model: {current} · /model NAME loads another (a name: default, qwen3:4b…; a hub id, a folder, a .gguf)"
        )
        return
    failed, remote = screen.load_error is not None, screen.remote  # the first model (server) failed
    if screen.engine is None and failed and remote:
        screen.note("/model: no server answers yet; sending a message connects again", error=True)
        return
    if (screen.engine is None and not failed) or screen.switching:
        screen.note("/model: a model is still loading; try again when it is ready", error=True)
        return
    if screen.busy:
        screen.note("/model: a reply is streaming; press Esc to stop it first", error=True)
        return
    alive = screen.engine is not None and not getattr(screen.engine, "lost", False)  # a generation process died
    if alive and await asyncio.to_thread(answering, screen.engine.name, name):
        # the model answering now: a reload would only drop every conversation's cache
        screen.note(f"/model: {screen.engine.name} is the model answering now")
        return
    screen.load_model(name)


async def backend(screen: SlashTarget, _arg: str) -> None:
    engine = screen.engine
    if engine is None:
        screen.note("the backend is not ready yet", error=True)
        return
    limit = engine.context_limit or "n/a"
    screen.note(f"backend: {engine.backend} · model {engine.name} · context {limit}")


async def models(screen: SlashTarget, _arg: str) -> None:
    engine = screen.engine
    if engine is None:
        screen.note("the backend is not ready yet", error=True)
        return
    try:
        names = await asyncio.to_thread(engine.models)  # a server's list: off the UI thread
    except Exception as exc:  # noqa: BLE001 - RemoteError, or what a server sent: one line
        screen.note(f"/models: {one_line(exc)}", error=True)
        return
    shown = [f"[{n}]" if n == engine.name else n for n in names]
    if not engine.keeps_cache:  # a server's list
        screen.note("models: " + (", ".join(shown) if shown else "(none listed)"))
        return
    # in process: what /model takes besides the model answering — the models on disk (pulled by name, the
    # embedded one as `default`), the config's default, the .gguf files here
    try:
        on_disk = [
            f"[{m.name}]" if engine.name in (m.name, m.file) else m.name
            for m in await asyncio.to_thread(local_models, False)
        ]
    except OSError:
        on_disk = []
    config = screen.config.model
    here = sorted(p.name for p in Path.cwd().glob("*.gguf") if p.is_file() and p.name not in names)
    rows = [("loaded", ", ".join(shown))]
    rows += [("on disk", ", ".join(on_disk))] if on_disk else []
    rows += [("config", config)] if config and config not in names else []
    rows += [(f"here ({Path.cwd()})", ", ".join(here))] if here else []
    screen.listing(rows, "/model NAME loads another: one of these, a .gguf file, a model folder or a hub id")


def answering(engine_name: str, name: str) -> bool:
    """`name` (as /model takes it: a file, a path, a model's name such as `default`) is the model that
    answers now, whose name is `engine_name` (a file's name, or the name it was pulled by)."""
    if engine_name in (name, Path(name).expanduser().name):
        return True
    try:
        entry = next((m for m in local_models(False) if m.name == name), None)
    except OSError:
        return False
    return entry is not None and engine_name in (entry.name, entry.file)
