"""Errors every front end shares: the one-line message a user sees, and the error that carries it; and
`clip`, any text as one such line.

Below the front ends (CLI, one-shot, TUI, server) and importable from the engine: stdlib only.
"""

from __future__ import annotations


class UserError(Exception):
    """One line for the user, and the exit code the command line ends with (2: bad usage or values)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def clip(text: str, width: int) -> str:
    """`text` on one line (each run of whitespace one space), cut to `width` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"
