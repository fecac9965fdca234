"""The incremental detokenizer and the stop-string filter."""

from __future__ import annotations

import codecs

from hypothesis import given, settings
from hypothesis import strategies as st

from chatcli.engine.text.detokenize import IncrementalDetokenizer, StopStringFilter
from chatcli.engine.text.tokenize import TransformersTokenizer
from tests.tiny import build_tokenizer

TOKENIZER = build_tokenizer()
CHAT = TransformersTokenizer(TOKENIZER)  # what the engine hands the detokenizer: ids' bytes too (`token_bytes`)
VOCAB = len(TOKENIZER)


def stream(ids):
    detok = IncrementalDetokenizer(CHAT)
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.finish())
    return pieces


def whole_characters(ids) -> str:
    """`decode(ids)` less the one U+FFFD that stands for a character the ids leave unfinished: where
    Python's incremental UTF-8 decoder, fed the ids' bytes, still holds some back."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(b"".join(CHAT.token_bytes(i) for i in ids))
    text = TOKENIZER.decode(ids, skip_special_tokens=True)
    return text[:-1] if decoder.getstate()[0] and text.endswith("\ufffd") else text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, VOCAB - 1), max_size=40))
def test_random_ids_stream_to_exact_decode(ids):
    pieces = stream(ids)
    # exact, but for the bytes of a character the ids leave unfinished: held back, not replaced
    assert "".join(pieces) == whole_characters(ids)


PIECES = list("ab c\n\t.,!") + list("éüçñ") + list("中文日本語한국") + ["🙂", "🚀", "👍🏽", "∑", "  ", "e\u0301"]
TEXTS = st.lists(st.sampled_from(PIECES), max_size=20).map("".join)


@settings(max_examples=200, deadline=None)
@given(TEXTS)
def test_encoded_text_streams_back_exactly(text):
    ids = TOKENIZER.encode(text, add_special_tokens=False)
    pieces = stream(ids)
    assert "".join(pieces) == TOKENIZER.decode(ids, skip_special_tokens=True) == text
    # No streamed piece (before the flush) ends in half a character.
    assert not any(p.endswith("\ufffd") for p in pieces[:-1])


def test_multibyte_character_is_held_until_complete():
    ids = TOKENIZER.encode("🚀", add_special_tokens=False)
    assert len(ids) > 1, "the tiny vocabulary splits the emoji into byte tokens"
    pieces = stream(ids)
    assert pieces[:-1].count("🚀") + pieces[-1].count("🚀") == 1
    assert all(p in ("", "🚀") for p in pieces)


@settings(max_examples=200, deadline=None)
@given(TEXTS, st.data())
def test_a_stream_cut_anywhere_holds_whole_characters_only(text, data):
    """A reply cut by max_tokens mid-character (an emoji's bytes in several ids): what streamed is
    the text's whole characters before the cut, never a U+FFFD in place of the rest."""
    ids = TOKENIZER.encode(text, add_special_tokens=False)
    cut = data.draw(st.integers(0, len(ids)))
    got = "".join(stream(ids[:cut]))
    assert "\ufffd" not in got and text.startswith(got)
    assert got == whole_characters(ids[:cut])


def test_an_emoji_cut_after_its_first_byte_is_held_back():
    hi, seedling = (TOKENIZER.encode(t, add_special_tokens=False) for t in ("hi", "🌱"))
    assert len(seedling) > 1, "the tiny vocabulary spells the emoji in byte ids"
    assert "".join(stream(hi + seedling[:1])) == "hi"  # not "hi�"
    assert "".join(stream(hi + seedling)) == "hi🌱"


def test_a_replacement_character_the_model_wrote_or_bytes_never_whole_stay():
    """Only an unfinished character's bytes are held back: a U+FFFD written as such, and a byte that no
    character can start with (a lone continuation byte), stay as the full decode has them."""
    ok = TOKENIZER.encode("ok", add_special_tokens=False)
    written = TOKENIZER.encode("ok\ufffd", add_special_tokens=False)
    assert "".join(stream(written)) == "ok\ufffd"
    continuation = next(i for i in range(VOCAB) if CHAT.token_bytes(i) == b"\x80")
    assert "".join(stream(ok + [continuation])) == "ok\ufffd"
    assert "".join(stream(ok + TOKENIZER.encode("🌱", add_special_tokens=False)[:2])) == "ok"


def test_special_tokens_are_skipped():
    ids = TOKENIZER.encode("hi", add_special_tokens=False) + [TOKENIZER.convert_tokens_to_ids("<|im_end|>")]
    assert "".join(stream(ids)) == "hi"


def filtered(chunks, stops):
    f = StopStringFilter(stops)
    out = [f.push(c) for c in chunks]
    out.append(f.finish())
    return "".join(out), f.stopped, out


def test_stop_string_across_pieces():
    text, stopped, out = filtered(["Hello ", "wor", "ld", " and more"], ["world"])
    assert text == "Hello " and stopped
    assert out[1] == ""  # "wor" was held back: it might start the stop string


def test_no_stop_passes_everything_through():
    text, stopped, _ = filtered(["a", "b", "wo", "rk"], ["world"])
    assert text == "abwork" and not stopped


def test_earliest_of_several_stops_wins():
    text, stopped, _ = filtered(["x END y STOP"], ["STOP", "END"])
    assert text == "x " and stopped


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abc", max_size=30), st.text(alphabet="abc", min_size=1, max_size=4), st.data())
def test_stop_filter_equals_cutting_at_first_match(text, stop, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    chunks = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)], strict=True)]
    out, stopped, _ = filtered(chunks, [stop])
    expected = text[: text.index(stop)] if stop in text else text
    assert out == expected and stopped == (stop in text)
