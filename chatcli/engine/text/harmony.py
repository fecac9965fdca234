"""gpt-oss's Harmony replies told apart as a `<think>` reply is: its `analysis` channel reasoning, `final` the answer.

A Harmony model (its chat template writes `<|channel|>` and its vocabulary has Harmony's control tokens) replies
`<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>`: control tokens
that the plain detokenizer drops, which would run the channel names into the text. `HarmonyDetokenizer` reads them
instead and gives the reply as `<think>{analysis}</think>{final}` (other channels' text as the answer), so that
`chat.reasoning` folds it as every other reasoning model's. A message to a function (`to=functions.NAME` in its
header, before or after the channel: a tool call) is given as `toolcalls.HARMONY`'s call text,
`<|channel|>commentary to=functions.NAME<|message|>{arguments}`, read back by `CallScanner(HARMONY)`. `<|end|>`
only ends a message here: `reply_stops` takes it out of the tokenizer's stops and puts `<|return|>` and `<|call|>`
in.

`chat_messages`: a conversation as a Harmony template takes it: an assistant message's `<think>` reasoning
(kept in its stored content) as its `thinking` field, which gpt-oss's template writes on the analysis channel
before a call and drops from a past final answer, never inside its content.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from chatcli.engine.text.detokenize import IncrementalDetokenizer
from chatcli.engine.text.toolcalls import HARMONY_MESSAGE, HARMONY_OPEN

CHANNEL, MESSAGE, END, START = "<|channel|>", "<|message|>", "<|end|>", "<|start|>"
CONSTRAIN = "<|constrain|>"
RETURN, CALL = "<|return|>", "<|call|>"
MARKERS = (CHANNEL, MESSAGE, END, START, RETURN, CALL)
REASONING = "analysis"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")  # a message's recipient: a function (a tool call)


def markers(tokenizer) -> dict[str, int] | None:
    """Harmony's control tokens by text, where the tokenizer is a Harmony model's (None: it is not)."""
    if not any(CHANNEL in source for source in tokenizer.template_sources):
        return None
    added = tokenizer.added_tokens
    if not all(m in added for m in MARKERS):
        return None
    return {m: added[m][0] for m in MARKERS}


def reply_stops(tokenizer, ids: frozenset[int]) -> frozenset[int]:
    """The ids that end a reply, from the tokenizer's end-of-turn `ids`: as they are, but a Harmony model's end with
    `<|return|>` or `<|call|>`, never `<|end|>` (the end of its analysis, before the final message). The
    tokenizers' `stop_ids` are these (`ChatTokenizer.use_template`)."""
    found = markers(tokenizer)
    if found is None:
        return ids
    return (ids - {found[END]}) | {found[RETURN], found[CALL]}


class HarmonyDetokenizer:
    """Reply ids → text as `IncrementalDetokenizer` gives it, Harmony's markup read: a message's text is decoded on
    its own, an `analysis` message's between `<think>` and `</think>`, the headers (role, channel) dropped."""

    def __init__(self, tokenizer, found: dict[str, int]) -> None:
        self.tokenizer = tokenizer
        self.by_id = {i: text for text, i in found.items()}
        self.state = "header"  # header: a message's role / channel; channel: its name; message: its text
        self.channel: list[int] = []
        self.header: list[int] = []  # the role part of a message's header (`assistant to=functions.NAME`)
        self.text: IncrementalDetokenizer | None = None
        self.thinking = False

    def push(self, token_id: int) -> str:
        marker = self.by_id.get(token_id)
        if marker is None:
            if self.state == "channel":
                self.channel.append(token_id)
                return ""
            if self.state == "header":
                self.header.append(token_id)
            return self.text.push(token_id) if self.state == "message" and self.text else ""
        out = self._close() if marker in (END, START, RETURN, CALL, CHANNEL) else ""
        if marker == CHANNEL:
            self.state, self.channel = "channel", []
        elif marker == MESSAGE:
            self.state, self.text = "message", IncrementalDetokenizer(self.tokenizer)
            name = self.tokenizer.decode(self.channel).strip().split(" ")[0] if self.channel else ""
            heard = " ".join(self.tokenizer.decode(part) for part in (self.header, self.channel))
            recipient = RECIPIENT.search(heard)
            self.header = []
            if recipient is not None:  # a call: its arguments follow as the call's text
                out += THINK_CLOSE if self.thinking else ""
                self.thinking = False
                return out + HARMONY_OPEN + recipient.group(1) + HARMONY_MESSAGE
            if name == REASONING and not self.thinking:
                self.thinking = True
                out += THINK_OPEN
            elif name != REASONING and self.thinking:
                self.thinking = False
                out += THINK_CLOSE
        else:
            self.state, self.header = "header", []
        return out

    def _close(self) -> str:
        """The message's last text (its detokenizer's unfinished tail)."""
        if self.state != "message" or self.text is None:
            return ""
        self.state, text, self.text = "header", self.text.finish(), None
        return text

    def finish(self) -> str:
        return self._close() + (THINK_CLOSE if self.thinking else "")


def split_reply(tokenizer, ids: Sequence[int]) -> str:
    """A whole reply's ids as `HarmonyDetokenizer` gives them (a plain decode where the model is not Harmony's)."""
    found = markers(tokenizer)
    detok = HarmonyDetokenizer(tokenizer, found) if found else IncrementalDetokenizer(tokenizer)
    return "".join(detok.push(i) for i in ids) + detok.finish()


def chat_messages(messages: Sequence[dict]) -> list[dict]:
    """`messages` for a Harmony template: each assistant message's `<think>…</think>` (at the start of its
    content) moved to its `thinking` field; beside calls, its text joins the reasoning (the template takes one
    or the other there, the analysis message before the call)."""
    out = []
    for message in messages:
        content = message.get("content")
        if (
            message.get("role") != "assistant"
            or not isinstance(content, str)
            or not content.lstrip().startswith(THINK_OPEN)
        ):
            out.append(message)
            continue
        thinking, _, text = content.lstrip()[len(THINK_OPEN) :].partition(THINK_CLOSE)
        thinking, text = thinking.strip(), text.strip()
        if message.get("tool_calls") and text:
            thinking, text = "\n\n".join(t for t in (thinking, text) if t), ""
        out.append({**message, "content": text, "thinking": thinking})
    return out
