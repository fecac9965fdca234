"""Keys typed while the TUI starts keep what they are.

Until Textual puts the terminal in its own mode (a few tenths of a second after `chatcli`
starts: Python, then Textual's import), the terminal is in its line-editing mode: it echoes what
is typed and turns Enter into a newline as it receives it (ICRNL), so an Enter typed in that
time reached the prompt as Ctrl+J, a new line, not a send. `hold_typeahead()` switches the
line editing, the echo and that translation off as soon as the TUI is chosen (what is typed waits
for the app, unchanged); `restore(saved)` gives the terminal back as it was.

Nothing here imports Textual: `cli.py` calls it before that import.
"""

from __future__ import annotations

import atexit
import sys


def hold_typeahead(fd: int | None = None) -> list | None:
    """The terminal's settings as they were (for `restore`), or None where `fd` (stdin by default)
    is not a terminal whose settings can change."""
    try:
        import termios
    except ImportError:  # Windows: its console has no line discipline to fight
        return None
    fd = sys.stdin.fileno() if fd is None else fd
    try:
        saved = termios.tcgetattr(fd)
        held = termios.tcgetattr(fd)
        held[0] &= ~(termios.ICRNL | termios.INLCR | termios.IGNCR)  # iflag: Enter stays \r
        held[3] &= ~(termios.ICANON | termios.ECHO)  # lflag: no line editing, no echo
        held[6][termios.VMIN], held[6][termios.VTIME] = 1, 0
        termios.tcsetattr(fd, termios.TCSANOW, held)  # TCSANOW: what was typed stays to be read
    except (termios.error, OSError, ValueError):
        return None
    atexit.register(restore, saved, fd)  # also where the TUI never starts (an import fails)
    return saved


def restore(saved: list | None, fd: int | None = None) -> None:
    """The terminal's settings back as `hold_typeahead` found them."""
    if saved is None:
        return
    import termios

    atexit.unregister(restore)

    try:
        termios.tcsetattr(sys.stdin.fileno() if fd is None else fd, termios.TCSANOW, saved)
    except (termios.error, OSError, ValueError):
        pass
