"""What each slash command does on the chat screen (the parsing lives in `chatcli.chat.commands`).

`HANDLERS` maps every command that is not a setting to a function of a `SlashTarget` (the chat
screen, seen through `slash_target.py`) and the command's argument; a test checks that each
command `chat.commands` knows has one. A handler uses nothing of the screen but that Protocol:
it mounts no widget, and asks the screen for what it shows (a note, a loading line, a screen).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from chatcli.chat.commands import Command, CommandError, apply_setting, help_lines, parse, spec
from chatcli.engine import setting_of
from chatcli.ui.format import settings_rows, stats_lines
from chatcli.ui.screens.slash_files import attach, load, save
from chatcli.ui.screens.slash_models import backend, model, models

if TYPE_CHECKING:
    from chatcli.ui.screens.slash_target import SlashTarget

BUSY = "a reply is streaming: press Esc to stop it first"
KEYS = (
    "Enter send · Shift+Enter/Ctrl+J newline · ↑/↓ history · Tab complete · PgUp/PgDn scroll · End bottom · Esc stop"
    " · F2 panels · F3 conversations · F4 tokens · F5 copy the last reply · F8 reasoning · F9 edit"
    " · Ctrl+N new conversation · Ctrl+Q quit"
)

Handler = Callable[["SlashTarget", str], Awaitable[None]]


async def run_command(screen: SlashTarget, text: str) -> None:
    """Parse and carry out one command line; every problem is an inline note."""
    try:
        command = parse(text)
    except CommandError as exc:
        screen.note(str(exc), error=True)
        return
    if command.setting is not None:
        set_value(screen, command)
    elif command.field is not None:  # a setting's command without a value: what it is now
        show_value(screen, command)
    else:
        await HANDLERS[command.name](screen, command.arg)


def show_value(screen: SlashTarget, command: Command) -> None:
    setting = setting_of(command.field)
    usage = spec(command.name).usage
    screen.note(
        f"{setting.name} = {setting.show(getattr(screen.params, command.field))} (/{command.name} {usage} sets it)"
    )


def set_value(screen: SlashTarget, command: Command) -> None:
    try:
        params = apply_setting(screen.params, command)
        if screen.engine is not None:  # what only the model knows: its vocabulary (a logit bias's ids)
            screen.engine.check_params(params)
    except ValueError as exc:
        screen.note(f"/{command.name}: {str(exc).removeprefix('logit-bias: ')} (unchanged)", error=True)
        return
    screen.set_params(params)
    field, _value = command.setting
    setting = setting_of(field)
    screen.note(f"{setting.name} = {setting.show(getattr(params, field))}")  # as checked (a bias as pairs)


# -- showing -------------------------------------------------------------------


async def show_help(screen: SlashTarget, _arg: str) -> None:
    screen.listing(help_lines(), KEYS)


async def system(screen: SlashTarget, arg: str) -> None:
    conv = screen.conversation
    if not arg:
        screen.note(f"system prompt: {conv.system}" if conv.system else "no system prompt (set one with /system TEXT)")
        return
    conv.system = arg
    screen.chats.save_system(conv)
    screen.note(f"system prompt set: {arg}")


async def preset(screen: SlashTarget, arg: str) -> None:
    """/preset NAME: the config file's [presets.NAME] — its system prompt for this conversation and its
    sampling values from now on; bare: list them."""
    from chatcli.config import ConfigError

    config = screen.config
    if not arg:
        names = ", ".join(sorted(config.presets))
        screen.note(f"presets: {names}" if names else f"no presets: add [presets.NAME] tables to {config.path}")
        return
    try:
        chosen = config.preset(arg)
        params = chosen.params(screen.params)
    except ConfigError as exc:
        screen.note(f"/preset: {exc}", error=True)
        return
    screen.set_params(params)
    changed = [f"{setting_of(k).name} = {setting_of(k).show(getattr(params, k))}" for k in chosen.sampling]
    if chosen.system is not None:
        screen.conversation.system = chosen.system
        screen.chats.save_system(screen.conversation)
        changed.insert(0, f"system prompt: {chosen.system}")
    screen.note(f"preset {arg}: " + ("; ".join(changed) or "nothing to set"))


async def copy(screen: SlashTarget, arg: str) -> None:
    """/copy [code [N] | N] to the clipboard through the terminal (OSC 52: works over ssh too)."""
    from chatcli.chat.copying import CopyError, pick

    try:
        text, what = pick(screen.conversation, arg)
    except CopyError as exc:
        screen.note(f"/copy: {exc}", error=True)
        return
    screen.copy_text(text, what)


async def edit(screen: SlashTarget, arg: str) -> None:
    arg = arg.strip()
    if arg and not arg.isdigit():
        screen.note(f"/edit takes the number (#N) of one of your messages, got {arg!r}", error=True)
        return
    screen.start_edit(int(arg) if arg else None)


async def branches(screen: SlashTarget, _arg: str) -> None:
    """/branches: the conversation's tree, numbered as the sidebar and /switch N take them."""
    rows = screen.chats.rows()
    number = {r.id: i for i, r in enumerate(rows, 1)}
    family = screen.chats.family(screen.conversation)
    if len(family) < 2:
        screen.note("no branches: /edit N (or F9 for your last message) starts one")
        return
    lines = ["Branches (/switch N opens one):"]
    for row in family:
        mark = "●" if row.id == screen.conversation.id else " "
        kind = "root" if not row.branch else "⑂ branch" if row.fork_at is None else f"⑂ branch at #{row.fork_at + 1}"
        lines.append(f"{mark} {number.get(row.id, '?'):>2}  {kind:<8}  {row.messages} msg  {row.title}")
    screen.note("\n".join(lines))


