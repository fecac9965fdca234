"""Themes: chatcli's own Textual CSS files (`themes/*.tcss`) and Textual's built-in colour themes.

A shipped theme is a `.tcss` file whose rules are scoped under the app class
`-theme-<name>` (so every file can be loaded at start-up and switching is a class
toggle), plus the Textual colour theme it builds on, named in its first comment:
`/* chatcli theme: light — base: textual-light */`. The files live in
`chatcli/themes` in an installed wheel, and in `themes/` at the top of the source tree.
"""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_THEME = "dark"
_BASE = re.compile(r"base:\s*([\w-]+)")


def theme_dir() -> Path:
    package = Path(__file__).resolve().parent.parent  # chatcli/
    for candidate in (package / "themes", package.parent / "themes"):
        if candidate.is_dir():
            return candidate
    return package / "themes"


def shipped_themes() -> dict[str, Path]:
    """name → .tcss file of every theme chatcli ships."""
    folder = theme_dir()
    return {p.stem: p for p in sorted(folder.glob("*.tcss"))} if folder.is_dir() else {}


def base_theme(path: Path) -> str:
    """The Textual colour theme a shipped theme builds on (textual-dark when the file names none)."""
    try:
        head = path.read_text(encoding="utf-8")[:400]
    except OSError:
        return "textual-dark"
    found = _BASE.search(head)
    return found.group(1) if found else "textual-dark"


def high_contrast_palette():
    """A black-and-white Textual colour theme with saturated accents, for the high-contrast theme."""
    from textual.theme import Theme

    return Theme(
        name="chatcli-high-contrast",
        primary="#ffff00",
        secondary="#00ffff",
        accent="#ff00ff",
        foreground="#ffffff",
        background="#000000",
        surface="#000000",
        panel="#000000",
        boost="#333333",
        warning="#ffaa00",
        error="#ff4040",
        success="#00ff00",
        dark=True,
    )
