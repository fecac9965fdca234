"""The generation process: an `Engine` of its own — the model, the kernel, the sessions and their KV
caches — whose turns stream their events over a pipe (`pipe.py`) to the front end that started it
(`proxy.ProcessEngine`, the TUI's): a front end's drawing never holds this process's GIL, so the
decode loop never waits for it.

    python -m chatcli.engine.process.host FD    # FD: this end of the socket pair; started by the proxy

Two threads. The engine thread loads the model, then runs every call that reads or changes a session
(`SESSION_CALLS`: a turn, a crop, a fork, a save, a restore) one after the other, as the front end's
one turn thread did: the kernel's OpenMP team stays on one thread, and no two calls share a cache. The
main thread reads the pipe: it sets a turn's cancel event the moment `cancel` comes (the decode loop
stops at its next step), answers the quick calls itself (`QUICK_CALLS`: the tokenizer's, the sampling
check), so a slash command never waits for a reply that streams, and queues the rest. A turn's
events go out from the engine thread as they come, each with its session's cache size after it.
The pipe closing (the front end gone, killed) ends the process: at once while the model still loads (a
user who quits during a `/model` load does not leave a process converting a file behind), else after
the call it runs.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import sys
import threading
from multiprocessing.connection import Connection

from chatcli.engine.process.pipe import DONE, ERROR, EVENT
from chatcli.errors import one_line


class Host:
    SESSION_CALLS = ("load", "generate", "crop", "fork", "save", "restore")
    QUICK_CALLS = ("render", "decode_each", "check_params")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.engine = None
        self.sessions: dict[int, object] = {}  # the front end's session number -> Session
        self.cancels: dict[int, threading.Event] = {}  # a running turn's call number -> its cancel event
        self.work: queue.SimpleQueue = queue.SimpleQueue()
        self.loading = False  # the engine thread is in `load`: the front end leaving then ends this process at once
        self._send_lock = threading.Lock()

    # -- the pipe ------------------------------------------------------------------

    def send(self, call: int, kind: str, value) -> None:
        with self._send_lock:
            self.conn.send((call, kind, value))

    def serve(self) -> None:
        engine_thread = threading.Thread(target=self._run_calls, name="chatcli-engine")
        engine_thread.start()
        while True:
            try:
                call, method, args = self.conn.recv()
            except (EOFError, OSError):
                break
            if method == "exit":
                break
            if method == "cancel":
                event = self.cancels.get(args[0])
                if event is not None:
                    event.set()
            elif method == "drop":
                self.work.put((0, "drop", args))  # on the engine thread: the session may be in a turn's hands
            elif method in self.QUICK_CALLS:
                self._answer(call, method, args)
            else:
                if method == "generate":
                    self.cancels[call] = threading.Event()  # before the turn starts: a cancel may come first
                self.work.put((call, method, args))
        if self.loading:  # nothing to save yet, and a load can run for minutes: a cache it wrote is renamed in whole
            os._exit(0)
        for event in list(self.cancels.values()):
            event.set()
        self.work.put(None)
        engine_thread.join()

    def _run_calls(self) -> None:
        while (item := self.work.get()) is not None:
            self._answer(*item)

    def _answer(self, call: int, method: str, args: tuple) -> None:
        try:
            result = getattr(self, f"call_{method}")(call, *args)
        except BaseException as exc:  # noqa: BLE001 - every fault goes back to the caller, as itself
            if call:
                self._send_quietly(call, ERROR, portable(exc))
        else:
            if call:
                self._send_quietly(call, DONE, result)
        finally:
            self.cancels.pop(call, None)

    def _send_quietly(self, call: int, kind: str, value) -> None:
        try:
            self.send(call, kind, value)
        except (OSError, ValueError):  # the front end has gone: the main thread ends the process
            pass

    # -- the calls ------------------------------------------------------------------

    def session(self, number: int):
        if number not in self.sessions:
            self.sessions[number] = self.engine.new_session()
        return self.sessions[number]

    def size(self, number: int) -> tuple[int, int]:
        cache = self.session(number).cache
        return len(cache), cache.nbytes

    def call_load(self, call: int, model, load, config_default) -> dict:
        from chatcli.engine.load.build import load_engine

        def status(text: str, done: int | None = None, total: int | None = None) -> None:
            self.send(call, EVENT, (text, done, total))

        self.loading = True
        try:
            self.engine = engine = load_engine(model, load, config_default=config_default, status=status)
        finally:
            self.loading = False
        runner, tokenizer = engine.runner, engine.tokenizer
        return {
            "name": engine.name,
            "template": engine.template,
            "device": engine.device,
            "weights": engine.weights,
            "runner": type(runner).__name__,
            "note": engine.note,
            "context_limit": engine.context_limit,
            "kernel": getattr(runner, "kernel", None),
            "exact_verify": runner.exact_verify,
            "tool_syntax": getattr(tokenizer, "tool_syntax", None),
            "vocab_size": tokenizer.vocab_size,
        }

    def call_generate(self, call: int, number: int, messages: list, params, cancelled: bool) -> None:
        """A turn; `cancelled`: its cancel was set before it was sent (it ends before its first step)."""
        if cancelled:
            self.cancels[call].set()
        session = self.session(number)
        for event in self.engine.generate(messages, session, params, self.cancels[call]):
            self.send(call, EVENT, (event, len(session.cache), session.cache.nbytes))

    def call_crop(self, call: int, number: int, messages: list) -> tuple[int, int, int]:
        kept = self.engine.crop_session(self.session(number), messages)
        return (kept, *self.size(number))

    def call_fork(self, call: int, number: int, new: int, keep: int) -> tuple[int, int]:
        from chatcli.engine.kv.pool import fork_session

        self.sessions[new] = fork_session(self.session(number), keep)
        return self.size(new)

    def call_save(self, call: int, number: int, path) -> bool:
        return self.engine.save_session(self.session(number), path)

    def call_restore(self, call: int, number: int, path) -> tuple[bool, int, int]:
        restored = self.engine.restore_session(self.session(number), path)
        return (restored, *self.size(number))

    def call_drop(self, call: int, number: int) -> None:
        self.sessions.pop(number, None)

    def call_render(self, call: int, messages: list) -> str:
        return self.engine.tokenizer.render(messages)

    def call_decode_each(self, call: int, ids: list[int], skip_special_tokens: bool = False) -> list[str]:
        decode = self.engine.tokenizer.decode
        return [decode([i], skip_special_tokens=skip_special_tokens) for i in ids]

    def call_check_params(self, call: int, params) -> None:
        self.engine.check_params(params)


def portable(exc: BaseException) -> BaseException:
    """`exc` where it survives the pipe as itself (type and message), else a RuntimeError with its one line."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any exception that does not round-trip
        return RuntimeError(one_line(exc))


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the front end's to handle (it cancels a turn)
    Host(Connection(int(sys.argv[1]))).serve()


if __name__ == "__main__":
    main()
