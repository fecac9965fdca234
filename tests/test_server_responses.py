"""OpenAI's Responses API on `chatcli serve` (issue 48), end to end with the `openai` client's
`responses.create`, `responses.stream` and `responses.parse`: text and item input, instructions, function
tools and their outputs, max_output_tokens, a reasoning model's reasoning item, and the refusals (`store`,
`previous_response_id`, other tools) as 400s naming the field."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from chatcli.engine.sample.sampling import SamplingParams
from tests.peer_clients import ASK, SCHEMAS, THINKING, TOOLS, engine_reply, scripted, tools_engine
from tests.servers import ALIAS, TIMEOUT, USER

FUNCTIONS = [{"type": "function", **t["function"]} for t in TOOLS]  # the Responses API lists tools flat


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return tools_engine(tmp_path_factory)


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def sse(response: httpx.Response) -> list[dict]:
    return [json.loads(line[len("data: ") :]) for line in response.iter_lines() if line.startswith("data: ")]


def test_create_with_text_or_items_and_instructions(tiny_lean, serve):
    server = serve(tiny_lean)
    openai = client(server)
    chat = [{"role": "system", "content": "Be brief."}, *USER]
    expected = engine_reply(tiny_lean, chat, max_tokens=8)
    done = openai.responses.create(model=ALIAS, instructions="Be brief.", input=USER[0]["content"],
                                   max_output_tokens=8, temperature=0, store=False)  # fmt: skip
    assert done.object == "response" and done.output_text == expected and done.model == tiny_lean.name
    assert done.status == "incomplete" and done.incomplete_details.reason == "max_output_tokens"
    assert done.usage.input_tokens == len(tiny_lean.tokenizer.encode_chat(chat)) and done.usage.output_tokens == 8
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": USER[0]["content"]}]},
    ]
    again = openai.responses.create(model=ALIAS, input=items, max_output_tokens=8, temperature=0)
    assert again.output_text == expected and again.usage.input_tokens_details.cached_tokens > 0  # the prefix cache
    bare = httpx.post(server.url + "/responses", json={"model": ALIAS, "input": "Hi", "max_output_tokens": 2})
    assert bare.status_code == 200 and bare.json()["usage"]["output_tokens"] == 2  # without /v1 too


def test_stream_sends_the_responses_events(qwen, serve, monkeypatch):
    scripted(qwen, "Paris is the capital.", monkeypatch)
    server = serve(qwen, defaults=SamplingParams(lookup=0))
    with client(server).responses.stream(model=ALIAS, input=USER, temperature=0) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == "Paris is the capital."
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]  # fmt: skip
    assert kinds.count("response.output_text.delta") > 1
    body = {"model": ALIAS, "input": "Hi", "max_output_tokens": 3, "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=TIMEOUT) as raw:
        events = sse(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["usage"]["output_tokens"] == 3


def test_function_tools_their_calls_and_outputs(qwen, serve):
    server = serve(qwen)
    openai = client(server)
    done = openai.responses.create(model=ALIAS, input=ASK, tools=FUNCTIONS, tool_choice="required", temperature=0,
                                   max_output_tokens=600)  # fmt: skip
    calls = [item for item in done.output if item.type == "function_call"]
    assert calls and done.status == "completed"
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    with openai.responses.stream(model=ALIAS, input=ASK, tools=FUNCTIONS, tool_choice="required", temperature=0,
                                 max_output_tokens=600) as stream:  # fmt: skip
        final = stream.get_final_response()
    assert [(c.name, c.arguments) for c in final.output if c.type == "function_call"] == [
        (c.name, c.arguments) for c in calls
    ]
    search = {"type": "function", "name": "search"}
    named = openai.responses.create(model=ALIAS, input=ASK, tools=FUNCTIONS, temperature=0, max_output_tokens=600,
                                    tool_choice=search, parallel_tool_calls=False)  # fmt: skip
    assert [c.name for c in named.output if c.type == "function_call"] == ["search"]

    call = calls[0]
    answered = [
        *ASK,
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"},
    ]
    reply = openai.responses.create(model=ALIAS, input=answered, tools=FUNCTIONS, temperature=0, max_output_tokens=10)
    chat = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.loads(call.arguments)},
                }
            ],
        },  # fmt: skip
        {"role": "tool", "content": "18 C, sunny", "tool_call_id": call.call_id, "name": call.name},
    ]
    assert reply.output_text == engine_reply(qwen, chat, TOOLS, max_tokens=10)


def test_a_reasoning_models_think_block_is_a_reasoning_item(qwen, serve, monkeypatch):
    scripted(qwen, THINKING, monkeypatch)
    server = serve(qwen, defaults=SamplingParams(lookup=0))
    openai = client(server)
    done = openai.responses.create(model=ALIAS, input=USER, temperature=0)
    assert [item.type for item in done.output] == ["reasoning", "message"]
    assert done.output[0].content[0].text == "Let me see: the capital." and done.output_text == "Paris is the capital."
    with openai.responses.stream(model=ALIAS, input=USER, temperature=0) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == "Let me see: the capital."
    again = [*USER, *[item.model_dump(exclude_none=True) for item in done.output], {"role": "user", "content": "Hi"}]
    assert openai.responses.create(model=ALIAS, input=again, temperature=0).status == "completed"


def test_parse_holds_the_reply_to_a_pydantic_model(qwen, serve):
    class City(BaseModel):  # short strings: the tiny random model would write one to the cut
        name: str = Field(max_length=8)
        country: str = Field(max_length=8)

    server = serve(qwen)
    done = client(server).responses.parse(model=ALIAS, input=ASK, text_format=City, temperature=0,
                                          max_output_tokens=300)  # fmt: skip
    assert isinstance(done.output_parsed, City)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input[0]"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"text": {"format": {"type": "yaml"}}}, "response_format.type"),
    ],
)
def test_what_the_server_does_not_do_is_a_400_naming_it(tiny_lean, serve, fields, param):
    from openai import BadRequestError

    server = serve(tiny_lean)
    with pytest.raises(BadRequestError) as caught:
        client(server).responses.create(**{"model": ALIAS, "input": "Hi", **fields})
    assert caught.value.body["param"].startswith(param) and param.split("[")[0] in caught.value.body["message"]


def test_an_unknown_model_is_a_404(tiny_lean, serve):
    from openai import NotFoundError

    server = serve(tiny_lean)
    with pytest.raises(NotFoundError):
        client(server).responses.create(model="gpt-5", input="Hi")
