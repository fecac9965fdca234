"""`ProcessEngine`: the in-process engine's API (`ChatEngine`, and the session calls the TUI makes) over
a generation process of its own (`host.py`), where the model, the kernel and every session's KV cache
live. The front end keeps only numbers: a `ProcessSession` is a session's number in the host and its
cache's size (`CacheSize`: what the pool weighs and the panels show), updated by every event and call.

Why: a TUI draws on its UI thread, which holds the GIL while it lays a reply out; the decode loop's
Python (sampling, detokenizing, events) then waited for it, on a busy machine for as long as the
scheduler kept the UI thread off its core. Apart, the two processes wait for nothing of each other's
but a pipe's write. The model's pages are memory-mapped: a second process maps the same file, and the
front end loads no model at all.

Cancel: `generate`'s `cancel` event, once set, is sent to the host at once (a thread waits on it for
each turn), and the host's decode loop stops at its next step. A session the front end lets go of (the
pool evicted it, a conversation was deleted) is dropped in the host too (`weakref.finalize`). The host
ends when its engine is collected or at exit; where it ends by itself (killed, out of memory), every
call raises `ProcessLost` with one line, and a turn fails with it, as any other fault would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from socket import socketpair

from chatcli.engine.events import Event
from chatcli.engine.params import SamplingParams
from chatcli.engine.process.pipe import Channel, ProcessLost
from chatcli.errors import one_line

EXIT_WAIT_S = 5.0  # for the host to end after `exit` (a KV cache being written), then it is killed


class CacheSize:
    """What the front end knows of a session's KV cache: its tokens (`len`) and bytes, as of the last event."""

    def __init__(self, tokens: int = 0, nbytes: int = 0) -> None:
        self.tokens, self.nbytes = tokens, nbytes

    def __len__(self) -> int:
        return self.tokens


class ProcessSession:
    """A session of the generation process: its number there, and its cache's size."""

    def __init__(self, channel: Channel, number: int, size: tuple[int, int] = (0, 0)) -> None:
        self.number = number
        self.cache = CacheSize(*size)
        weakref.finalize(self, channel.drop, number).atexit = False

    def sized(self, size: tuple[int, int]) -> None:
        self.cache.tokens, self.cache.nbytes = size


