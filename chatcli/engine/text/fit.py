"""Ingress's last step: a conversation's template ids that fit the model's context with room for a reply.

Contract. `fit_conversation` templates the conversation (`ChatTokenizer.encode_chat`) and drops its
oldest exchanges (a user message and the replies after it; never the system prompt) until the rest
leaves `room` positions of `limit` for the reply. Its cost is bounded whatever the conversation's
length (a server's client chooses it): the whole is templated once where it can fit, else the newest
1, 2, 4 … exchanges and a binary search between the last two counts, each templating at most about
twice what fits. A cancel flag stops it before each templating and inside the render.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from chatcli.engine.text.template import PromptCancelled, RenderTooLong
from chatcli.engine.text.tokenize import ChatTokenizer


class ContextOverflow(ValueError):
    """The newest message alone does not fit the model's context."""


def fit_conversation(
    tokenizer: ChatTokenizer,
    messages: Sequence[dict],
    tools: list[dict] | None,
    limit: int,
    room: int,
    cancel: threading.Event | None = None,
) -> tuple[list[int], int]:
    """The ids of the system prompt and the most of the newest exchanges that leave `room` of `limit`
    positions for a reply, and the number of exchanges dropped (ContextOverflow where the newest alone
    leaves none; where it leaves less than `room`, it is kept and the reply gets what is left).

    The whole conversation is templated once where it has no more messages than the context has
    positions (every template spends a token a message), and fits then; else the newest 1, 2, 4 …
    exchanges are templated until they no longer fit, and a binary search between the last two counts
    finds the most that do. So 20,000 messages cost what a conversation of the context's size does,
    where dropping one exchange at a time templated the whole conversation once per exchange. A
    templating that writes past the template's output limit (RenderTooLong) does not fit either,
    unless it holds the newest exchange alone. `cancel` (set when a server's client leaves) is checked
    before each templating and by the render itself: PromptCancelled."""
    system = [m for m in messages[:1] if m.get("role") == "system"]
    turns = list(messages[len(system) :])
    starts = [i for i, m in enumerate(turns) if m.get("role") == "user"]  # each exchange's first message
    exchanges = max(1, len(starts))

    def templated(kept: int) -> list[int] | None:  # the system prompt and the newest `kept` exchanges
        if cancel is not None and cancel.is_set():
            raise PromptCancelled("the request was cancelled while its prompt was templated")
        newest = turns if kept >= exchanges else turns[starts[-kept] :]
        try:
            return tokenizer.encode_chat(system + newest, tools, cancel)
        except RenderTooLong:
            if kept <= 1:
                raise
            return None  # longer than any context

    def fits(ids: list[int] | None) -> bool:
        return ids is not None and len(ids) + room <= limit

    if len(messages) <= limit:
        ids = templated(exchanges)
        if fits(ids):
            return ids, 0
        worst = exchanges  # the fewest exchanges known not to fit
    else:
        worst = None
    best, best_ids = 0, None  # the most exchanges known to fit, and their ids
    kept = 1
    while worst is None or kept < worst:
        ids = templated(kept)
        if not fits(ids):
            worst = kept
            break
        best, best_ids = kept, ids
        if kept >= exchanges:
            return ids, 0
        kept = min(2 * kept, exchanges)
    if best == 0:  # the newest exchange alone leaves no room for a whole reply
        ids = ids if worst == 1 else templated(1)
        if len(ids) < limit:
            return ids, exchanges - 1  # it fits; the reply gets what room is left
        raise ContextOverflow(f"the message is {len(ids)} tokens with the template; the model's context is {limit}")
    while worst - best > 1:
        middle = (best + worst) // 2
        ids = templated(middle)
        if fits(ids):
            best, best_ids = middle, ids
        else:
            worst = middle
    return best_ids, exchanges - best
