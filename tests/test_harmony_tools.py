"""gpt-oss's tool calls and past reasoning (issue 47 item 3, issue 48), on the tiny gpt-oss with Harmony's tokens
and template (`tests.gguf_oai`): a call under tool_choice required is the grammar's Harmony call, held to the
function's schema, read back as a call in serve's chat completions; a conversation's calls and reasoning render
through the file's own template (the reasoning as `thinking`, never `<think>` in content)."""

from __future__ import annotations

import json

import pytest

from chatcli.engine.params import ToolCalls
from chatcli.engine.text.toolcalls import HARMONY, parse_calls
from tests.servers import alone

UNIT = {"type": "object", "properties": {"unit": {"enum": ["celsius", "kelvin"]}}, "required": ["unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": UNIT}}]
ASK = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(scope="module")
def gptoss(tmp_path_factory):
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from tests.gguf_oai import tiny_gptoss, write_gptoss

    path = write_gptoss(tiny_gptoss(0), tmp_path_factory.mktemp("oai") / "gptoss.gguf", harmony=True, context=512)
    return load_engine(str(path), LoadOptions(device="cpu"))


def test_calls_and_reasoning_render_through_the_harmony_template(gptoss):
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"unit": "kelvin"}}}
    messages = [
        *ASK,
        {"role": "assistant", "content": "<think>The user wants weather.</think>", "tool_calls": [call]},
        {"role": "tool", "name": "get_weather", "content": "cold"},
        {"role": "assistant", "content": "<think>Say it.</think>It is cold."},
        {"role": "user", "content": "Thanks"},
    ]
    prompt = gptoss.tokenizer.render(messages, TOOLS)
    assert "<think>" not in prompt and "Say it." not in prompt  # a past final answer's reasoning is dropped
    assert (
        "<|start|>assistant<|channel|>analysis<|message|>The user wants weather.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"unit": "kelvin"}<|call|>'
    ) in prompt
    assert "<|channel|>final<|message|>It is cold.<|end|>" in prompt
    assert gptoss.tokenizer.tool_syntax == HARMONY


def test_a_harmony_template_given_as_a_file_takes_past_reasoning_as_thinking_too(gptoss, tmp_path):
    """`--chat-template FILE` with gpt-oss's template (a GGUF whose own is broken, or another version of it):
    the conversation goes to it as to the file's own, the reasoning in `thinking`, never `<think>` in content."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from tests.gguf_oai import HARMONY_TEMPLATE, tiny_gptoss, write_gptoss

    template = tmp_path / "gpt-oss.jinja"
    template.write_text(HARMONY_TEMPLATE, encoding="utf-8")
    path = write_gptoss(tiny_gptoss(0), tmp_path / "gptoss.gguf", harmony=True, context=512)
    chosen = load_engine(str(path), LoadOptions(device="cpu", chat_template=str(template))).tokenizer
    answered = {"role": "assistant", "content": "<think>Say it.</think>It is cold."}
    messages = [*ASK, answered, {"role": "user", "content": "Ok"}]
    assert chosen.chosen.label == "file gpt-oss.jinja"
    assert chosen.render(messages) == gptoss.tokenizer.render(messages)
    assert "<think>" not in chosen.render(messages)


def test_the_tokenizer_of_a_harmony_model_ends_replies_at_return_and_call(tmp_path):
    """The tokenizer's own stop ids, what the decode loop, the grammar's end and llguidance all read."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from chatcli.engine.text.templates import built_in
    from tests.gguf_oai import tiny_gptoss, write_gptoss

    path = write_gptoss(tiny_gptoss(0), tmp_path / "gptoss.gguf", harmony=True, context=512)
    tok = load_engine(str(path), LoadOptions(device="cpu")).tokenizer
    end, ret, call = (tok.added_tokens[t][0] for t in ("<|end|>", "<|return|>", "<|call|>"))
    assert end not in tok.stop_ids and {ret, call} <= tok.stop_ids
    tok.use_template(built_in("chatml"))  # --chat-template chatml: no Harmony channels, `<|end|>` ends again
    assert end in tok.stop_ids and not {ret, call} & tok.stop_ids


