"""A scripted engine that calls tools, for the MCP tests: the tests' fake engine (`tests/ui/fake.py`) with
a template that writes an assistant's calls as Hermes `<tool_call>` blocks after its text, as the
fallback of a template without tools does, so the KV cache's reuse across a tool round trip shows.

Its script: a user message `call NAME {JSON}` (several joined by ` ; `) is answered with "Calling."
and those calls; a tool result with "The tool said: " and the result's start; anything else is echoed. With
`harmony`, as gpt-oss's replies read once detokenized: reasoning first, then one Harmony call.
`python -m tests.mcp_fake ARGS` runs chatcli's command line with it in place of a model
(`$CHATCLI_FAKE_TOK_S`: at that many tokens a second, for a reply still streaming when a test signals).
"""

from __future__ import annotations

import os
import sys

from chatcli.engine.text.toolcalls import call_text
from tests.ui.fake import END, ROLE, FakeEngine, FakeTokenizer

TOOL = 6


class ToolTokenizer(FakeTokenizer):
    tool_syntax = "hermes"

    def encode_chat(self, messages, tools=None) -> list[int]:
        ids: list[int] = []
        for m in messages:
            calls = [call_text(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or ()]
            text = "\n".join(([m["content"]] if m["content"] else []) + calls)
            ids += [ROLE.get(m["role"], TOOL), *(ord(c) + 10 for c in text), END]
        return ids + [ROLE["assistant"]]


def reply_to(messages) -> str:
    last = messages[-1]
    if last["role"] == "tool":
        return f"The tool said: {' '.join(last['content'].split())[:60]}"
    text = last["content"]
    if not text.startswith("call "):
        return f"You said: {text}"
    blocks = []
    for part in text.split(" ; "):
        name, _, arguments = part.strip().removeprefix("call ").partition(" ")
        blocks.append(call_text(name, arguments or "{}"))
    return "Calling.\n" + "\n".join(blocks)


class HarmonyTokenizer(ToolTokenizer):
    """gpt-oss's call syntax: a reply's reasoning then its call, as `engine.text.harmony`'s detokenizer writes them."""

    tool_syntax = "harmony"


def harmony_reply_to(messages) -> str:
    """As `reply_to`, gpt-oss's way: the analysis channel's reasoning (`<think>`), then one call (Harmony's
    `<|call|>` ends a reply: its first call alone)."""
    last = messages[-1]
    if last["role"] == "user" and last["content"].startswith("call "):
        name, _, arguments = last["content"].split(" ; ")[0].removeprefix("call ").partition(" ")
        return "<think>The user wants the tool.</think>" + call_text(name, arguments or "{}", "harmony")
    return "<think>It answered.</think>" + reply_to(messages)


class ToolEngine(FakeEngine):
    def __init__(self, context_limit: int = 100_000, harmony: bool = False, **kwargs) -> None:
        reply = harmony_reply_to if harmony else reply_to
        script = lambda _text: reply(self.calls[-1]["messages"])  # noqa: E731 - the turn's messages
        super().__init__(script=script, context_limit=context_limit, **kwargs)
        self.tokenizer = HarmonyTokenizer() if harmony else ToolTokenizer()


if __name__ == "__main__":
    from chatcli.cli import main
    from chatcli.options import StartOptions

    tok_s = float(os.environ.get("CHATCLI_FAKE_TOK_S") or 0) or None
    StartOptions.load_engine = lambda self, status=None: ToolEngine(tok_s=tok_s)
    main(sys.argv[1:])
