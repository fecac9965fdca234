"""A model's chat template, rendered bounded: in jinja2's sandbox, within a time and an output limit,
stopped by a cancel flag, every fault one line.

A chat template comes with the model's files, so it is untrusted code. `compile_template` builds it in
the sandbox transformers renders chat templates in (same options, same helpers), plus size checks on
the operators that can build a huge value in one step (`'x' * 20000000000`, `2 ** 10**10`);
`render_bounded` renders it piece by piece (`Template.generate`), stopping past
`TEMPLATE_OUTPUT_LIMIT` characters; `bounded` runs a render (ours, or transformers'
`apply_chat_template`) under `TEMPLATE_TIME_LIMIT_S` and a cancel flag.

How a render is stopped. A template's loops are Python loops in the thread that renders (nested
`range(100000)` loops that write nothing, or loops over a long message's characters), so no check
inside the sandbox can see them all. One watchdog thread (started on first use, asleep while no
render runs) looks at each render in progress every `TICK_S` seconds; past its deadline, or once its
cancel flag is set, it raises an exception in the rendering thread with
`PyThreadState_SetAsyncExc`, which Python delivers at the thread's next bytecode step (a loop's
every round). A lock per render orders that shot against the render's end: the watchdog fires only
while the render is marked running, and the render, marking itself done under the same lock, takes
back a shot not yet delivered — so the exception never lands in the caller's code. The exception is
a BaseException, so no `except Exception` inside jinja2 or a template's helpers swallows it.
What this cannot stop: one C call that runs long (a huge `*` is refused before it runs, for that
reason) — it is stopped when that call returns.

Faults. Whatever a render raises — `raise_exception(...)`, an `{% include %}` (no loader), a sandbox
refusal (`''.__class__`), a macro that recurses (RecursionError), a MemoryError, an undefined name —
becomes one `ChatTemplateError` naming it and the template's line; a cancel, `PromptCancelled`.

Stdlib only at import (jinja2 and ctypes on first use): `chatcli.engine` exports `ChatTemplateError`.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable

TEMPLATE_TIME_LIMIT_S = 10.0  # one render, at most (a long conversation renders in milliseconds)
TEMPLATE_OUTPUT_LIMIT = 1 << 25  # characters one render may write (32 Mi: more than any context holds)
TICK_S = 0.05  # how often the watchdog looks at the renders in progress: a cancel lands within it
_INT_BITS = 1 << 16  # the largest integer a template's `*` or `**` may make (templates count, never compute)


class ChatTemplateError(ValueError):
    """The model's chat template failed on these messages (one line: what it did, and where)."""


class RenderTooLong(ChatTemplateError):
    """The chat template wrote more than `TEMPLATE_OUTPUT_LIMIT` characters: more than any context
    holds (`Engine.fit_prompt` reads it as a conversation that does not fit)."""


class PromptCancelled(Exception):
    """The turn was cancelled while its prompt was templated (`Engine.fit_prompt`'s `cancel`)."""


# -- the sandbox ----------------------------------------------------------------


def compile_template(source: str):
    """The template in the sandbox transformers renders chat templates in (jinja2 >= 3.1.6, immutable,
    trim_blocks and lstrip_blocks, loop controls, a tojson that keeps non-ASCII text, and the helpers
    templates call: raise_exception, strftime_now, dict, namespace), with `*` and `**` refused where
    their result would pass `TEMPLATE_OUTPUT_LIMIT` items or `_INT_BITS` bits. A syntax error raises
    ChatTemplateError."""
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the chat template does not parse at line {exc.lineno}: {exc.message}") from exc


@functools.cache
def _environment():
    from datetime import datetime

    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Namespace(jinja2.utils.Namespace):  # no underscore attributes: no way to CPython internals
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")

    class Dict:  # dict() and dict.fromkeys() for templates, without the type itself
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class Generation(
        jinja2.ext.Extension
    ):  # `{% generation %}` marks assistant text for training masks: rendered as is
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Sandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator, left, right):
            too_big = _repeat_size(left, right) if operator == "*" else _power_size(left, right)
            if too_big:
                raise jinja2.exceptions.SecurityError(f"{_shown(left)} {operator} {_shown(right)} {too_big}")
            return super().call_binop(context, operator, left, right)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(
        raise_exception=raise_exception,
        strftime_now=lambda fmt: datetime.now().strftime(fmt),
        dict=Dict(),
        namespace=Namespace,
    )
    return env


def _repeat_size(left, right) -> str:
    """Why `left * right` is refused ('' where it is not): a sequence repeated past the output limit,
    or integers past `_INT_BITS`."""
    for seq, n in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > TEMPLATE_OUTPUT_LIMIT:
            return f"would make {len(seq) * n:,} items (at most {TEMPLATE_OUTPUT_LIMIT:,})"
    if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > _INT_BITS:
        return f"would pass {_INT_BITS:,} bits"
    return ""


def _power_size(base, exponent) -> str:
    """Why `base ** exponent` is refused ('' where it is not): an integer past `_INT_BITS`."""
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if abs(base).bit_length() * exponent > _INT_BITS:
            return f"would pass {_INT_BITS:,} bits"
    return ""


def _shown(value) -> str:
    """An operand in a refusal: as written where short, else its type and length."""
    text = repr(value)
    return text if len(text) <= 24 else f"a {type(value).__name__} of {len(value):,}"