class ProcessTokenizer:
    """The tokenizer calls the TUI makes (the chat template's prompt, token names), answered by the host."""

    def __init__(self, channel: Channel, tool_syntax, vocab_size: int) -> None:
        self._channel = channel
        self.tool_syntax = tool_syntax
        self.vocab_size = vocab_size

    def render(self, messages: Sequence[dict]) -> str:
        return self._channel.call("render", list(messages))

    def decode_each(self, ids: Sequence[int], skip_special_tokens: bool = False) -> list[str]:
        """Each id's text on its own (special tokens spelled, or left out as a reply prints them), in one call."""
        return self._channel.call("decode_each", list(ids), skip_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if len(ids) == 1:
            return self.decode_each(ids, skip_special_tokens)[0]
        raise NotImplementedError("ProcessTokenizer decodes single ids")


class _Runner:
    """What a front end reads of the runner: the kernel's build, for the header."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel


class ProcessEngine:
    keeps_cache = True  # the host keeps the sessions' caches: their sizes are known, they are saved

    def __init__(self, process: subprocess.Popen, channel: Channel, info: dict) -> None:
        self._process, self._channel = process, channel
        self.name, self.device, self.weights = info["name"], info["device"], info["weights"]
        self.template = info["template"]  # the chat template, as the header names it ("model's own", "raw")
        self.backend = f"generation process (pid {process.pid}, {info['runner']})"  # /backend
        self.note = info["note"]
        self.context_limit = info["context_limit"]
        self._exact_verify = info["exact_verify"]
        self.runner = _Runner(info["kernel"])
        self.tokenizer = ProcessTokenizer(channel, info["tool_syntax"], info["vocab_size"])
        self._numbers = iter(range(1, sys.maxsize))
        self._closer = weakref.finalize(self, _shut, process, channel)

    @property
    def lost(self) -> bool:
        """The generation process has ended (a crash, a kill): every call fails; load a model again."""
        return self._process.poll() is not None

    @classmethod
    def start(cls, model: str | None, load, config_default: str | None = None, status=None) -> ProcessEngine:
        """Start a generation process and load the model there (`load_engine`'s arguments); LoadError (one
        line) where it cannot, as in process."""
        ours, theirs = socketpair()
        stderr = tempfile.TemporaryFile()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "chatcli.engine.process.host", str(theirs.fileno())],
                env=_importing_chatcli(),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                # The front end's session (it ignores SIGINT: Ctrl+C is the front end's). Not a session of its
                # own: with the kernel's autogroups, one decoded slower beside a busy machine (tmux, 140x45,
                # the story: 33-88 tok/s, against 62-124 in the front end's session).
            )
        finally:
            theirs.close()
        channel = Channel(Connection(os.dup(ours.fileno())), lambda: _why_ended(process, stderr))
        ours.close()
        try:
            replies = channel.replies(*channel.open("load", model, load, config_default))
            while True:
                try:
                    step = next(replies)
                except StopIteration as done:
                    info = done.value
                    break
                if status is not None:
                    status(*step)
        except BaseException:
            _shut(process, channel)
            raise
        return cls(process, channel, info)

    # -- the ChatEngine protocol -------------------------------------------------------

    def models(self) -> list[str]:
        return [self.name]

    def new_session(self) -> ProcessSession:
        """A new session: made in the host on its first call."""
        return ProcessSession(self._channel, next(self._numbers))

    def lookup_for(self, params: SamplingParams) -> int:
        return params.lookup if self._exact_verify else 0

    def check_params(self, params: SamplingParams) -> None:
        self._channel.call("check_params", params)

    def generate(
        self,
        messages: Sequence[dict],
        session: ProcessSession,
        params: SamplingParams | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        params, stopped = params or SamplingParams(), cancel is not None and cancel.is_set()
        call, queued = self._channel.open("generate", session.number, list(messages), params, stopped)
        done = threading.Event()
        if cancel is not None:
            threading.Thread(target=self._forward_cancel, args=(cancel, done, call), daemon=True).start()
        try:
            for event, tokens, nbytes in self._channel.replies(call, queued):
                session.cache.tokens, session.cache.nbytes = tokens, nbytes
                yield event
        except GeneratorExit:
            self._channel.tell("cancel", call)  # a turn given up on stops there too
            raise
        finally:
            done.set()

    def _forward_cancel(self, cancel: threading.Event, done: threading.Event, call: int) -> None:
        while not done.is_set():
            if cancel.wait(0.05):
                self._channel.tell("cancel", call)
                return

    def crop_session(self, session: ProcessSession, messages: Sequence[dict]) -> int:
        kept, *size = self._channel.call("crop", session.number, list(messages))
        session.sized(size)
        return kept

    def fork_session(self, session: ProcessSession, keep: int) -> ProcessSession:
        """A new session holding a copy of the first `keep` ids of `session`'s cache (`kv.pool.fork_session`)."""
        number = next(self._numbers)
        size = self._channel.call("fork", session.number, number, keep)
        return ProcessSession(self._channel, number, size)

    def save_session(self, session: ProcessSession, path: Path) -> bool:
        return self._channel.call("save", session.number, path)

    def restore_session(self, session: ProcessSession, path: Path) -> bool:
        restored, *size = self._channel.call("restore", session.number, path)
        session.sized(size)
        return restored

    def close(self) -> None:
        """End the generation process (after the call it is running)."""
        self._closer()


def _importing_chatcli() -> dict[str, str]:
    """The environment for the process: this one's, where `python -m` finds this very chatcli (a source
    checkout run with `python -m chatcli` from elsewhere, or with PYTHONPATH, as well as an installed one)."""
    root = Path(__file__).resolve().parents[3]  # the folder chatcli is imported from
    env = dict(os.environ)
    if root.name not in ("site-packages", "dist-packages"):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    return env


def _shut(process: subprocess.Popen, channel: Channel) -> None:
    channel.tell("exit")
    channel.close()
    try:
        process.wait(EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _why_ended(process: subprocess.Popen, stderr) -> str:
    """One line: how the generation process ended, and the last line it wrote to stderr."""
    try:
        code = process.wait(1.0)
    except subprocess.TimeoutExpired:
        code = None
    try:
        stderr.seek(0)
        lines = [line for line in stderr.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except (OSError, ValueError):
        lines = []
    how = "its pipe closed" if code is None else f"signal {-code}" if code < 0 else f"exit status {code}"
    last = f": {one_line(Exception(lines[-1]))}" if lines else ""
    return f"the generation process ended ({how}){last}"


__all__ = ["ProcessEngine", "ProcessLost", "ProcessSession"]
