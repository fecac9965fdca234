"""A new turn keeps the cache where its template spells the same text in other ids (`kv.prefix.realigned`):
a reply the model sampled as `}` `}` comes back in the next turn's prompt as `}}`, and only what is new is
prefilled."""

from __future__ import annotations

from chatcli.engine.kv.prefix import realigned
from chatcli.engine.sample.sampling import SamplingParams

PIECES = {1: b"a", 2: b"b", 3: b"}", 4: b"}}", 5: b"\n", 6: b"x", 7: b"y", 8: b"b}"}


def piece(i: int) -> bytes:
    return PIECES[i]


def spell(ids) -> str:
    return b"".join(PIECES[i] for i in ids).decode()


def test_the_caches_ids_stand_where_they_spell_the_same_text():
    assert realigned([1, 2, 3, 3, 5], [1, 2, 4, 5, 6], piece, spell) == [1, 2, 3, 3, 5, 6]
    # they meet, share ids, part again and meet again: the furthest meeting point counts
    assert realigned([1, 2, 3, 3, 5, 3, 3], [1, 2, 4, 5, 4, 6], piece, spell) == [1, 2, 3, 3, 5, 3, 3, 6]
    # meeting inside an id of each: b + } against b}
    assert realigned([1, 2, 3, 5], [1, 8, 5, 7], piece, spell) == [1, 2, 3, 5, 7]


def test_target_as_it_is_where_nothing_meets_again():
    # they meet after }} and part at \n against x: the cache is kept up to the meeting point
    assert realigned([1, 2, 3, 3, 5], [1, 2, 4, 6, 7], piece, spell) == [1, 2, 3, 3, 6, 7]
    assert realigned([1, 2, 3, 7], [1, 2, 4, 7], piece, spell) == [1, 2, 4, 7]  # } y against }} y
    assert realigned([3, 3, 5], [4, 5, 6], piece, spell) == [4, 5, 6]  # nothing in common to start from
    assert realigned([1, 2], [1, 2, 6], piece, spell) == [1, 2, 6]  # the cache is all a prefix already
    # a decoder that disagrees with the pieces (a space it drops) is believed
    assert realigned([1, 2, 3, 3, 5], [1, 2, 4, 5, 6], piece, lambda ids: str(len(ids))) == [1, 2, 4, 5, 6]


def test_a_turn_after_a_reply_in_other_ids_prefills_only_what_is_new(tiny_lean):
    engine = tiny_lean
    tok = engine.tokenizer
    text = "hello world, hello there"
    canonical = tok.encode(text)
    by_char = [i for c in text for i in tok.encode(c)]
    assert by_char != canonical and tok.decode(by_char) == tok.decode(canonical) == text
    session = engine.new_session()
    first = [{"role": "user", "content": "Hi"}]
    prompt = tok.encode_chat(first)
    engine.runner.forward(prompt + by_char, session.cache)  # the reply as the model sampled it
    held = list(session.cache.ids)
    following = [*first, {"role": "assistant", "content": text}, {"role": "user", "content": "More"}]
    templated = tok.encode_chat(following)
    assert templated[: len(prompt)] == prompt and templated[: len(held)] != held
    events = list(engine.generate(following, session, SamplingParams(temperature=0, max_tokens=1)))
    prefilled, stats = events[0], events[-1].stats
    assert stats.cached_tokens == len(held)  # the reply stays cached in its own ids
    assert prefilled.ids[: len(held)] == held and tok.decode(prefilled.ids, False) == tok.decode(templated, False)
    assert stats.prefill_tokens == len(prefilled.ids) - len(held)
