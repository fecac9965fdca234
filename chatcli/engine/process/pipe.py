"""The pipe between a front end's process and its generation process (`host.py`): calls, their replies,
and the events a call streams, as they come.

Messages are pickled tuples over a `multiprocessing.connection.Connection` on one end of a socket pair.
The front end sends `(call, method, args)`: `call` is a number it picks, unique while the call runs;
`method` one of the host's calls, or `cancel` / `drop` / `exit`, which have no reply. The
host answers `(call, kind, value)`: any number of `EVENT` (a status line while loading, a turn's
events), then one `DONE` (the method's return value) or one `ERROR` (the exception it raised: the
same type and message here, or a `RuntimeError` with its one line where it does not pickle).

`Channel` is the front end's side: a reader thread hands each message to the call it answers, so a
slash command's quick call (a tokenizer's, `check_params`) is answered while a turn streams. Where
the host goes away (it crashed, was killed, its pipe closed), every call waiting and every later one
raises `ProcessLost` with one line: the host's exit status and the last line it wrote to stderr.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection

EVENT, DONE, ERROR, LOST = "event", "done", "error", "lost"
READER_WAIT_S = 3.0  # a send that failed waits this long for the reader to say how the host ended


class ProcessLost(RuntimeError):
    """The generation process is gone; the message says how, in one line."""


class Channel:
    def __init__(self, conn: Connection, why_lost: Callable[[], str]) -> None:
        """`why_lost()`: the line `ProcessLost` says once the host has gone (its exit status, its last words)."""
        self._conn = conn
        self._why_lost = why_lost
        self._send_lock = threading.Lock()
        self._calls: dict[int, queue.SimpleQueue] = {}
        self._dropped: list[int] = []  # sessions let go of, not yet said (`drop`)
        self._ids = itertools.count(1)
        self.lost: str | None = None
        self._reader = threading.Thread(target=self._read, name="chatcli-generation-pipe", daemon=True)
        self._reader.start()

    # -- calls -------------------------------------------------------------------

    def call(self, method: str, *args):
        """Run `method` in the host and return what it returned (its events, if any, are dropped)."""
        replies = self.replies(*self.open(method, *args))
        while True:
            try:
                next(replies)
            except StopIteration as done:
                return done.value

    def open(self, method: str, *args) -> tuple[int, queue.SimpleQueue]:
        """Send a call; its number and the queue its replies come to, as (kind, value)."""
        call, replies = next(self._ids), queue.SimpleQueue()
        self._calls[call] = replies  # before the check: a reader that ends meanwhile tells it too
        if self.lost is not None:
            replies.put((LOST, self.lost))
        else:
            self._send((call, method, args), replies)
        return call, replies

    def replies(self, call: int, replies: queue.SimpleQueue) -> Iterator:
        """The events of `call` as they come; the generator returns the call's return value. Closing it
        early forgets the call (its later replies are dropped): the caller cancels it first where it runs on."""
        try:
            while True:
                kind, value = replies.get()
                if kind == EVENT:
                    yield value
                elif kind == DONE:
                    return value
                elif kind == ERROR:
                    raise value
                else:
                    raise ProcessLost(value)
        finally:
            self._calls.pop(call, None)

    def tell(self, method: str, *args) -> None:
        """A message without a reply (`cancel`, `exit`); nothing where the host has gone."""
        if self.lost is None:
            self._send((0, method, args), None)

    def drop(self, session: int) -> None:
        """The host may forget `session`: said with the next message. A finalizer calls it, which may run in
        the middle of a send on this very thread (the garbage collector): it must not send itself."""
        self._dropped.append(session)

    def _send(self, message: tuple, replies: queue.SimpleQueue | None) -> None:
        try:
            with self._send_lock:
                while self._dropped:
                    self._conn.send((0, "drop", (self._dropped.pop(),)))
                self._conn.send(message)
        except (OSError, ValueError) as exc:  # a closed pipe: the reader is about to learn why (EOF)
            if replies is None:
                return
            if threading.current_thread() is not self._reader:
                self._reader.join(READER_WAIT_S)  # so the line says how it ended, not "Broken pipe"
            replies.put((LOST, self.lost or f"the generation process is gone ({exc})"))

    # -- the reader ----------------------------------------------------------------

    def _read(self) -> None:
        while True:
            try:
                call, kind, value = self._conn.recv()
            except (EOFError, OSError):
                break
            replies = self._calls.get(call)
            if replies is not None:  # else a call given up on (a turn closed early): its late events go
                replies.put((kind, value))
        self.lost = self._why_lost()
        for replies in list(self._calls.values()):
            replies.put((LOST, self.lost))

    def close(self) -> None:
        try:
            self._conn.close()
        except OSError:
            pass
