"""Tools through the remote engine (issue 35): `tools`, `tool_choice`, `parallel_tool_calls` and a
conversation's calls and results go to the server as OpenAI takes them; the server's streamed
`delta.tool_calls` (in fragments, whole, parallel) come back as the reply's calls, read the one way
that serves either engine (`parse_calls(done.reply, call_syntax(engine))`); a server that refuses
tools is one line. Against a fake OpenAI server, and end to end against `chatcli serve`."""

from __future__ import annotations

import json

import jsonschema
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from chatcli.engine import (
    CallScanner,
    Finished,
    FinishReason,
    Prefilled,
    SamplingParams,
    Token,
    ToolCalls,
    call_syntax,
    parse_calls,
)
from chatcli.engine.remote import RemoteEngine, RemoteError
from chatcli.engine.text.toolcalls import HERMES, Call
from tests.faults import scenario_app
from tests.servers import Server
from tests.test_server_tools import ASK, QWEN_TOOLS, SCHEMAS, TOOLS, tools_loaded, with_template  # noqa: F401

MODEL = "tools-model"
WEATHER = '{"city": "Paris", "unit": "celsius"}'


def _chunk(delta: dict | None = None, reason: str | None = None, usage: dict | None = None) -> bytes:
    body: dict = {"id": "x", "object": "chat.completion.chunk", "model": MODEL, "choices": []}
    if delta is not None or reason is not None:
        body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": reason}]
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _part(index: int | None = None, call_id=None, name=None, arguments=None) -> dict:
    part: dict = {} if index is None else {"index": index}
    if call_id is not None:
        part.update(id=call_id, type="function")
    function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
    return {**part, "function": function} if function else part


def _calls(*parts) -> dict:
    return {"tool_calls": list(parts)}


# Each scenario: the deltas of one streamed reply, then finish_reason "tool_calls" (or none: the stream ends).
SCENARIOS = {
    # text, then one call as llama-server and vLLM stream it: id and name, then argument fragments
    "fragments": [
        {"role": "assistant", "content": "Let me look."},
        _calls(_part(0, "call_a", "get_weather", "")),
        _calls(_part(0, arguments='{"city": ')),
        _calls(_part(0, arguments='"Paris", "un')),
        _calls(_part(0, arguments='it": "celsius"}')),
    ],
    # two calls, their fragments interleaved by index
    "parallel": [
        _calls(_part(0, "call_a", "get_weather", '{"city": "Paris",'), _part(1, "call_b", "search", "")),
        _calls(_part(1, arguments='{"query": "rain", "site": "news"}')),
        _calls(_part(0, arguments=' "unit": "celsius"}')),
    ],
    # ollama's way: each call whole in one part, without an index, its arguments an object
    "whole": [
        _calls(_part(None, "call_a", "get_weather", {"city": "Paris", "unit": "celsius"})),
        _calls(_part(None, "call_b", "search", {"query": "rain", "site": "news"})),
    ],
    # a function without parameters: empty arguments; and the stream ends without a finish_reason
    "bare": [_calls(_part(0, "call_a", "now", ""))],
}


def tools_app():
    bodies: list[dict] = []

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def chat(request: Request):
        scenario = request.path_params["scenario"]
        body = await request.json()
        bodies.append(body)
        if scenario == "refuse" and "tools" in body:  # llama-server without --jinja
            return JSONResponse({"error": {"code": 400, "message": "tools param requires --jinja flag"}}, 400)

        async def events():
            for delta in SCENARIOS.get(scenario, [{"content": "Fine."}]):
                yield _chunk(delta)
            if scenario != "bare":
                yield _chunk(reason="tool_calls" if scenario in SCENARIOS else "stop")
            yield _chunk(usage={"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = scenario_app(models, chat)
    app.state.bodies = bodies
    return app


@pytest.fixture(scope="module")
def fake():
    server = Server(tools_app()).start()
    yield server
    server.stop()


def remote(fake, scenario: str) -> RemoteEngine:
    return RemoteEngine(f"{fake.url}/{scenario}/v1", model=MODEL)


def turn(engine, messages=ASK, params=None) -> list:
    params = params or SamplingParams(temperature=0, max_tokens=64, tools=ToolCalls.of(TOOLS))
    return list(engine.generate(messages, engine.new_session(), params))


def calls_of(engine, events) -> tuple[str, list[Call]]:
    """The reply's text and calls, read whole from `Finished.reply` and, the same, from the streamed Tokens."""
    done = events[-1]
    assert isinstance(events[0], Prefilled) and isinstance(done, Finished) and done.error is None
    text = "".join(e.text for e in events if isinstance(e, Token))
    assert text == done.reply
    scanner = CallScanner(call_syntax(engine))
    pieces = [p for e in events if isinstance(e, Token) for p in scanner.push(e.text)] + scanner.finish()
    whole = parse_calls(done.reply, call_syntax(engine))
    assert whole == ("".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, Call)])
    return whole


# -- the reply's calls -------------------------------------------------------------------------