async def search(screen: SlashTarget, arg: str) -> None:
    """/search TEXT: every saved message with those words, ranked; Enter opens one."""
    from chatcli.ui.screens.search import SearchResults

    if not arg.strip():
        screen.note("/search needs words to look for: /search TEXT", error=True)
        return
    store = screen.chats.store
    if store is None:
        screen.note("/search: no conversation database (conversations are not saved this run)", error=True)
        return
    hits = store.search(arg)
    if not hits:
        screen.note(f"no saved message holds {arg!r}")
        return

    async def opened(hit) -> None:
        if hit is not None:
            await screen.open_hit(hit.conversation_id, hit.index)

    screen.open_screen(SearchResults(arg, hits), opened)


async def settings(screen: SlashTarget, _arg: str) -> None:
    model = getattr(screen.engine, "name", None) or "(loading)"
    rows = settings_rows(screen.params, screen.conversation.system, screen.chat_theme, model)
    screen.listing(rows, min_text=10)  # short values: beside their names on a narrow terminal too


async def stats(screen: SlashTarget, _arg: str) -> None:
    if screen.last_stats is None:
        screen.note("no turn yet", error=True)
        return
    screen.note("\n".join(stats_lines(screen.last_stats)))


async def theme(screen: SlashTarget, arg: str) -> None:
    if not arg:
        current = screen.chat_theme
        screen.note("themes: " + ", ".join(f"[{n}]" if n == current else n for n in screen.theme_names()))
        return
    error = screen.set_theme(arg)
    screen.note(error or f"theme = {arg}", error=bool(error))


# -- the conversation ------------------------------------------------------------


async def clear(screen: SlashTarget, _arg: str) -> None:
    """A new, empty conversation with the current system prompt; the old one stays in the sidebar."""
    if screen.busy:
        screen.note(BUSY, error=True)
        return
    screen.drop_queue()
    if await screen.new_conversation(screen.conversation.system):
        screen.note("new conversation")


