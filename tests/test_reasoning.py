"""Reasoning (`<think>…</think>`) told apart from the answer, whatever the stream's chunks."""

from hypothesis import given
from hypothesis import strategies as st

from chatcli.chat.conversation import Conversation
from chatcli.chat.copying import pick
from chatcli.chat.reasoning import ANSWER, THINKING, ReasoningStream, split
from chatcli.engine.events import FinishReason

CASES = {
    "<think>\nLet me see: 2 + 2.\n</think>\n\nIt is **4**.": ("Let me see: 2 + 2.", "It is **4**."),
    "  <think>a</think>b": ("a", "b"),
    "<think></think>\n\nOnly the answer.": ("", "Only the answer."),
    "No reasoning here, <think> in the middle stays text.": (
        None,
        "No reasoning here, <think> in the middle stays text.",
    ),
    "<think>cut off mid-thought": ("cut off mid-thought", ""),
    "<thin": (None, "<thin"),
    "": (None, ""),
    "The prompt opened it.\n</think>\n\nSo: yes.": ("The prompt opened it.", "So: yes."),  # DeepSeek-R1 style
}


def test_whole_replies():
    for text, want in CASES.items():
        assert split(text) == want, text


@given(st.sampled_from(sorted(CASES)), st.lists(st.integers(min_value=0, max_value=60), max_size=8))
def test_any_chunking_gives_the_same_pieces(text, cuts):
    bounds = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]
    opened = not text.lstrip().startswith("<think>") and "</think>" in text
    stream = ReasoningStream(thinking=opened)
    pieces = [p for chunk in chunks for p in stream.push(chunk)] + stream.finish()
    thinking = "".join(t for k, t in pieces if k == THINKING)
    answer = "".join(t for k, t in pieces if k == ANSWER)
    want_thinking, want_answer = CASES[text]
    assert (thinking if stream.saw_reasoning else None, answer) == (want_thinking, want_answer)


def test_copy_takes_the_answer_not_the_reasoning():
    conv = Conversation()
    conv.add_user("2 + 2?")
    conv.add_reply("<think>add them</think>\n```\n4\n```", FinishReason.STOP)
    assert pick(conv, "")[0] == "```\n4\n```"
    assert pick(conv, "code")[0] == "4\n"
