"""Anthropic's Messages API on `chatcli serve` (issue 48), end to end with the `anthropic` SDK: create,
stream (Anthropic's event sequence), count_tokens, stop sequences, a tool round trip, a reasoning model's
think block as a thinking block, the key as `x-api-key`, and every refusal a 4xx in Anthropic's shape."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from chatcli.engine.sample.sampling import SamplingParams
from tests.peer_clients import ASK, SCHEMAS, THINKING, TOOLS, engine_reply, scripted, tools_engine
from tests.servers import ALIAS, TIMEOUT, USER

GREEDY = {"temperature": 0}  # the SDK sends sampling fields in extra_body (2.x dropped them from create)
ANTHROPIC_TOOLS = [
    {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
    for f in (t["function"] for t in TOOLS)
]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return tools_engine(tmp_path_factory)


def client(server, **kwargs):
    from anthropic import Anthropic

    return Anthropic(base_url=server.url, api_key=kwargs.pop("api_key", "unused"), max_retries=0, timeout=TIMEOUT,
                     **kwargs)  # fmt: skip


def sse(response: httpx.Response) -> list[tuple[str, dict]]:
    """(event, data) of each Server-Sent Event."""
    out, kind = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            out.append((kind, json.loads(line[len("data: ") :])))
    return out


def test_create_gives_the_engines_reply_with_system_text_blocks_and_usage(tiny_lean, serve):
    server = serve(tiny_lean)
    system = "Be brief."
    blocks = [{"type": "text", "text": "What is the capital"}, {"type": "text", "text": " of France?"}]
    chat = [{"role": "system", "content": system}, *USER]
    expected = engine_reply(tiny_lean, chat, max_tokens=10)
    anthropic = client(server)
    message = anthropic.messages.create(
        model=ALIAS, max_tokens=10, system=system, messages=[{"role": "user", "content": blocks}], extra_body=GREEDY
    )
    assert message.type == "message" and message.role == "assistant" and message.model == tiny_lean.name
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == expected
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    prompt = len(tiny_lean.tokenizer.encode_chat(chat))
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == prompt
    assert message.usage.output_tokens == 10
    again = anthropic.messages.create(model=ALIAS, max_tokens=10, system=system, messages=[{"role": "user",
                                      "content": blocks}], extra_body=GREEDY)  # fmt: skip
    assert again.content[0].text == expected and again.usage.cache_read_input_tokens > 0  # the prefix cache
    counted = anthropic.messages.count_tokens(
        model=ALIAS, system=system, messages=[{"role": "user", "content": blocks}]
    )
    assert counted.input_tokens == prompt


def test_stream_is_anthropics_event_sequence_with_the_same_reply(tiny_lean, serve):
    server = serve(tiny_lean)
    expected = engine_reply(tiny_lean, USER, max_tokens=12)
    with client(server).messages.stream(model=ALIAS, max_tokens=12, messages=USER, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == expected and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 12
    body = {"model": ALIAS, "max_tokens": 12, "messages": USER, "stream": True, **GREEDY}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=TIMEOUT) as raw:
        assert raw.headers["content-type"].startswith("text/event-stream")
        events = sse(raw)
    names = [kind for kind, _ in events]
    assert all(data["type"] == kind for kind, data in events)
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"} and len(names[3:-3]) > 1  # streamed in pieces
    assert "".join(d["delta"]["text"] for k, d in events if k == "content_block_delta") == expected
    assert events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert [k for k in kinds if k in ("message_start", "message_stop")] == ["message_start", "message_stop"]


def test_a_stop_sequence_ends_the_reply_and_is_named(tiny_lean, serve):
    server = serve(tiny_lean)
    expected = engine_reply(tiny_lean, USER, max_tokens=16)
    at = next(i for i in range(2, len(expected) - 1) if expected[i : i + 2].isascii() and expected[i : i + 2].strip())
    stop = expected[at : at + 2]
    cut = expected[: expected.index(stop)]
    anthropic = client(server)
    message = anthropic.messages.create(model=ALIAS, max_tokens=16, messages=USER, stop_sequences=["zqzq", stop],
                                        extra_body=GREEDY)  # fmt: skip
    assert message.content[0].text == cut
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", stop)
    with anthropic.messages.stream(model=ALIAS, max_tokens=16, messages=USER, stop_sequences=[stop],
                                   extra_body=GREEDY) as stream:  # fmt: skip
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", stop, cut)


def test_a_tool_round_trip(qwen, serve):
    """`any` holds the reply to calls that validate; the tool_use block and its tool_result go back as the
    conversation the engine templates with the tools; streamed, the SDK reassembles the call."""
    server = serve(qwen)
    anthropic = client(server)
    message = anthropic.messages.create(model=ALIAS, max_tokens=600, messages=ASK, tools=ANTHROPIC_TOOLS,
                                        tool_choice={"type": "any"}, extra_body=GREEDY)  # fmt: skip
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses and message.stop_reason == "tool_use"
    for use in uses:
        jsonschema.validate(use.input, SCHEMAS[use.name])
    use = uses[0]
    with anthropic.messages.stream(model=ALIAS, max_tokens=600, messages=ASK, tools=ANTHROPIC_TOOLS,
                                   tool_choice={"type": "any"}, extra_body=GREEDY) as stream:  # fmt: skip
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [(u.name, u.input) for u in uses]
    named = anthropic.messages.create(model=ALIAS, max_tokens=600, messages=ASK, tools=ANTHROPIC_TOOLS,
                                      tool_choice={"type": "tool", "name": "search", "disable_parallel_tool_use": True},
                                      extra_body=GREEDY)  # fmt: skip
    assert [b.name for b in named.content if b.type == "tool_use"] == ["search"]

    answered = [
        *ASK,
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C, sunny"}]},
    ]
    reply = anthropic.messages.create(model=ALIAS, max_tokens=12, messages=answered, tools=ANTHROPIC_TOOLS,
                                      extra_body=GREEDY)  # fmt: skip
    chat = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": use.id, "type": "function", "function": {"name": use.name, "arguments": use.input}}],
        },  # fmt: skip
        {"role": "tool", "content": "18 C, sunny", "tool_call_id": use.id, "name": use.name},
    ]
    assert "".join(b.text for b in reply.content if b.type == "text") == engine_reply(qwen, chat, TOOLS, max_tokens=12)


def test_a_reasoning_models_think_block_is_a_thinking_block(qwen, serve, monkeypatch):
    scripted(qwen, THINKING, monkeypatch)
    server = serve(qwen, defaults=SamplingParams(lookup=0))
    anthropic = client(server)
    message = anthropic.messages.create(model=ALIAS, max_tokens=100, messages=USER, extra_body=GREEDY)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "Let me see: the capital."
    assert message.content[1].text == "Paris is the capital." and message.stop_reason == "end_turn"
    with anthropic.messages.stream(model=ALIAS, max_tokens=100, messages=USER, extra_body=GREEDY) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or b.text) for b in final.content] == [
        ("thinking", "Let me see: the capital."),
        ("text", "Paris is the capital."),
    ]
    assert "thinking_delta" in deltas and "signature_delta" in deltas and deltas[-1] == "text_delta"
    with_thinking = [*USER, {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": ""},
                     {"type": "text", "text": "Paris."}]}, {"role": "user", "content": "And Spain?"}]  # fmt: skip
    assert anthropic.messages.create(model=ALIAS, max_tokens=100, messages=with_thinking).content


def test_the_key_goes_as_x_api_key_or_a_bearer_token(tiny_lean, serve):
    from anthropic import Anthropic, AuthenticationError

    server = serve(tiny_lean, api_key="s3cret")
    assert client(server, api_key="s3cret").messages.create(model=ALIAS, max_tokens=2, messages=USER).content
    bearer = Anthropic(base_url=server.url, auth_token="s3cret", max_retries=0, timeout=TIMEOUT)
    assert bearer.messages.create(model=ALIAS, max_tokens=2, messages=USER).content
    with pytest.raises(AuthenticationError) as caught:
        client(server, api_key="wrong").messages.create(model=ALIAS, max_tokens=2, messages=USER)
    assert caught.value.body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "'image' blocks"),
        ({"messages": [{"role": "system", "content": "x"}]}, "role"),
        ({"messages": [*USER, {"role": "assistant", "content": "Pa"}]}, "prefill"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
        ({"tool_choice": {"type": "tool", "name": "nosuch"}, "tools": ANTHROPIC_TOOLS}, "nosuch"),
        ({"stop_sequences": "x"}, "stop_sequences"),
        ({"top_k": -1}, "top_k"),
        ({"mcp_servers": [{"url": "http://x"}]}, "mcp_servers"),
        ({"output_config": {"effort": "high"}}, "effort"),
    ],
)
def test_what_the_server_does_not_do_is_a_400_in_anthropics_shape(tiny_lean, serve, fields, words):
    server = serve(tiny_lean)
    body = {"model": ALIAS, "max_tokens": 4, "messages": USER, **fields}
    got = httpx.post(
        server.url + "/v1/messages", json={k: v for k, v in body.items() if v is not None}, timeout=TIMEOUT
    )
    assert got.status_code == 400, got.text
    error = got.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert words in error["error"]["message"]


def test_an_unknown_model_or_path_is_a_404_the_sdk_raises(tiny_lean, serve):
    from anthropic import NotFoundError

    server = serve(tiny_lean)
    with pytest.raises(NotFoundError) as caught:
        client(server).messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=USER)
    assert caught.value.body["error"]["type"] == "not_found_error" and tiny_lean.name in str(caught.value)
    missing = httpx.post(server.url + "/v1/messages/batches", json={}, timeout=TIMEOUT)
    assert missing.status_code in (404, 405) and missing.json()["type"] == "error"


def test_output_config_holds_the_reply_to_a_schema(qwen, serve):
    server = serve(qwen)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
    held = {"format": {"type": "json_schema", "schema": schema}}
    message = client(server).messages.create(model=ALIAS, max_tokens=200, messages=ASK, extra_body=GREEDY,
                                             output_config=held)  # fmt: skip
    jsonschema.validate(json.loads(message.content[0].text), schema)
