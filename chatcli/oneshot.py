"""One-shot mode: `echo prompt | chatcli` or `chatcli -p prompt` answers once, streaming to stdout.

The reply goes to stdout exactly as the model wrote it where stdout is a file or a pipe (`> reply.py`
keeps every byte), and with its control characters written out (`errors.shown`: `\\x1b`) where it
is a terminal, so that no escape sequence in it acts there; `--json` is exact either way (JSON
escapes them). Every line on stderr (a tool call, a server's words) is shown so too.

Ctrl+C while a reply streams cancels the turn as the TUI's Esc does: the reply so far is printed,
saved as stopped, given by `--json` with `finish_reason: "cancelled"` and by `--stats` with its line,
and the exit is 130. A second Ctrl+C leaves at once.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from contextlib import contextmanager
from typing import BinaryIO

from chatcli.errors import UserError, reply_out, say, shown_json
from chatcli.options import StartOptions


def read_prompt(stdin: BinaryIO | None, prompt: str | None, required: bool = True) -> str:
    """Piped stdin first, then the -p text; refuse invalid UTF-8 (in either), and blank input where `required`
    (not where files are attached: they can be the whole message)."""
    parts = []
    if stdin is not None:
        data = stdin.read()
        try:
            parts.append(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise UserError(f"stdin is not valid UTF-8 (byte {exc.start})", 2) from None
    if prompt is not None:
        try:
            prompt.encode("utf-8")  # the bytes of an argument that is not UTF-8 arrive as lone surrogates
        except UnicodeEncodeError as exc:
            raise UserError(f"-p TEXT is not valid UTF-8 (character {exc.start})", 2) from None
        parts.append(prompt)
    text = "\n\n".join(p.strip("\n") for p in parts if p.strip())
    if not text.strip() and required:
        raise UserError("empty prompt: pipe some text in or pass -p TEXT", 2)
    return text


@contextmanager
def loading_status():
    """Loading progress on stderr (only where stderr is a terminal): a spinner with the latest
    message, and a bar for steps that report how far they are (a first conversion). Elsewhere
    nothing, and rich is not even imported (a piped one-shot starts faster)."""
    if not sys.stderr.isatty():
        yield lambda *_a, **_k: None
        return
    from rich.console import Console

    console = Console(stderr=True)
    from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("Loading model…", total=None)

        def status(text: str, done: int | None = None, total: int | None = None) -> None:
            progress.update(task, description=text, completed=done or 0, total=total)

        yield status


def load_engine(start: StartOptions):
    from chatcli.engine import LoadError, RemoteError

    try:
        with loading_status() as status:
            engine = start.load_engine(status=status)
    except (LoadError, RemoteError) as exc:
        raise UserError(str(exc)) from None
    if getattr(engine, "note", ""):  # e.g. a quantized GGUF run dequantized: said before the reply
        sys.stderr.write(f"chatcli: warning: {engine.note}\n")
    return engine


def check_params(engine, params) -> None:
    """A --logit-bias id past the vocabulary or a --json-schema the engine cannot hold the reply to:
    one line, before the turn starts."""
    from chatcli.engine import GrammarError, InvalidParameter

    try:
        engine.check_params(params)  # a remote engine leaves it to its server
    except GrammarError as exc:
        raise UserError(f"--json-schema: {exc}", 2) from None
    except InvalidParameter as exc:
        raise UserError(f"--{exc}", 2) from None


def open_conversation(store, start: StartOptions, resume: str | None, continue_last: bool):
    """The conversation to answer in: a saved one (`-c`, `--conversation ID`) or a new one."""
    from chatcli.chat.conversation import Conversation
    from chatcli.chat.saved import NoSuchConversation, open_saved

    if not (continue_last or resume):
        return Conversation(system=start.system), True
    try:
        return open_saved(store, continue_last, resume, start.system if start.system_given else None), False
    except NoSuchConversation as exc:
        raise UserError(str(exc)) from None


def run_oneshot(
    start: StartOptions,
    text: str,
    json_out: bool = False,
    show_stats: bool = False,
    resume: str | None = None,
    continue_last: bool = False,
) -> int:
    from chatcli.chat.store import StoreError

    try:
        return _answer(start, text, json_out, show_stats, resume, continue_last)
    except StoreError as exc:  # e.g. a full disk: what was printed stays printed
        raise UserError(str(exc)) from None


@contextmanager
def ctrl_c_cancels(cancel: threading.Event):
    """While a turn streams, Ctrl+C sets `cancel` (the engine ends the turn as cancelled, with its
    reply so far and its stats) instead of raising; a second Ctrl+C raises KeyboardInterrupt. Only
    where Ctrl+C would raise it (not where SIGINT is ignored, nor off the main thread)."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return

    def stop(_signum, _frame) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def stream_reply(engine, conversation, session, params, out, scored: list | None = None, accepted=None):
    """Run one turn, writing text pieces to `out` (None: don't) as they come, and each token's
    log-probabilities into `scored` (where the params ask for them; see `engine.sample.logprobs`);
    `accepted()` is called once the engine has taken the prompt (its prefill is done).

    Returns (Finished, pieces): Ctrl+C cancels the turn (`ctrl_c_cancels`), its Finished says so;
    (None, pieces) where a second Ctrl+C left before the engine could end it.
    """
    from chatcli.engine import ChatTemplateError, ContextOverflow, Finished, GrammarError, Prefilled, RemoteError, Token

    pieces: list[str] = []
    cancel = threading.Event()
    try:
        with ctrl_c_cancels(cancel):
            for event in engine.generate(conversation.for_template(), session, params, cancel):
                if isinstance(event, Prefilled) and accepted is not None:
                    accepted()
                if isinstance(event, Token) and scored is not None:
                    from chatcli.engine import token_entry

                    found = token_entry(getattr(engine, "tokenizer", None), event, top_key="top", with_id=True)
                    if found is not None:
                        scored.append(found)
                if isinstance(event, Token) and event.text:
                    pieces.append(event.text)
                    if out is not None:
                        out.write(event.text)
                        out.flush()
                elif isinstance(event, Finished):
                    return event, pieces
    except ContextOverflow as exc:
        raise UserError(f"prompt too long: {exc}") from None
    except (RemoteError, ChatTemplateError) as exc:
        raise UserError(str(exc)) from None
    except GrammarError as exc:  # past the check's first steps (see grammar.first_steps)
        raise UserError(f"--json-schema: {exc}", 2) from None
    except KeyboardInterrupt:
        cancel.set()
    return None, pieces


