"""gpt-oss's Harmony replies told apart as a `<think>` reply is: its `analysis` channel reasoning, `final` the answer.

A Harmony model (its chat template writes `<|channel|>` and its vocabulary has Harmony's control tokens) replies
`<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>`: control tokens
that the plain detokenizer drops, which would run the channel names into the text. `HarmonyDetokenizer` reads them
instead and gives the reply as `<think>{analysis}</think>{final}` (other channels' text, a tool call's
`commentary`, as the answer), so that `chat.reasoning` folds it as every other reasoning model's. `<|end|>` only
ends a message here: `stop_ids` takes it out of the stops and puts `<|return|>` and `<|call|>` in.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatcli.engine.text.detokenize import IncrementalDetokenizer

CHANNEL, MESSAGE, END, START = "<|channel|>", "<|message|>", "<|end|>", "<|start|>"
RETURN, CALL = "<|return|>", "<|call|>"
MARKERS = (CHANNEL, MESSAGE, END, START, RETURN, CALL)
REASONING = "analysis"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def markers(tokenizer) -> dict[str, int] | None:
    """Harmony's control tokens by text, where the tokenizer is a Harmony model's (None: it is not)."""
    if not any(CHANNEL in source for source in tokenizer.template_sources):
        return None
    added = tokenizer.added_tokens
    if not all(m in added for m in MARKERS):
        return None
    return {m: added[m][0] for m in MARKERS}


def stop_ids(tokenizer) -> frozenset[int]:
    """The ids that end a reply: the tokenizer's, but a Harmony model's end with `<|return|>` or `<|call|>`, never
    `<|end|>` (the end of its analysis, before the final message)."""
    found = markers(tokenizer)
    if found is None:
        return tokenizer.stop_ids
    return (tokenizer.stop_ids - {found[END]}) | {found[RETURN], found[CALL]}


class HarmonyDetokenizer:
    """Reply ids → text as `IncrementalDetokenizer` gives it, Harmony's markup read: a message's text is decoded on
    its own, an `analysis` message's between `<think>` and `</think>`, the headers (role, channel) dropped."""

    def __init__(self, tokenizer, found: dict[str, int]) -> None:
        self.tokenizer = tokenizer
        self.by_id = {i: text for text, i in found.items()}
        self.state = "header"  # header: a message's role / channel; channel: its name; message: its text
        self.channel: list[int] = []
        self.text: IncrementalDetokenizer | None = None
        self.thinking = False

    def push(self, token_id: int) -> str:
        marker = self.by_id.get(token_id)
        if marker is None:
            if self.state == "channel":
                self.channel.append(token_id)
                return ""
            return self.text.push(token_id) if self.state == "message" and self.text else ""
        out = self._close() if marker in (END, START, RETURN, CALL, CHANNEL) else ""
        if marker == CHANNEL:
            self.state, self.channel = "channel", []
        elif marker == MESSAGE:
            self.state, self.text = "message", IncrementalDetokenizer(self.tokenizer)
            name = self.tokenizer.decode(self.channel).strip().split(" ")[0] if self.channel else ""
            if name == REASONING and not self.thinking:
                self.thinking = True
                out += THINK_OPEN
            elif name != REASONING and self.thinking:
                self.thinking = False
                out += THINK_CLOSE
        else:
            self.state = "header"
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
