"""Files attached to a message: `-f FILE` on the one-shot (repeatable, `-` for stdin) and `/file PATH`
in the TUI, as `llm -f` and aichat's `-f` attach them.

Each file's text goes before the message, under its name, in a fenced block (a fence longer than
any the file holds), so the model sees where each file starts and ends and what the question is.
A file is read whole, as UTF-8 text: a binary one (a NUL byte, or bytes that are not UTF-8) or
one over `MAX_BYTES` is refused in one line (`AttachError`), never cut or mangled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAX_BYTES = 1 << 20  # 1 MiB: ~250k tokens of text, already more than most contexts hold


class AttachError(ValueError):
    """A file that cannot be attached; the message names it and says why, in one line."""


@dataclass(frozen=True)
class Attachment:
    name: str  # as the user named it (`-` is "stdin")
    text: str

    @property
    def lines(self) -> int:
        return self.text.count("\n") + (not self.text.endswith("\n") and bool(self.text))


def read_attachment(name: str, stdin: BinaryIO | None = None) -> Attachment:
    """The file `name` (`-`: `stdin`) as an attachment; AttachError for one that is missing,
    unreadable, binary or too large."""
    if name == "-":
        if stdin is None:
            raise AttachError("-f -: no standard input to read")
        data = stdin.read(MAX_BYTES + 1)
        name = "stdin"
    else:
        path = Path(name).expanduser()
        try:
            size = path.stat().st_size
            if path.is_dir():
                raise AttachError(f"{name}: is a folder, not a file")
            if size > MAX_BYTES:
                raise AttachError(f"{name}: {size:,} bytes is too large to attach (at most 1 MiB)")
            data = path.read_bytes()
        except OSError as exc:
            raise AttachError(f"{name}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise AttachError(f"{name}: over {MAX_BYTES:,} bytes, too large to attach (at most 1 MiB)")
    if b"\0" in data:
        raise AttachError(f"{name}: not a text file (it holds binary data)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AttachError(f"{name}: not a UTF-8 text file (byte {exc.start})") from None
    return Attachment(name, text)


ATTACHED = re.compile(r"([^\n`]+):\n(`{3,})\n.*?\n\2(?:\n\n|$)", re.DOTALL)  # one block `with_attachments` wrote


def split_attachments(message: str) -> tuple[list[str], str]:
    """(the names of the files attached at the start of `message`, the text after them): what a
    title is made of (the user's words, not the first file's)."""
    names = []
    while (found := ATTACHED.match(message)) is not None:
        names.append(found.group(1))
        message = message[found.end() :]
    return names, message


def fence_for(text: str) -> str:
    """A code fence longer than any run of backticks in `text` (at least three)."""
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=2)
    return "`" * (longest + 1)


def with_attachments(text: str, attachments: list[Attachment] | tuple[Attachment, ...]) -> str:
    """The message as the model gets it: each file under its name in a fenced block, then `text`."""
    blocks = []
    for a in attachments:
        fence = fence_for(a.text)
        blocks.append(f"{a.name}:\n{fence}\n{a.text.rstrip(chr(10))}\n{fence}")
    return "\n\n".join([*blocks, text] if text else blocks)