async def retry(screen: SlashTarget, _arg: str) -> None:
    if screen.busy:
        screen.note(BUSY, error=True)
        return
    if screen.engine is None:
        screen.note("the model is not loaded yet", error=True)
        return
    popped = screen.conversation.pop_reply()
    if popped is None:
        screen.note("nothing to retry", error=True)
        return
    await screen.forget([popped])
    why = same_reply_again(screen.params)
    if why:
        screen.notice(why, "Same settings, same reply")
    screen.begin_turn()


def same_reply_again(params) -> str | None:
    """Why /retry, with the settings unchanged, gives the reply it replaces again: greedy decoding, or a
    fixed seed (which, as llama.cpp's --seed and ollama's seed option, makes a reply reproducible)."""
    if params.temperature == 0:
        return "temperature 0 picks the likeliest token each time: /retry gives the same reply (/temp X for another)"
    if params.seed is not None:
        return f"seed {params.seed} is fixed: /retry gives the same reply (/seed off, or another seed, for another)"
    return None


async def undo(screen: SlashTarget, _arg: str) -> None:
    if screen.busy:
        screen.note(BUSY, error=True)
        return
    removed = screen.conversation.undo()
    if not removed:
        screen.note("nothing to undo", error=True)
        return
    await screen.forget(removed)
    kept = screen.crop_cache()
    screen.note(f"removed the last exchange ({len(removed)} messages); cache keeps {kept} tokens")


# -- the conversations -------------------------------------------------------------


async def new(screen: SlashTarget, _arg: str) -> None:
    await screen.action_new_conversation()


async def switch(screen: SlashTarget, arg: str) -> None:
    await screen.switch_to(int(arg))


async def rename(screen: SlashTarget, arg: str) -> None:
    screen.chats.rename(screen.conversation, arg)
    screen.refresh_sidebar()
    screen.note(f"renamed: {arg}")


async def delete(screen: SlashTarget, _arg: str) -> None:
    if screen.refuse_switch():
        return
    from chatcli.ui.screens.confirm import Confirm

    conv = screen.conversation
    question = f"Delete the conversation “{conv.title}” and its {len(conv.messages)} messages? This cannot be undone."

    async def answered(yes: bool | None) -> None:
        if yes:
            await screen.delete_current()
        else:
            screen.note("kept the conversation")

    screen.open_screen(Confirm(question), answered)


async def tools(screen: SlashTarget, _arg: str) -> None:
    box = screen.toolbox
    if box is None:
        starting = "the MCP servers are still starting" if screen.tools_starting else None
        screen.note(starting or "No tools: start chatcli with --mcp NAME (an [mcp.NAME] server of the config file).")
        return
    lines = box.listing()
    screen.note("\n".join([f"Tools ({len(box.hub.tools)}); a call asks first unless it says otherwise:", *lines]))


async def tokens(screen: SlashTarget, _arg: str) -> None:
    screen.action_toggle_tokens()


async def top_logprobs(screen: SlashTarget, arg: str) -> None:
    from chatcli.engine import MAX_TOP_LOGPROBS

    try:
        n = int(arg)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_TOP_LOGPROBS:
        screen.note(f"/top-logprobs takes N in [0, {MAX_TOP_LOGPROBS}], got {arg!r}", error=True)
        return
    screen.top_logprobs = n
    screen.note(f"The token inspector records the {n} most likely alternatives of each reply token from now on.")


async def quit_(screen: SlashTarget, _arg: str) -> None:
    screen.quit_app()


HANDLERS: dict[str, Handler] = {
    "help": show_help,
    "system": system,
    "preset": preset,
    "copy": copy,
    "search": search,
    "model": model,
    "edit": edit,
    "branches": branches,
    "settings": settings,
    "stats": stats,
    "backend": backend,
    "models": models,
    "clear": clear,
    "new": new,
    "switch": switch,
    "rename": rename,
    "delete": delete,
    "save": save,
    "load": load,
    "file": attach,
    "retry": retry,
    "undo": undo,
    "theme": theme,
    "tokens": tokens,
    "tools": tools,
    "top-logprobs": top_logprobs,
    "quit": quit_,
}
