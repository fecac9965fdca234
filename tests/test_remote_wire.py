"""What a server sends, read and checked in one place (`chatcli/engine/remote_wire.py`): the events of a
stream with a cap on a line, a chunk's fields of their types, the cap on a reply."""

from __future__ import annotations

import itertools
import json

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
        (
            '{"choices": [{"logprobs": {"content": [{"token": "a"}]}}]}',
            "choices[0].logprobs.content[0].logprob is null, not a log p (a number ≤ 0)",
        ),
        (
            '{"choices": [{"logprobs": {"content": [{"token": "a", "logprob": 0.5}]}}]}',
            "choices[0].logprobs.content[0].logprob is 0.5, not a log p (a number ≤ 0)",
        ),
        (
            '{"choices": [{"logprobs": {"content": [{"token": "a", "logprob": NaN}]}}]}',
            "choices[0].logprobs.content[0].logprob is NaN, not a log p (a number ≤ 0)",
        ),
        (
            '{"choices": [{"logprobs": {"content": [{"token": 5, "logprob": -1}]}}]}',
            "choices[0].logprobs.content[0].token is 5, not text",
        ),
        (
            '{"choices": [{"logprobs": {"content": [{"token": "a", "logprob": -1,'
            ' "top_logprobs": [{"logprob": -2}]}]}}]}',
            "choices[0].logprobs.content[0].top_logprobs[0].token is missing",
        ),
        ('{"choices": [{"logprobs": {"content": "a"}}]}', 'choices[0].logprobs.content is "a", not a list'),
    ],
)
def test_each_wrong_shape_is_one_line_naming_the_field(data, words):
    with pytest.raises(WireError) as exc:
        parse_chunk(data)
    assert str(exc.value) == words


def test_a_chunks_logprobs_are_read_and_their_alternatives_bounded():
    """OpenAI's `logprobs.content[]`: each token's text, logprob and alternatives (at most 20 kept, however
    many a server sends); an integer logprob is a number too."""
    top = [{"token": str(i), "logprob": -i - 1, "bytes": [48 + i % 10]} for i in range(500)]
    chunk = parse_chunk(
        '{"choices": [{"delta": {"content": "Hi!"}, "logprobs": {"content": ['
        '{"token": "Hi", "logprob": -0.25, "bytes": [72, 105], "top_logprobs": ' + json.dumps(top) + "},"
        ' {"token": "!", "logprob": 0, "top_logprobs": []}], "refusal": null}}]}'
    )
    hi, bang = chunk.choices[0].scored
    assert (hi.token, hi.logprob, bang.token, bang.logprob, bang.top) == ("Hi", -0.25, "!", 0.0, [])
    assert hi.top == [(str(i), -i - 1.0) for i in range(20)]
    assert parse_chunk('{"choices": [{"delta": {"content": "a"}, "logprobs": null}]}').choices[0].scored == []


def test_the_reply_cap_is_max_tokens_and_a_margin():
    assert reply_cap(10) == (74, 74 * 256)
    assert reply_cap(4096) == (5120, 5120 * 256)