@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_a_forced_call_is_a_harmony_call_held_to_the_schema(gptoss, choice):
    for seed in (0, 1, 2):
        reply = alone(gptoss, ASK, temperature=1.0, seed=seed, max_tokens=60, tools=ToolCalls.of(TOOLS, choice))
        assert reply.startswith("<|channel|>commentary to=functions.get_weather<|message|>")
        text, calls = parse_calls(reply, HARMONY)
        assert text == "" and [c.name for c in calls] == ["get_weather"]
        assert json.loads(calls[0].arguments)["unit"] in ("celsius", "kelvin")


@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_a_forced_call_may_follow_the_models_analysis_and_still_comes_whole(gptoss, choice):
    """As gpt-oss writes a call, analysis first: where the budget has room for both, the grammar lets the model
    reason, and steering closes the analysis while the call's opening and arguments still fit (the tiny
    model's analysis would run to max_tokens: it never ends it by itself), so every reply holds one whole call."""
    reasoned = 0
    for seed in range(4):
        reply = alone(gptoss, ASK, temperature=1.0, seed=seed, max_tokens=140, tools=ToolCalls.of(TOOLS, choice))
        if reply.startswith("<think>"):
            reasoned += 1
            reply = reply.split("</think>", 1)[1]
        assert reply.startswith("<|channel|>commentary to=functions.get_weather<|message|>")
        text, calls = parse_calls(reply, HARMONY)
        assert text == "" and [c.name for c in calls] == ["get_weather"]
        assert json.loads(calls[0].arguments)["unit"] in ("celsius", "kelvin")
    assert reasoned >= 1  # the analysis was taken, and closed in time


def test_serve_returns_a_harmony_call_as_tool_calls(gptoss, serve):
    from openai import OpenAI

    server = serve(gptoss)
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["unit"] in ("celsius", "kelvin")


def test_a_harmony_call_reaches_every_api_as_its_own_call(gptoss, serve):
    """The same forced call through Anthropic's Messages, Ollama's chat and OpenAI's Responses, each with its own
    SDK: one get_weather call held to the schema, as that API gives a call, and no Harmony markup in any text."""
    from anthropic import Anthropic
    from ollama import Client
    from openai import OpenAI

    server = serve(gptoss)
    markup = ("<|channel|>", "<|message|>", "<|call|>", "to=functions")

    anthropic = Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    message = anthropic.messages.create(  # the SDK sends sampling fields in extra_body (2.x dropped them)
        model="tiny", max_tokens=60, messages=ASK, tool_choice={"type": "any"}, extra_body={"temperature": 0},
        tools=[{"name": "get_weather", "description": "weather", "input_schema": UNIT}],
    )  # fmt: skip
    uses = [b for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use" and [u.name for u in uses] == ["get_weather"]
    assert uses[0].input["unit"] in ("celsius", "kelvin")
    assert not any(m in b.text for b in message.content if b.type == "text" for m in markup)

    chat = Client(host=server.url, timeout=120).chat(
        model="tiny", messages=ASK, tools=TOOLS, options={"temperature": 0, "num_predict": 60}
    )
    assert all(m not in (chat.message.content or "") for m in markup)
    (call,) = chat.message.tool_calls  # Ollama has no tool_choice: this tiny model calls at temperature 0
    assert call.function.name == "get_weather" and call.function.arguments["unit"] in ("celsius", "kelvin")

    openai = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    done = openai.responses.create(
        model="tiny", input=ASK, tool_choice="required", max_output_tokens=60, temperature=0,
        tools=[{"type": "function", "name": "get_weather", "description": "weather", "parameters": UNIT}],
    )  # fmt: skip
    calls = [item for item in done.output if item.type == "function_call"]
    assert done.status == "completed" and [c.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].arguments)["unit"] in ("celsius", "kelvin")
    assert all(m not in done.output_text for m in markup)