def _answer(start: StartOptions, text: str, json_out: bool, show_stats: bool, resume, continue_last: bool) -> int:
    from chatcli.chat.store import Store, StoreError

    if not start.save and not (continue_last or resume):  # --no-save: nothing to read, nothing to write
        from chatcli.chat.conversation import Conversation

        return _turn(None, start, text, json_out, show_stats, Conversation(system=start.system), True)
    try:
        store = Store()
        conversation, new = open_conversation(store, start, resume, continue_last)
    except StoreError as exc:
        raise UserError(str(exc)) from None
    from chatcli.chat.locks import turn_lock

    turn = contextlib.nullcontext() if new or not start.save else turn_lock(store.path.parent, conversation.id)
    try:
        with turn:
            return _turn(store, start, text, json_out, show_stats, conversation, new)
    finally:
        store.close()  # WAL checkpoint: the process may leave without interpreter teardown


def _turn(store, start: StartOptions, text: str, json_out: bool, show_stats: bool, conversation, new: bool) -> int:
    """One exchange in `conversation` (a saved one under its turn lock): the prompt saved once the engine
    takes it (a prompt refused as too long is not), the reply after it (with --mcp, each reply with tool
    calls and each result as they come); nothing saved with --no-save (`store` None: no saved
    conversation read either)."""
    saving = store is not None and start.save
    if saving and not new:  # another process may have answered in it while this one waited for the lock
        conversation, _ = open_conversation(store, start, conversation.id, False)
    hub = start_tools(start)  # the MCP servers start while the model loads
    try:
        return _exchange(store, start, text, json_out, show_stats, conversation, new, hub)
    finally:
        if hub is not None:
            hub.close()


def start_tools(start: StartOptions):
    """The --mcp servers, starting (a Hub), or None without --mcp."""
    if not start.mcp:
        return None
    from chatcli.chat.mcp import Hub

    return Hub(start.mcp).start()


def tools_ready(hub):
    """The Toolbox of the started servers; a server that did not start is one line and exit 1."""
    if hub is None:
        return None
    from chatcli.chat.toolturn import Toolbox

    failed = hub.wait()
    if failed:
        raise UserError(next(iter(failed.values())))
    return Toolbox(hub)


