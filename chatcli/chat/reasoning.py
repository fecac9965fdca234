"""Reasoning text: what a model writes inside `<think>…</think>` before its answer (Qwen3, DeepSeek-R1
style templates), told apart from the answer as it streams (pure: no UI).

The reply as stored keeps the tags: whether the next turn's prompt keeps the reasoning is the chat
template's call (Qwen3's drops it from earlier turns; a template that does not, keeps it).
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
THINKING, ANSWER = "thinking", "answer"


def split(text: str) -> tuple[str | None, str]:
    """A whole reply → (its reasoning, or None where it has none, its answer). A reply with a
    `</think>` but no opening tag began inside its reasoning: DeepSeek-R1 style templates open
    the tag in the prompt itself."""
    opened = not text.lstrip().startswith(OPEN) and CLOSE in text
    stream = ReasoningStream(thinking=opened)
    pieces = stream.push(text) + stream.finish()
    thinking = "".join(t for kind, t in pieces if kind == THINKING)
    answer = "".join(t for kind, t in pieces if kind == ANSWER)
    return (thinking if stream.saw_reasoning else None), answer


class ReasoningStream:
    """Streamed text → (kind, text) pieces, THINKING or ANSWER, whatever the chunks' boundaries: a
    tag split across chunks is held back until it is whole (or cannot be one)."""

    def __init__(self, thinking: bool = False) -> None:
        """`thinking`: the reply starts inside its reasoning (the prompt ended with `<think>`)."""
        self.state = THINKING if thinking else "start"  # start: nothing but blanks yet; then THINKING or ANSWER
        self.held = ""
        self.saw_reasoning = thinking
        self._strip_next = False  # the blank lines right after </think> are layout, not answer
        self._strip_open = thinking  # and those right after <think>

    def push(self, text: str) -> list[tuple[str, str]]:
        self.held += text
        out: list[tuple[str, str]] = []
        while self.held:
            if self.state == "start":
                lead = self.held.lstrip()
                if lead.startswith(OPEN):
                    self.state, self.saw_reasoning, self._strip_open = THINKING, True, True
                    self.held = lead[len(OPEN) :]
                    continue
                if OPEN.startswith(lead):  # blanks, or part of the tag: wait for more
                    break
                self.state = ANSWER
                continue
            if self.state == THINKING:
                if self._strip_open:
                    self.held = self.held.lstrip("\n")
                    if not self.held:
                        break
                    self._strip_open = False
                at = self.held.find(CLOSE)
                if at >= 0:
                    self._emit(out, THINKING, self.held[:at].rstrip("\n"))
                    self.held, self.state, self._strip_next = self.held[at + len(CLOSE) :], ANSWER, True
                    continue
                keep = _partial_tail(self.held, CLOSE)
                body = self.held[: len(self.held) - keep]
                core = body.rstrip("\n")  # newlines before </think> are layout: held until it is known
                self._emit(out, THINKING, core)
                self.held = body[len(core) :] + self.held[len(self.held) - keep :]
                break
            if self._strip_next:
                stripped = self.held.lstrip("\n")
                if not stripped:
                    self.held = ""
                    break
                self.held, self._strip_next = stripped, False
            self._emit(out, ANSWER, self.held)
            self.held = ""
        return out

    def finish(self) -> list[tuple[str, str]]:
        """What is still held at the end of the reply (an unfinished tag is text after all)."""
        out: list[tuple[str, str]] = []
        if self.held:
            kind = THINKING if self.state == THINKING else ANSWER
            self._emit(out, kind, self.held if kind == THINKING or not self._strip_next else self.held.lstrip("\n"))
        self.held = ""
        return out

    @staticmethod
    def _emit(out: list, kind: str, text: str) -> None:
        if text:
            out.append((kind, text))


def _partial_tail(text: str, tag: str) -> int:
    """How many characters at the end of `text` could begin `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
