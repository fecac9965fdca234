"""Keys typed while the TUI starts (before Textual sets the terminal's mode) keep what they are:
an Enter stays an Enter (the terminal's line editing made it a newline, Ctrl+J), nothing is echoed."""

import os
import select
import termios

import pytest

from chatcli.ui.typeahead import hold_typeahead, restore

pty = pytest.importorskip("pty")


def typed(master: int, slave: int, keys: bytes) -> tuple[bytes, bytes]:
    """What the program reads of `keys` typed on the terminal, and what the terminal echoed."""
    os.write(master, keys)
    select.select([slave], [], [], 2)
    read = os.read(slave, 100)
    echo = os.read(master, 100) if select.select([master], [], [], 0.2)[0] else b""
    return read, echo


def test_an_enter_typed_while_the_tui_starts_stays_an_enter():
    master, slave = pty.openpty()
    try:
        cooked = termios.tcgetattr(slave)
        assert typed(master, slave, b"hi\r") == (b"hi\n", b"hi\r\n")  # the terminal's own mode: Enter became \n
        saved = hold_typeahead(slave)
        assert saved == cooked
        assert typed(master, slave, b"Say hello.\r") == (b"Say hello.\r", b"")  # as typed, not echoed
        restore(saved, slave)
        assert termios.tcgetattr(slave) == cooked
    finally:
        os.close(master)
        os.close(slave)


def test_not_a_terminal_is_left_alone(tmp_path):
    with open(tmp_path / "f", "w") as f:
        assert hold_typeahead(f.fileno()) is None
    restore(None)  # nothing to give back
