"""The slash commands that read or write a file: `/save FILE` (an export), `/load FILE` (an export
read back as a new conversation) and `/file PATH` (a text file attached to the next message,
`chat.attach`). Like every handler (`slash.py`), each sees the screen through `SlashTarget` only.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from chatcli.chat.attach import AttachError, read_attachment
from chatcli.chat.manager import ChatsError
from chatcli.errors import counted

if TYPE_CHECKING:
    from chatcli.ui.screens.slash_target import SlashTarget


async def save(screen: SlashTarget, arg: str) -> None:
    try:
        path = screen.chats.export(screen.conversation, arg)
    except ChatsError as exc:
        screen.note(f"/save: {exc}", error=True)
        return
    screen.note(f"saved {len(screen.conversation.messages)} messages to {path}")


async def load(screen: SlashTarget, arg: str) -> None:
    if screen.refuse_switch():
        return
    try:
        conv = screen.chats.import_file(arg)
    except ChatsError as exc:
        screen.note(f"/load: {exc}", error=True)
        return
    await screen.show_conversation(conv)
    screen.note(f"loaded {counted(len(conv.messages), 'message')} from {arg} as a new conversation")


async def attach(screen: SlashTarget, arg: str) -> None:
    """/file PATH: the file goes before your next message (as `-f` on the one-shot); bare: what is
    attached; off: drop it all."""
    pending = screen.attachments
    if not arg:
        listed = ", ".join(f"{a.name} ({a.lines} lines)" for a in pending)
        screen.note(f"attached to your next message: {listed}" if pending else "no file attached: /file PATH")
        return
    if arg == "off":
        screen.note(f"dropped {counted(len(pending), 'attached file')}" if pending else "no file attached")
        pending.clear()
        return
    try:
        found = await asyncio.to_thread(read_attachment, arg)  # a large file off the UI thread
    except AttachError as exc:
        screen.note(f"/file {exc}", error=True)
        return
    pending.append(found)
    screen.note(f"attached {found.name} ({found.lines} lines): it goes before your next message; /file off drops it")