def _exchange(store, start: StartOptions, text: str, json_out: bool, show_stats: bool, conversation, new, hub) -> int:
    from dataclasses import asdict

    from chatcli.chat.saved import kv_path, save_kv
    from chatcli.engine import Finished, FinishReason

    saving = store is not None and start.save
    engine = load_engine(start)
    check_params(engine, start.params)
    toolbox = tools_ready(hub)
    prompt = conversation.add_user(text)
    saved = []

    def accepted() -> None:  # the prompt, once the engine takes it (or with its reply)
        if saving and not saved:
            if new:
                store.create(conversation, engine.name, messages=False)
            store.add_message(conversation.id, prompt)
            saved.append(prompt)

    session = engine.new_session()
    kv = kv_path(store, conversation.id) if store is not None else None
    if kv is not None and not new:  # a cache saved by an earlier run spares the history's prefill
        engine.restore_session(session, kv)
    out = reply_out(sys.stdout)
    scored = [] if json_out and start.params.logprobs is not None else None

    def save(message, params=None) -> None:
        if saving:
            store.add_message(conversation.id, message, params)

    if toolbox is None:
        done, pieces = stream_reply(
            engine, conversation, session, start.params, out if not json_out else None, scored, accepted
        )
        accepted()
        calls = []
    else:
        done, pieces, calls = tool_rounds(engine, conversation, session, start, toolbox, out, json_out, accepted, save)
    if done is None:  # a second Ctrl+C left before the engine ended the turn: what was streamed, stopped
        done = Finished("".join(pieces), FinishReason.CANCELLED, None)
    stats = done.stats.to_dict() if done.stats is not None else None
    reply = conversation.add_reply(done.reply, done.finish_reason, stats)
    if saving:
        store.add_message(conversation.id, reply, asdict(start.params))
    if json_out:
        record = {
            "model": engine.name,
            "weights": getattr(engine, "weights", None),  # what runs: `gguf Q4_K+Q6_K`, `float32-panels`, …
            "template": getattr(engine, "template", None),  # "model's own", "built-in gemma", "raw", … (None: a server)
            "conversation": conversation.id if saving else None,
            "reply": done.reply,
            "finish_reason": done.finish_reason,
            "stats": stats,
        }
        if done.error:
            record["error"] = done.error
        if scored is not None:
            record["logprobs"] = scored
        if calls:
            record["tool_calls"] = calls
        sys.stdout.write(shown_json(json.dumps(record, ensure_ascii=False)) + "\n")
    elif pieces and not pieces[-1].endswith("\n"):
        out.write("\n")
    out.flush()
    if done.finish_reason == FinishReason.CANCELLED:  # Ctrl+C: leave now (the next -c prefills the reply)
        if show_stats and done.stats is not None:
            say(done.stats.summary())
        return 130
    # After the reply's last line (a warning must not run on from it in a terminal); the reply
    # is in the store already, so a cache that cannot be written costs only the next -c a prefill.
    not_saved = save_kv(engine, session, kv) if saving else None
    if not_saved:
        say(f"chatcli: warning: the KV cache was not saved ({not_saved}); the next -c prefills again")
    if show_stats:
        say(done.stats.summary())
    if (
        scored == [] and done.reply and not getattr(engine, "keeps_cache", True)
    ):  # --api: a server refused them, or ignored them
        say("chatcli: warning: the server sent no logprobs")
    if start.params.response_format is not None and done.finish_reason == FinishReason.LENGTH:
        say("chatcli: error: the reply reached --max-tokens before its JSON was complete")
        return 1
    if done.error:  # a stream cut mid-reply: what came is printed and saved, the exit says it is partial
        say(f"chatcli: error: {done.error} (the reply above is partial)")
        return 1
    return 0


def tool_rounds(engine, conversation, session, start: StartOptions, toolbox, out, json_out: bool, accepted, save):
    """The model's replies until one is text: each reply with calls saved, each call printed on stderr
    and run with --allow-tools (else said not run), its result fed back. Returns (Finished or None,
    the last reply's pieces, the calls as --json lists them)."""
    from dataclasses import asdict

    from chatcli.chat.mcp import DENIED, Result
    from chatcli.chat.toolturn import (
        MAX_ROUNDS,
        NOT_ALLOWED_TEXT,
        HeldCalls,
        call_line,
        run_call,
        split_reply,
        stopped,
        syntax_of,
        told,
    )
    from chatcli.engine import FinishReason

    syntax = syntax_of(engine)
    writer = None if json_out else HeldCalls(out, syntax)
    listed: list[dict] = []
    for round_ in range(MAX_ROUNDS + 1):
        params = toolbox.params(start.params) if round_ < MAX_ROUNDS else start.params  # the last: text only
        done, pieces = stream_reply(engine, conversation, session, params, writer, None, accepted)
        accepted()
        if writer is not None:
            writer.finish()
        if done is None or done.finish_reason == FinishReason.CANCELLED:  # Ctrl+C: no call runs
            return done, pieces, listed
        text, calls = split_reply(done.reply, syntax)
        if not calls or round_ == MAX_ROUNDS:
            return done, pieces, listed
        if writer is not None and writer.wrote and not writer.wrote.endswith("\n"):
            out.write("\n")  # the reply's words so far, then the calls' lines on stderr
            out.flush()
        save(conversation.add_reply(text, done.finish_reason, done.stats.to_dict(), calls), asdict(start.params))
        answered = 0
        try:
            for call in calls:
                if start.allow_tools:
                    say(f"chatcli: tool: {call_line(call)}")
                    result = run_call(toolbox.hub, call)
                    say(f"chatcli: tool {call['name']}: {told(result)}")
                else:
                    result = Result(NOT_ALLOWED_TEXT, DENIED)
                    say(f"chatcli: tool call not run (--allow-tools runs it): {call_line(call)}")
                save(conversation.add_result(call, result.text, result.status))
                listed.append({**call, "status": result.status, "result": result.text})
                answered += 1
        except KeyboardInterrupt:  # Ctrl+C in a call: the calls left answer as stopped, so -c resumes a whole turn
            cut = stopped()
            for call in calls[answered:]:
                save(conversation.add_result(call, cut.text, cut.status))
            raise
    raise AssertionError("unreachable")