def test_a_call_streamed_in_fragments_is_one_call_after_the_text(fake):
    engine = remote(fake, "fragments")
    assert call_syntax(engine) == HERMES
    events = turn(engine)
    text, calls = calls_of(engine, events)
    assert text == "Let me look."
    assert calls == [Call("get_weather", WEATHER)]
    assert events[-1].finish_reason == FinishReason.STOP  # "tool_calls": as the in-process engine's reply of calls
    assert events[-1].stats.completion_tokens == 9


def test_parallel_calls_are_put_together_by_index_in_order(fake):
    engine = remote(fake, "parallel")
    text, calls = calls_of(engine, turn(engine))
    assert text == ""
    assert calls == [Call("get_weather", WEATHER), Call("search", '{"query": "rain", "site": "news"}')]


def test_whole_calls_without_an_index_are_each_a_call(fake):
    engine = remote(fake, "whole")
    _, calls = calls_of(engine, turn(engine))
    assert calls == [Call("get_weather", WEATHER), Call("search", '{"query": "rain", "site": "news"}')]


def test_a_call_with_no_arguments_at_a_stream_that_just_ends(fake):
    engine = remote(fake, "bare")
    events = turn(engine)
    assert calls_of(engine, events) == ("", [Call("now", "{}")])
    assert events[-1].finish_reason == FinishReason.LENGTH  # no finish_reason: it ran out, as before


def test_a_reply_without_calls_is_its_text():
    from chatcli.engine.remote_tools import CallParts

    assert CallParts().render(after_text=True) == ""


# -- what goes to the server -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("choice", "parallel", "sent"),
    [
        ("auto", True, "auto"),
        ("none", True, "none"),
        ("required", False, "required"),
        ("search", False, {"type": "function", "function": {"name": "search"}}),
    ],
)
def test_the_tools_and_their_choice_are_sent(fake, choice, parallel, sent):
    params = SamplingParams(temperature=0, max_tokens=64, tools=ToolCalls.of(TOOLS, choice, parallel))
    turn(remote(fake, "text"), params=params)
    body = fake.app.state.bodies[-1]
    assert body["tools"] == TOOLS
    assert body["tool_choice"] == sent
    assert body["parallel_tool_calls"] is parallel


def test_a_request_without_tools_sends_no_tool_fields(fake):
    turn(remote(fake, "text"), params=SamplingParams(temperature=0, max_tokens=8))
    body = fake.app.state.bodies[-1]
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(body)


def test_calls_and_results_in_the_conversation_go_as_openai_takes_them(fake):
    arguments = {"city": "Paris", "unit": "celsius"}
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    messages = [  # the engine's shapes (chatcli.server.tools.tool_message): arguments as an object
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 degrees and sunny"},
    ]
    done = turn(remote(fake, "text"), messages)[-1]
    assert done.reply == "Fine."
    sent = fake.app.state.bodies[-1]["messages"]
    assert sent[1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}
    ]
    assert sent[2] == messages[2] and sent[0] == ASK[0]
    assert call["function"]["arguments"] is arguments  # the caller's messages are left as they were


def test_a_server_that_refuses_tools_is_one_line_that_says_so(fake):
    with pytest.raises(RemoteError) as exc:
        turn(remote(fake, "refuse"))
    line = str(exc.value)
    assert "\n" not in line and "Traceback" not in line
    assert "answered 400: tools param requires --jinja flag (the request had tools" in line
    assert turn(remote(fake, "refuse"), params=SamplingParams(max_tokens=8))[-1].reply == "Fine."  # no tools: fine


# -- end to end: chatcli serve as the remote ---------------------------------------------------


@pytest.fixture(scope="module")
def qwen(tools_loaded):  # noqa: F811
    return with_template(tools_loaded, QWEN_TOOLS)


@pytest.mark.parametrize("choice", ["required", "search"])
def test_required_calls_round_trip_through_chatcli_serve(qwen, serve, choice):
    server = serve(qwen)
    engine = RemoteEngine(server.url).connect()
    tools = ToolCalls.of(TOOLS, choice, parallel=False)
    events = turn(engine, params=SamplingParams(temperature=0, max_tokens=600, tools=tools))
    text, calls = calls_of(engine, events)
    assert events[-1].finish_reason == FinishReason.STOP and text == ""
    assert len(calls) == 1 and calls[0].name in ({"get_weather", "search"} if choice == "required" else {choice})
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])
    # the call and its result go back, arguments as an object (the engine's shape), and the server answers
    call = {"id": "call_1", "type": "function", "function": {"name": calls[0].name, "arguments": {}}}
    call["function"]["arguments"] = json.loads(calls[0].arguments)
    messages = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"},
    ]
    params = SamplingParams(temperature=0, max_tokens=8, tools=ToolCalls.of(TOOLS, "none"))
    done = turn(engine, messages, params)[-1]
    assert done.error is None and done.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    prompt = qwen.tokenizer.encode_chat(messages, None)  # `none`: the tools not shown; the call and result are
    assert done.stats.prompt_tokens == len(prompt)
    assert call_syntax(qwen) == HERMES == qwen.tokenizer.tool_syntax  # the in-process engine's, the same way
