"""gpt-oss's Harmony replies (`engine.text.harmony`) and its o200k pre-tokenizer (`gguf_meta.SPLITS["gpt-4o"]`).

A Harmony reply's `analysis` message is the reasoning and its `final` message the answer, folded by
`chat.reasoning` as a `<think>` reply is, whatever the text tokens between the markers; `<|end|>` (the end of
the analysis) no longer ends the reply, `<|return|>` and `<|call|>` do; a model without Harmony's template is
left as it was.
"""

from __future__ import annotations

from chatcli.chat.reasoning import split
from chatcli.engine.text.harmony import MARKERS, markers, reply_stops, split_reply
from chatcli.engine.text.toolcalls import HARMONY as CALLS
from chatcli.engine.text.toolcalls import Call, CallScanner, parse_calls

WORDS = ["analysis", "final", "assistant", "commentary", "The", " user", " asks", ".", " Hi", "!", " there"]
WORDS += [" to=functions.get", " json", '{"a":', " 1}"]


class FakeTokenizer:
    """Words and Harmony's markers as ids; a decode that drops the markers (skip_special_tokens), as the real one."""

    def __init__(self, template: str) -> None:
        self.vocab = WORDS + list(MARKERS) + ["<|constrain|>", "<|endoftext|>"]
        self.template_sources = [template]
        self.added_tokens = {t: (i, True) for i, t in enumerate(self.vocab) if t.startswith("<|")}
        self.stop_ids = frozenset({self.id("<|end|>"), self.id("<|endoftext|>")})

    def id(self, text: str) -> int:
        return self.vocab.index(text)

    def ids(self, *texts: str) -> list[int]:
        return [self.id(t) for t in texts]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.vocab[i] for i in ids if not (skip_special_tokens and self.vocab[i].startswith("<|")))


HARMONY = "{{ '<|start|>' + m.role + '<|channel|>final<|message|>' }}"


def test_a_harmony_reply_is_reasoning_then_content():
    tok = FakeTokenizer(HARMONY)
    reply = tok.ids("<|channel|>", "analysis", "<|message|>", "The", " user", " asks", ".", "<|end|>")
    reply += tok.ids("<|start|>", "assistant", "<|channel|>", "final", "<|message|>", " Hi", " there", "!")
    text = split_reply(tok, reply)
    assert text == "<think>The user asks.</think> Hi there!"
    assert split(text) == ("The user asks.", " Hi there!")
    plain = tok.decode(reply)  # what the plain detokenizer made of it: the channels' names run into the text
    assert plain.startswith("analysisThe user")


def test_a_reply_cut_inside_its_analysis_is_reasoning_alone():
    tok = FakeTokenizer(HARMONY)
    text = split_reply(tok, tok.ids("<|channel|>", "analysis", "<|message|>", "The", " user"))
    assert split(text) == ("The user", "")


def test_a_call_on_the_commentary_channel_reads_back_as_a_call_not_text():
    """Both headers gpt-oss writes: the recipient after the channel (`<|constrain|>json`), or before it."""
    tok = FakeTokenizer(HARMONY)
    analysis = tok.ids("<|channel|>", "analysis", "<|message|>", "The", " user", "<|end|>", "<|start|>", "assistant")
    after = tok.ids("<|channel|>", "commentary", " to=functions.get", "<|constrain|>", " json", "<|message|>")
    before = tok.ids(" to=functions.get", "<|channel|>", "commentary", " json", "<|message|>")
    for header in (after, before):
        text = split_reply(tok, analysis + header + tok.ids('{"a":', " 1}"))
        thinking, answer = split(text)
        assert thinking == "The user"
        assert parse_calls(answer, CALLS) == ("", [Call("get", '{"a": 1}')])
    cut = split_reply(tok, after + tok.ids('{"a":'))  # max_tokens inside the arguments: no call, no text
    scanner = CallScanner(CALLS)
    assert scanner.push(cut) + scanner.finish() == [] and scanner.cut


def test_harmony_stops_at_return_and_call_not_at_end():
    tok = FakeTokenizer(HARMONY)
    stops = reply_stops(tok, tok.stop_ids)
    assert tok.id("<|end|>") not in stops and {tok.id("<|return|>"), tok.id("<|call|>")} <= stops
    assert tok.id("<|endoftext|>") in stops


def test_a_model_without_harmonys_template_is_as_it_was():
    tok = FakeTokenizer("{{ '<|im_start|>' }}")
    assert markers(tok) is None and reply_stops(tok, tok.stop_ids) == tok.stop_ids
    assert split_reply(tok, tok.ids("The", "<|end|>", " user")) == "The user"


def test_the_o200k_split_keeps_case_runs_contractions_and_three_digits():
    from tokenizers import Regex, pre_tokenizers

    from chatcli.engine.weights.gguf_meta import SPLITS

    (pattern,) = SPLITS["gpt-4o"]
    pieces = [
        t for t, _ in pre_tokenizers.Split(Regex(pattern), "isolated").pre_tokenize_str("Hi WORLD's 12345 x/\n\ny")
    ]
    assert pieces == ["Hi", " WORLD's", " ", "123", "45", " x", "/\n\n", "y"]
