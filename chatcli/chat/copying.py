"""What `/copy` copies: the last reply, one of its code blocks, or a message (pure: no UI)."""

from __future__ import annotations

from chatcli.chat.conversation import Conversation


class CopyError(ValueError):
    """Nothing to copy for that argument; one line for the user."""


def code_blocks(markdown: str) -> list[str]:
    """The fenced (and indented) code blocks of a Markdown text, in order, as markdown-it parses them."""
    from markdown_it import MarkdownIt

    return [t.content for t in MarkdownIt("commonmark").parse(markdown) if t.type in ("fence", "code_block")]


def pick(conversation: Conversation, arg: str) -> tuple[str, str]:
    """(text, what it is) for `/copy [code [N] | N]`: bare, the last reply (its answer, not its
    reasoning); `code [N]`, the last
    reply's Nth code block (the first by default); `N`, the conversation's Nth message."""
    words = arg.split()
    messages = conversation.messages
    replies = [m for m in messages if m.role == "assistant"]
    if not words:
        if not replies:
            raise CopyError("no reply to copy yet")
        return _answer(replies[-1].content), "the last reply"
    if words[0] == "code":
        if not replies:
            raise CopyError("no reply to copy yet")
        blocks = code_blocks(_answer(replies[-1].content))
        n = _number(words[1] if len(words) > 1 else "1", "code N")
        if not blocks:
            raise CopyError("the last reply has no code block")
        if n > len(blocks):
            raise CopyError(f"the last reply has {len(blocks)} code block{'s' * (len(blocks) != 1)}, not {n}")
        return blocks[n - 1], f"code block {n} of the last reply"
    n = _number(words[0], "N")
    if len(words) > 1:
        raise CopyError("/copy takes nothing, 'code [N]' or a message number N")
    if n > len(messages):
        raise CopyError(f"the conversation has {len(messages)} messages, not {n}")
    return messages[n - 1].content, f"message {n} ({messages[n - 1].role})"


def _answer(reply: str) -> str:
    """A reply without its reasoning (`<think>…</think>`): what a user copies."""
    from chatcli.chat.reasoning import split

    return split(reply)[1]


def _number(word: str, what: str) -> int:
    if not word.isdigit() or int(word) < 1:
        raise CopyError(f"/copy {what}: N must be a whole number from 1, got {word!r}")
    return int(word)
