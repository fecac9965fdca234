"""A conversation: the system prompt and the messages, as the user sees them.

Pure data: the engine's KV cache for it lives in an `engine.kv.session.Session` beside it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace

from chatcli.chat.attach import split_attachments


@dataclass
class Message:
    role: str  # "user" | "assistant" | "tool"
    content: str  # an assistant's: its text outside its tool calls; a tool's: the result the model saw
    finish_reason: str | None = None  # assistant replies: "stop" | "length" | "cancelled" | "error"
    stats: dict | None = None  # assistant replies: TurnStats.to_dict()
    # an assistant's tool calls: [{"id", "name", "arguments" (JSON text)}]; a tool result's call:
    # {"id", "name", "status"} (status: chat.mcp's ok, error, timeout, denied, stopped)
    tool_calls: list[dict] | None = None
    tool_call: dict | None = None

    def template(self) -> dict:
        """The message as a chat template takes it: an assistant's calls as `tool_calls` (arguments as
        objects, as templates write them), a result with the id and name of the call it answers."""
        out = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": _args(c)}}
                for c in self.tool_calls
            ]
        if self.role == "tool" and self.tool_call:
            out["tool_call_id"], out["name"] = self.tool_call["id"], self.tool_call["name"]
        return out


def _args(call: dict):
    try:
        return json.loads(call.get("arguments") or "{}")
    except ValueError:
        return {}


@dataclass
class Conversation:
    system: str | None = None
    messages: list[Message] = field(default_factory=list)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    name: str | None = None  # set by /rename; else the title comes from the first user message
    parent_id: str | None = None  # a branch (/edit): the conversation it was branched from
    fork_at: int | None = None  # a branch: the messages it shares with its parent (then its own)
    imported_from: str | None = None  # an import (/load): the exported conversation's id ("" if it had none)

    def branch(self, at: int) -> Conversation:
        """A new conversation holding copies of the first `at` messages, branched from this one."""
        copies = [replace(m) for m in self.messages[:at]]
        return Conversation(system=self.system, messages=copies, parent_id=self.id, fork_at=at)

    def for_template(self) -> list[dict]:
        """The role/content dicts the chat template takes, system prompt first."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [m.template() for m in self.messages]

    def add_user(self, text: str) -> Message:
        msg = Message("user", text)
        self.messages.append(msg)
        return msg

    def add_reply(
        self, text: str, finish_reason: str, stats: dict | None = None, tool_calls: list[dict] | None = None
    ) -> Message:
        msg = Message("assistant", text, finish_reason, stats, tool_calls or None)
        self.messages.append(msg)
        return msg

    def add_result(self, call: dict, text: str, status: str) -> Message:
        """A tool's result, answering `call` (one of the last reply's `tool_calls`)."""
        msg = Message("tool", text, tool_call={"id": call["id"], "name": call["name"], "status": status})
        self.messages.append(msg)
        return msg

    def call_of(self, result: Message) -> dict | None:
        """The call (name, arguments) a tool result answers, from the reply before it."""
        wanted = (result.tool_call or {}).get("id")
        return next((c for m in self.messages for c in m.tool_calls or () if c["id"] == wanted), None)

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
