"""What a server sends, read and checked in one place (`chatcli/engine/remote_wire.py`): the events of a
stream with a cap on a line, a chunk's fields of their types, the cap on a reply."""

from __future__ import annotations

import itertools

import pytest

from chatcli.engine.remote_wire import LINE_CAP, WireError, events, parse_chunk, reply_cap

SSE = "text/event-stream; charset=utf-8"


def test_events_across_chunks_and_line_ends():
    body = [b"data: one\r", b"\n\r\n: a comment\n", b"data: two\ndata: lines\r\rid: 3\nda", b"ta: [DONE]\n\n"]
    assert list(events(body, SSE)) == ["one", "two\nlines", "[DONE]"]
    assert list(events([bytes([b]) for b in b"data: byte by byte\r\n\r\n"], SSE)) == ["byte by byte"]
    assert list(events([b"data: never finished"], SSE)) == []  # an event without its blank line is not one


def test_a_body_that_is_not_a_stream_of_events():
    with pytest.raises(WireError, match=r"^text/html, not a stream of events \(text/event-stream\)$"):
        list(events([b"<html>"], "text/html; charset=utf-8"))


def test_a_line_that_never_ends_stops_at_the_cap():
    read = []

    def endless():
        yield b"data: "
        for chunk in itertools.repeat(b"a" * 65536):
            read.append(len(chunk))
            yield chunk

    with pytest.raises(WireError, match=r"^an event line over 1 MiB \(it never ended\)$"):
        list(events(endless(), SSE))
    assert LINE_CAP <= sum(read) <= LINE_CAP + 65536  # read to the cap, and not a chunk further


def test_an_event_of_many_lines_stops_at_the_cap():
    with pytest.raises(WireError, match="^an event over 1 MiB$"):
        list(events(itertools.repeat(b"data: " + b"a" * 1000 + b"\n"), SSE))


def test_a_chunk_is_checked_and_read():
    chunk = parse_chunk(
        '{"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi", "extra": [1]},'
        ' "finish_reason": null}], "usage": {"prompt_tokens": 5, "completion_tokens": 1,'
        ' "prompt_tokens_details": {"cached_tokens": 3}}, "system_fingerprint": 7}'
    )
    assert [c.text for c in chunk.choices] == ["Hi"] and chunk.size == 2
    assert (chunk.usage.prompt_tokens, chunk.usage.cached_tokens) == (5, 3)
    nulls = parse_chunk('{"choices": null, "usage": null}')  # null where a field may be missing: fine
    assert nulls.choices == [] and nulls.usage is None


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ('{"choices": [{"delta": {"content": ["a"]}}]}', 'choices[0].delta.content is ["a"], not text'),
        ('{"choices": [{"delta": "hi"}]}', 'choices[0].delta is "hi", not an object'),
        ('{"choices": [{"finish_reason": 1}]}', "choices[0].finish_reason is 1, not text"),
        ('{"choices": [], "usage": {"completion_tokens": -3}}', "usage.completion_tokens is -3, not a count"),
        ('{"choices": [], "usage": {"prompt_tokens": true}}', "usage.prompt_tokens is true, not a count"),
        ('{"choices": [], "usage": {"prompt_tokens_details": 4}}', "usage.prompt_tokens_details is 4, not an object"),
        (
            '{"choices": [{"delta": {"tool_calls": [{"function": {"arguments": 4}}]}}]}',
            "choices[0].delta.tool_calls[0].function.arguments is 4, not text or an object",
        ),
        ('"just text"', 'an event that is not a JSON object: "just text"'),
    ],
)
def test_each_wrong_shape_is_one_line_naming_the_field(data, words):
    with pytest.raises(WireError) as exc:
        parse_chunk(data)
    assert str(exc.value) == words


def test_the_reply_cap_is_max_tokens_and_a_margin():
    assert reply_cap(10) == (74, 74 * 256)
    assert reply_cap(4096) == (5120, 5120 * 256)