@functools.lru_cache(maxsize=16)
def literal_text(source: str) -> str:
    """The template's literal strings (its text between tags, its string constants) joined with NUL, so
    that no search matches across two: where it writes its own control tokens (as transformers'
    `_get_template_literal_text`). '' for a template that does not parse."""
    import jinja2
    import jinja2.nodes

    try:
        ast = _environment().parse(source)
    except jinja2.exceptions.TemplateSyntaxError:
        return ""
    literals = {node.data for node in ast.find_all(jinja2.nodes.TemplateData)}
    literals |= {node.value for node in ast.find_all(jinja2.nodes.Const) if isinstance(node.value, str)}
    return "\0".join(sorted(literals))


# -- one render, bounded ----------------------------------------------------------


def render_bounded(template, context: dict, cancel: threading.Event | None = None) -> str:
    """`template` (from `compile_template`) rendered with `context`, piece by piece: RenderTooLong past
    `TEMPLATE_OUTPUT_LIMIT` characters; under `bounded`'s time limit and cancel flag."""

    def pieces() -> str:
        out, size = [], 0
        for piece in template.generate(**context):
            size += len(piece)
            if size > TEMPLATE_OUTPUT_LIMIT:
                raise _too_long()
            out.append(piece)
        return "".join(out)

    return bounded(pieces, cancel)


def _too_long() -> RenderTooLong:
    return RenderTooLong(f"the chat template wrote more than {TEMPLATE_OUTPUT_LIMIT:,} characters")


def bounded(render: Callable[[], str], cancel: threading.Event | None = None) -> str:
    """The text `render()` returns, stopped past `TEMPLATE_TIME_LIMIT_S` (ChatTemplateError) or within
    `TICK_S` of `cancel` being set (PromptCancelled); any other fault it raises, one ChatTemplateError;
    a text past `TEMPLATE_OUTPUT_LIMIT` characters, RenderTooLong."""
    if cancel is not None and cancel.is_set():
        raise PromptCancelled("the request was cancelled while its prompt was templated")
    job = _Render(cancel)
    try:
        try:
            _WATCHDOG.watch(job)  # from here on a shot may land: inside these try blocks
            text = render()
        finally:
            job.finish()
    except _Stopped:
        job.finish()  # a shot that landed in the first finish(): now done
        if job.reason == "cancelled":
            raise PromptCancelled("the request was cancelled while its prompt was templated") from None
        raise ChatTemplateError(f"the chat template took longer than {TEMPLATE_TIME_LIMIT_S:g} s") from None
    except (ChatTemplateError, PromptCancelled):
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the template did, one line naming it
        raise ChatTemplateError(f"the chat template failed{_where(exc)}: {_fault(exc)}") from exc
    if len(text) > TEMPLATE_OUTPUT_LIMIT:  # a render that could not stop sooner (transformers')
        raise _too_long()
    return text


def _fault(exc: BaseException) -> str:
    """What went wrong, in one line: a template's own message (raise_exception, a sandbox refusal, an
    undefined name) as it is, anything else with its type (RecursionError, MemoryError, TypeError)."""
    import jinja2

    from chatcli.errors import clip, one_line

    text = one_line(exc)
    if not isinstance(exc, jinja2.exceptions.TemplateError) and text != type(exc).__name__:
        text = f"{type(exc).__name__}: {text}"
    return clip(text, 240)


def _where(exc: BaseException) -> str:
    """' at line N': the template's line where `exc` was raised (jinja2 rewrites a failed render's
    traceback to the template's lines), or '' where no frame says."""
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" at line {line}" if line else ""


class _Stopped(BaseException):
    """Raised into a rendering thread by the watchdog (not an Exception: nothing a template runs catches it)."""


class _Render:
    """One render in progress: its thread, deadline and cancel flag. `lock` orders the watchdog's shot
    (`stop`) against the render's end (`finish`)."""

    def __init__(self, cancel: threading.Event | None) -> None:
        self.thread = threading.get_ident()
        self.deadline = time.monotonic() + TEMPLATE_TIME_LIMIT_S
        self.cancel = cancel
        self.lock = threading.Lock()
        self.done = False
        self.reason = ""  # why the watchdog stopped it: "cancelled" or "timeout"

    def stop(self, reason: str) -> None:
        """The watchdog's thread: raise _Stopped in the rendering thread, once, while it still renders."""
        with self.lock:
            if not self.done and not self.reason:
                self.reason = reason
                _async_raise(self.thread, _Stopped)

    def finish(self) -> None:
        """The rendering thread: done; a shot fired but not yet delivered is taken back."""
        with self.lock:
            if not self.done:
                self.done = True
                if self.reason:
                    _async_raise(self.thread, None)


def _async_raise(thread: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in `thread` at its next bytecode step (None: forget one set and not yet raised)."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exc) if exc else None)


class _Watchdog:
    """One daemon thread for the whole process: every `TICK_S` while renders run, it stops the ones past
    their deadline or cancelled; with none, it sleeps until the next begins."""

    def __init__(self) -> None:
        self.renders: list[_Render] = []
        self.wake = threading.Condition()
        self.thread: threading.Thread | None = None

    def watch(self, job: _Render) -> None:
        with self.wake:
            self.renders.append(job)
            if self.thread is None or not self.thread.is_alive():  # first use (or a forked child)
                self.thread = threading.Thread(target=self._run, name="chat-template-watchdog", daemon=True)
                self.thread.start()
            if len(self.renders) == 1:
                self.wake.notify()

    def _run(self) -> None:
        while True:
            with self.wake:
                self.renders = [job for job in self.renders if not job.done]
                while not self.renders:
                    self.wake.wait()
                running = list(self.renders)
            now = time.monotonic()
            for job in running:
                if job.cancel is not None and job.cancel.is_set():
                    job.stop("cancelled")
                elif now >= job.deadline:
                    job.stop("timeout")
            time.sleep(TICK_S)


_WATCHDOG = _Watchdog()
