"""What every front end shows a user: the one-line message of an error and the error that carries it;
`clip`, any text as one such line; `shown`, any text as a terminal may show it (`Shown`, a stream
that writes so; `say`, a line on stderr so); `counted`, a number of things in words.

Below the front ends (CLI, one-shot, TUI, server) and importable from the engine: stdlib only.
"""

from __future__ import annotations

import sys

# C0 controls but tab and newline, DEL and the C1 controls: what could start or end an escape
# sequence (ESC, CSI, OSC, ST), ring, clear or move the cursor (BEL, CR, BS) in a terminal.
_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0)) if code not in (0x09, 0x0A)}
# The same in JSON text, as JSON's own escapes (`json.dumps` escapes only the C0 controls).
_JSON_CONTROLS = {code: f"\\u{code:04x}" for code in range(0x7F, 0xA0)}


class UserError(Exception):
    """One line for the user, and the exit code the command line ends with (2: bad usage or values)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def shown(text: str) -> str:
    """`text` as a terminal may show it: each control character but newline and tab (C0, DEL, C1:
    ESC, BEL, CR, CSI …) written out as `\\x1b`, so that no escape sequence in what a model, a tool,
    a server or a saved message wrote can act on the terminal (set its title, write the clipboard,
    clear the screen). Per character, so text streamed in pieces is shown the same."""
    return text.translate(_CONTROLS)


def shown_json(text: str) -> str:
    """JSON text (`json.dumps`'s) with DEL and the C1 controls as `\\u0080` … too: the same JSON
    value, exact, that no terminal reads an escape sequence in."""
    return text.translate(_JSON_CONTROLS)


def clip(text: str, width: int) -> str:
    """`text` on one line as a terminal may show it (`shown`; each run of whitespace one space), cut
    to `width` characters with an ellipsis."""
    line = shown(" ".join(text.split()))
    return line if len(line) <= width else line[: width - 1] + "…"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 prompt`, `2 prompts`, `1,024 tokens`: a number and its noun, singular or plural (`plural`
    where adding an s does not make it)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


class Shown:
    """A text stream that writes what it is given as a terminal may show it (`errors.shown`)."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        self.stream.write(shown(text))

    def flush(self) -> None:
        self.stream.flush()


def reply_out(stdout):
    """Where a reply's text goes: `stdout` itself where it is a file or a pipe (byte-exact), `Shown`
    where it is a terminal."""
    return Shown(stdout) if stdout.isatty() else stdout


def say(line: str) -> None:
    """One line on stderr, as a terminal may show it."""
    sys.stderr.write(shown(line) + "\n")
    sys.stderr.flush()
