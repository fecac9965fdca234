"""A reply's text as its ids come (`text.reply.ReplyText`): a held call's string keeps its events back until it
closes, and taking its last ids back leaves the text, the events and the detokenizer as if they never came."""

from __future__ import annotations

import pytest

from chatcli.engine.events import Token
from chatcli.engine.text.detokenize import IncrementalDetokenizer, StopStringFilter
from chatcli.engine.text.reply import ReplyText


def reply_text(tokenizer) -> ReplyText:
    return ReplyText(lambda: IncrementalDetokenizer(tokenizer), lambda: StopStringFilter(()))


def test_held_events_come_when_the_string_closes_and_taken_back_ones_never(real_default):
    tokenizer = real_default.tokenizer
    ids = tokenizer.encode(' {"city": "Paris, Paris, Paris, Paris')
    text, sent = reply_text(tokenizer), []
    for n, token_id in enumerate(ids, 1):
        token = Token(token_id, text.push(token_id), n, 0.0, 0.0)
        sent += text.release(token, hold=n > 4)  # the string opened at the fourth id
    assert [t.token_id for t in sent] == ids[:4] and len(text.held) == len(ids) - 4
    kept = ids[:-4]
    text.drop(4)  # the last four ids taken back
    assert text.ids == kept
    for token_id in tokenizer.encode('"}'):
        sent += text.release(Token(token_id, text.push(token_id), 0, 0.0, 0.0), hold=False)
    sent += text.flush()
    assert "".join(t.text for t in sent) == tokenizer.decode(kept) + '"}' == text.reply
    with pytest.raises(ValueError):
        text.drop(1)  # nothing held is left to take back
