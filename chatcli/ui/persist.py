"""What the TUI remembers between runs: prompt history (user data dir) and the theme (config file).

No Textual imports: plain files, unit-tested on their own.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from chatcli.paths import data_dir

HISTORY_LIMIT = 1000


class PromptHistory:
    """Earlier prompts, oldest first, one JSON string per line; Up/Down walk it like a shell."""

    def __init__(self, path: Path | None = None, limit: int = HISTORY_LIMIT) -> None:
        self.path = path if path is not None else data_dir() / "history.jsonl"
        self.limit = limit
        self.entries: list[str] = self._read()
        self._index = len(self.entries)  # == len(entries): at the draft, past the newest entry
        self._draft = ""

    def _read(self) -> list[str]:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            return []
        entries = []
        for line in lines:
            try:
                value = json.loads(line)
            except ValueError:
                continue  # a damaged line loses one entry, not the history
            if isinstance(value, str) and value:
                entries.append(value)
        return entries[-self.limit :]

    def add(self, text: str) -> None:
        if not text.strip():
            return
        if not self.entries or self.entries[-1] != text:
            self.entries.append(text)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(text) + "\n")
                if len(self.entries) > 2 * self.limit:
                    self.entries = self.entries[-self.limit :]
                    self.path.write_text("".join(json.dumps(e) + "\n" for e in self.entries), encoding="utf-8")
            except OSError:
                pass  # history is a convenience: never fail a prompt over it
        self.reset()

    def reset(self) -> None:
        self._index = len(self.entries)
        self._draft = ""

    def older(self, current: str) -> str | None:
        """The entry before the one shown (saving the draft on the first step); None at the oldest."""
        if self._index == 0 or not self.entries:
            return None
        if self._index == len(self.entries):
            self._draft = current
        self._index -= 1
        return self.entries[self._index]

    def newer(self) -> str | None:
        """The entry after the one shown, then the saved draft; None when already at the draft."""
        if self._index >= len(self.entries):
            return None
        self._index += 1
        return self._draft if self._index == len(self.entries) else self.entries[self._index]


_TABLE = re.compile(r"^\s*\[")
_THEME_LINE = re.compile(r"^\s*theme\s*=")


def remember_theme(name: str, path: Path | None = None) -> None:
    """Set the top-level `theme` key in the TOML config, keeping the rest of the user's file as it is."""
    from chatcli.config import config_path

    path = path or config_path()
    line = f"theme = {json.dumps(name)}\n"
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except FileNotFoundError:
        lines = []
    top_end = next((i for i, text in enumerate(lines) if _TABLE.match(text)), len(lines))
    for i in range(top_end):
        if _THEME_LINE.match(lines[i]):
            lines[i] = line
            break
    else:
        lines.insert(0, line)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines), encoding="utf-8")
