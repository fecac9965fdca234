"""A conversation as a file: chatcli's JSON export (what `chatcli export`, `/save` and `/load`
read and write) and its Markdown form. No database here: `store.Store.export` builds the dict."""

from __future__ import annotations

import json
import re

from chatcli.chat.conversation import Conversation, Message
from chatcli.errors import shown_json


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
        "messages": [_exported(m) for m in conversation.messages],
    }


def _exported(m: Message) -> dict:
    out = {"role": m.role, "content": m.content, "finish_reason": m.finish_reason, "stats": m.stats}
    if m.tool_calls:
        out["tool_calls"] = m.tool_calls  # [{"id", "name", "arguments"}]
    if m.tool_call:
        out["tool_call"] = m.tool_call  # {"id", "name", "status"}
    return out


def from_export(data: dict) -> Conversation:
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise ValueError("not a chatcli conversation export (no 'messages' list)")
    conversation = Conversation(
        system=data.get("system") or None, name=data.get("title") or None, imported_from=str(data.get("id") or "")
    )
    for i, m in enumerate(data["messages"]):
        if (
            not isinstance(m, dict)
            or m.get("role") not in ("user", "assistant", "tool")
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError(f"message {i + 1} needs a role (user, assistant or tool) and a text content")
        message = Message(m["role"], m["content"], m.get("finish_reason"), m.get("stats"))
        message.tool_calls, message.tool_call = _calls(m, i)
        conversation.messages.append(message)
    return conversation


def _calls(m: dict, i: int) -> tuple[list | None, dict | None]:
    """A message's tool calls (an assistant's) or the call it answers (a tool result's), checked."""
    calls, call = m.get("tool_calls"), m.get("tool_call")
    keys = ("id", "name")
    if calls is not None and not (
        isinstance(calls, list)
        and all(isinstance(c, dict) and all(isinstance(c.get(k), str) for k in keys) for c in calls)
    ):
        raise ValueError(f"message {i + 1}: tool_calls must be a list of calls, each with an id and a name")
    if call is not None and not (isinstance(call, dict) and all(isinstance(call.get(k), str) for k in keys)):
        raise ValueError(f"message {i + 1}: tool_call must be a call with an id and a name")
    if m["role"] == "tool" and call is None:
        raise ValueError(f"message {i + 1}: a tool result needs the tool_call it answers")
    return calls or None, call


def render_export(data: dict, fmt: str) -> str:
    """An export (`to_export`'s dict) as the text of a file: "json" or "md" (Markdown). The text as it
    was written (JSON's escapes for the control characters, `shown_json`)."""
    return shown_json(json.dumps(data, ensure_ascii=False, indent=2)) if fmt == "json" else to_markdown(data)


def to_markdown(data: dict) -> str:
    lines = [f"# {data['title']}", ""]
    if data.get("model"):
        lines += [f"Model: `{data['model']}`", ""]
    if data.get("system"):
        lines += ["**System:** " + data["system"], ""]
    for m in data["messages"]:
        if m["role"] == "tool":
            call = m.get("tool_call") or {}
            status = "" if call.get("status", "ok") == "ok" else f" *({call['status']})*"
            lines += [f"### Tool result: `{call.get('name', '?')}`{status}", "", _fenced(m["content"]), ""]
            continue
        who = "User" if m["role"] == "user" else "Assistant"
        note = {"cancelled": " *(stopped)*", "error": " *(cut off)*"}.get(m.get("finish_reason"), "")
        lines += [f"## {who}{note}", ""] + ([m["content"], ""] if m["content"] or not m.get("tool_calls") else [])
        for call in m.get("tool_calls") or ():
            lines += [f"**Tool call:** `{call['name']}` `{call.get('arguments', '{}')}`", ""]
    return "\n".join(lines)


def _fenced(text: str) -> str:
    """`text` in a code fence longer than any backtick run inside it."""
    fence = "`" * max(3, max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"{fence}\n{text}\n{fence}"
