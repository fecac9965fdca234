"""A conversation as a file: chatcli's JSON export (what `chatcli export`, `/save` and `/load`
read and write) and its Markdown form. No database here: `store.Store.export` builds the dict."""

from __future__ import annotations

import json

from chatcli.chat.conversation import Conversation, Message


def to_export(conversation: Conversation, model: str = "", created: float = 0.0, updated: float = 0.0) -> dict:
    return {
        "format": "chatcli-conversation",
        "version": 1,
        "id": conversation.id,
        "title": conversation.title,
        "model": model,
        "system": conversation.system,
        "created": created,
        "updated": updated,
        "messages": [
            {"role": m.role, "content": m.content, "finish_reason": m.finish_reason, "stats": m.stats}
            for m in conversation.messages
        ],
    }


def from_export(data: dict) -> Conversation:
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise ValueError("not a chatcli conversation export (no 'messages' list)")
    conversation = Conversation(system=data.get("system") or None, name=data.get("title") or None)
    for i, m in enumerate(data["messages"]):
        if (
            not isinstance(m, dict)
            or m.get("role") not in ("user", "assistant")
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError(f"message {i + 1} needs a role (user or assistant) and a text content")
        conversation.messages.append(Message(m["role"], m["content"], m.get("finish_reason"), m.get("stats")))
    return conversation


def render_export(data: dict, fmt: str) -> str:
    """An export (`to_export`'s dict) as the text of a file: "json" or "md" (Markdown)."""
    return json.dumps(data, ensure_ascii=False, indent=2) if fmt == "json" else to_markdown(data)


def to_markdown(data: dict) -> str:
    lines = [f"# {data['title']}", ""]
    if data.get("model"):
        lines += [f"Model: `{data['model']}`", ""]
    if data.get("system"):
        lines += ["**System:** " + data["system"], ""]
    for m in data["messages"]:
        who = "User" if m["role"] == "user" else "Assistant"
        note = {"cancelled": " *(stopped)*", "error": " *(cut off)*"}.get(m.get("finish_reason"), "")
        lines += [f"## {who}{note}", "", m["content"], ""]
    return "\n".join(lines)
