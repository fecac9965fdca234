"""A conversation: the system prompt and the messages, as the user sees them.

Pure data: the engine's KV cache for it lives in an `engine.kv.session.Session` beside it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from chatcli.chat.attach import split_attachments


@dataclass
class Message:
    role: str  # "user" | "assistant"
    content: str
    finish_reason: str | None = None  # assistant replies: "stop" | "length" | "cancelled" | "error"
    stats: dict | None = None  # assistant replies: TurnStats.to_dict()


@dataclass
class Conversation:
    system: str | None = None
    messages: list[Message] = field(default_factory=list)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    name: str | None = None  # set by /rename; else the title comes from the first user message
    parent_id: str | None = None  # a branch (/edit): the conversation it was branched from
    fork_at: int | None = None  # a branch: the messages it shares with its parent (then its own)

    def branch(self, at: int) -> Conversation:
        """A new conversation holding copies of the first `at` messages, branched from this one."""
        copies = [Message(m.role, m.content, m.finish_reason, m.stats) for m in self.messages[:at]]
        return Conversation(system=self.system, messages=copies, parent_id=self.id, fork_at=at)

    def for_template(self) -> list[dict]:
        """The role/content dicts the chat template takes, system prompt first."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": m.role, "content": m.content} for m in self.messages]

    def add_user(self, text: str) -> Message:
        msg = Message("user", text)
        self.messages.append(msg)
        return msg

    def add_reply(self, text: str, finish_reason: str, stats: dict | None = None) -> Message:
        msg = Message("assistant", text, finish_reason, stats)
        self.messages.append(msg)
        return msg

    def undo(self) -> list[Message]:
        """Remove the last exchange (the last user message and what followed it)."""
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i].role == "user":
                removed = self.messages[i:]
                del self.messages[i:]
                return removed
        return []

    def pop_reply(self) -> Message | None:
        """Remove the last assistant reply (for /retry), keeping the user message before it."""
        if self.messages and self.messages[-1].role == "assistant":
            return self.messages.pop()
        return None

    @property
    def title(self) -> str:
        if self.name:
            return self.name
        first = next((m.content for m in self.messages if m.role == "user"), "")
        files, words = split_attachments(first)  # attached files (-f, /file): titled by the words after them
        line = " ".join(words.split()) or ", ".join(files)
        return (line[:48] + "…") if len(line) > 48 else (line or "New conversation")
