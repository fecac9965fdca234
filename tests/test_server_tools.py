"""Function calling in `chatcli serve` (issue 35): `tools`, `tool_choice` and `parallel_tool_calls`
through the real openai client, whole and streamed; every call of a required or named choice parses
and validates against its function's parameters, greedy and sampled; tool conversations render; bad
tools are one 400. On the tiny random model with a tools-aware (Qwen-style) template, its fallback
(a template without tools) and a Llama-3.1-style JSON template, and on the embedded SmolLM2."""

from __future__ import annotations

import copy
import json

import httpx
import jsonschema
import pytest

from chatcli.engine import SamplingParams, ToolCalls
from chatcli.engine.engine import Engine
from chatcli.engine.events import Token
from chatcli.engine.text.tokenize import TransformersTokenizer
from chatcli.engine.text.toolcalls import (
    HERMES,
    LLAMA3,
    MISTRAL,
    Call,
    CallScanner,
    call_text,
    parse_calls,
    syntax_of,
)
from tests.servers import ALIAS, leaves, slow_endless
from tests.tiny import CHATML

# A Qwen2.5-style template (the tools in the system turn, calls as <tool_call> blocks, results as
# <tool_response> in a user turn), written with expressions only: transformers trims block newlines.
QWEN_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Llama 3.1's JSON tool calling, on the tiny model's ChatML markers.
LLAMA_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\nRespond with a JSON for a function call, in the format "
    '{"name": function name, "parameters": dictionary of argument name and its value}.\\n\' }}'
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.tool_calls %}{{- '<|im_start|>assistant\\n' }}"
    '{%- for tc in message.tool_calls %}{{- \'{"name": "\' + tc.function.name + \'", "parameters": \' }}'
    "{{- tc.function.arguments | tojson }}{{- '}' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}{{- '<|im_start|>ipython\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# A Mistral v0.3-style template: the tools in `[AVAILABLE_TOOLS]`, calls as `[TOOL_CALLS]` and a JSON list, and
# (as Mistral's own templates do) a call's id refused unless it is 9 letters and digits.
MISTRAL_TOOLS = (
    "{%- if tools %}{{- '[AVAILABLE_TOOLS] ' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.tool_calls %}{{- '[TOOL_CALLS] [' }}"
    "{%- for tc in message.tool_calls %}{%- if tc.id is not defined or tc.id | length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    '{{- \'{"name": "\' + tc.function.name + \'", "arguments": \' }}'
    "{{- tc.function.arguments | tojson }}{{- '}' }}{%- endfor %}{{- ']</s>' }}"
    "{%- elif message.role == 'tool' %}{{- '[TOOL_RESULTS] ' + message.content + '[/TOOL_RESULTS]' }}"
    "{%- elif message.role == 'user' %}{{- '[INST] ' + message.content + '[/INST]' }}"
    "{%- else %}{{- message.content + '</s>' }}{%- endif %}{%- endfor %}"
)

# Bounded strings, so that even the tiny random model's calls end well within max_tokens.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "maxLength": 10},
                "limit": {"type": "integer", "minimum": 1, "maximum": 5},
                "site": {"$ref": "#/$defs/site"},
            },
            "required": ["query", "site"],
            "$defs": {"site": {"enum": ["web", "news"]}},
        },
    },
}
TOOLS = [WEATHER, SEARCH]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tools_loaded(tmp_path_factory):
    """The tiny random model with room for a tools prompt (2048 positions)."""
    from chatcli.engine.load.hf import LoadOptions, load
    from tests.tiny import build_tiny_model_dir

    folder = build_tiny_model_dir(tmp_path_factory.mktemp("tiny-tools"), max_positions=2048)
    return load(str(folder), LoadOptions(device="cpu"))


def with_template(loaded, template: str, runner=None) -> Engine:
    """The tiny model under `template` (the runner shared where given)."""
    from chatcli.engine.load.hf import build_engine

    tokenizer = copy.deepcopy(loaded.tokenizer)
    tokenizer.chat_template = template
    if runner is not None:
        return Engine(runner, TransformersTokenizer(tokenizer, loaded.model.config), "tiny")
    from dataclasses import replace

    return build_engine(replace(loaded, tokenizer=tokenizer), runner="lean", kv_dtype="float32", kernel=False)


@pytest.fixture(scope="module")
def qwen(tools_loaded):
    return with_template(tools_loaded, QWEN_TOOLS)


@pytest.fixture(scope="module")
def fallback(tools_loaded, qwen):
    """The same model under the plain ChatML template, which knows no tools."""
    return with_template(tools_loaded, CHATML, qwen.runner)


@pytest.fixture(scope="module")
def llama(tools_loaded, qwen):
    return with_template(tools_loaded, LLAMA_TOOLS, qwen.runner)


@pytest.fixture(scope="module")
def mistral(tools_loaded, qwen):
    return with_template(tools_loaded, MISTRAL_TOOLS, qwen.runner)


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def ask(server, **fields):
    fields = {"model": "tiny", "messages": ASK, "tools": TOOLS, "max_tokens": 600, **fields}
    return client(server).chat.completions.create(**fields)


def validated(calls) -> list[tuple[str, dict]]:
    """(name, arguments) of each call, each checked: a known function, arguments valid against its schema, an id
    of OpenAI's shape (or Mistral's: 9 letters and digits)."""
    out = []
    for call in calls:
        assert call.type == "function" and (call.id.startswith("call_") or (len(call.id) == 9 and call.id.isalnum()))
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        out.append((call.function.name, arguments))
    return out


def streamed(server, **fields):
    """The openai client's own reassembly of a streamed reply (`chat.completions.stream`; where it raises
    for finish_reason length, the completion it holds)."""
    from openai import LengthFinishReasonError

    fields = {"model": "tiny", "messages": ASK, "tools": TOOLS, "max_tokens": 600, **fields}
    chunks = []
    try:
        with client(server).chat.completions.stream(**fields) as stream:
            chunks += [event.chunk for event in stream if event.type == "chunk"]
            return stream.get_final_completion(), chunks
    except LengthFinishReasonError as exc:
        return exc.completion, chunks


# -- required, named, none, auto ----------------------------------------------------------------


def test_required_calls_parse_and_validate_greedy_and_sampled(qwen, serve):
    """The tiny random model writes noise unconstrained; under `required` each of 20 sampled replies
    (and the greedy one) is calls that parse and validate, with finish_reason tool_calls."""
    server = serve(qwen)
    seen = set()
    for seed in [None, *range(20)]:
        sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
        done = ask(server, tool_choice="required", **sampling)
        choice = done.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        calls = validated(choice.message.tool_calls)
        assert calls
        seen.update(name for name, _ in calls)
    assert seen == {"get_weather", "search"}  # sampling reaches both functions
    free = ask(server, temperature=0, tool_choice="auto")  # what the grammar is for
    assert not free.choices[0].message.tool_calls and free.choices[0].finish_reason != "tool_calls"


def test_a_streamed_call_is_reassembled_by_the_openai_client(qwen, serve):
    server = serve(qwen)
    whole = ask(server, tool_choice="required", temperature=0)
    final, chunks = streamed(server, tool_choice="required", temperature=0)
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert validated(message.tool_calls) == validated(whole.choices[0].message.tool_calls)
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    first = deltas[0]  # as OpenAI streams a call: id, type and name with empty arguments, then the arguments
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name and first.function.arguments == ""
    assert deltas[1].id is None and deltas[1].function.arguments == message.tool_calls[0].function.arguments
    for seed in range(5):
        final, _ = streamed(server, tool_choice="required", temperature=1.0, seed=seed)
        assert validated(final.choices[0].message.tool_calls)


def test_a_named_function_is_called_once(qwen, serve):
    """A named tool_choice gives exactly one call of that function (OpenAI's behaviour), parallel calls
    allowed or not: the grammar allowed up to 16, and a small model made them."""
    server = serve(qwen)
    named = {"type": "function", "function": {"name": "search"}}
    for seed in (None, *range(8)):
        sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
        done = ask(server, tool_choice=named, **sampling)
        assert [name for name, _ in validated(done.choices[0].message.tool_calls)] == ["search"]
        assert done.choices[0].finish_reason == "tool_calls"
        final, _ = streamed(server, tool_choice=named, **sampling)
        assert [name for name, _ in validated(final.choices[0].message.tool_calls)] == ["search"]
    raw = SamplingParams(temperature=1.0, max_tokens=600, tools=ToolCalls.of(TOOLS, "search"))
    for seed in range(8):  # the reply itself holds one call, not only what the server returns
        reply = list(qwen.generate(ASK, qwen.new_session(), raw.with_(seed=seed)))[-1].reply
        assert len(parse_calls(reply)[1]) == 1, reply


def test_none_is_text_without_the_tools_in_the_prompt(qwen, serve):
    server = serve(qwen)
    none = ask(server, tool_choice="none", temperature=0, max_tokens=20)
    plain = client(server).chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=20)
    auto = ask(server, tool_choice="auto", temperature=0, max_tokens=20)
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length")
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens < auto.usage.prompt_tokens


def test_auto_is_the_engines_reply(qwen, serve):
    """Under auto the reply is what the model writes with the tools in its prompt: its text free but for
    call markup, its calls held (the engine's own reply, the same through the server)."""
    server = serve(qwen)
    done = ask(server, tool_choice="auto", temperature=0, max_tokens=30)
    params = SamplingParams(temperature=0, max_tokens=30, tools=ToolCalls.of(TOOLS))
    events = list(qwen.generate(ASK, qwen.new_session(), params))
    assert done.choices[0].message.content == events[-1].reply
    assert len(qwen.tokenizer.encode_chat(ASK, TOOLS)) == done.usage.prompt_tokens


def scripted(engine, reply: str, monkeypatch):
    """Make the model write `reply` (then end its turn): each forward's logits put it all on the
    script's next id, counted from the assistant's opening in the cache."""
    import numpy as np

    script = engine.tokenizer.encode(reply) + [engine.tokenizer.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    opening = engine.tokenizer.encode("<|im_start|>assistant\n")
    forward = engine.runner.forward

    def forced(ids, cache):
        logits = forward(ids, cache)
        held = cache.ids
        starts = [i + len(opening) for i in range(len(held)) if held[i : i + len(opening)] == opening]
        if not starts:  # a prefill chunk before the assistant's turn
            return logits
        out = np.full_like(logits, -1e9)
        out[script[min(len(held) - starts[-1], len(script) - 1)]] = 0
        return out

    monkeypatch.setattr(engine.runner, "forward", forced)


CALLS = (
    'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "search", "arguments": {"query": "rain", "site": "news"}}\n</tool_call>'
)


def test_calls_written_under_auto_are_read_whole_and_streamed(fallback, serve, monkeypatch):
    """A reply with text and two calls (the Hermes syntax), as a model might write it under auto: the
    text is the content, the calls the tool_calls; one call only where parallel calls are not allowed."""
    scripted(fallback, CALLS, monkeypatch)
    server = serve(fallback, defaults=SamplingParams(lookup=0))
    want = [("get_weather", {"city": "Paris", "unit": "celsius"}), ("search", {"query": "rain", "site": "news"})]
    done = ask(server, temperature=0)
    assert done.choices[0].message.content == "Let me look."
    assert validated(done.choices[0].message.tool_calls) == want and done.choices[0].finish_reason == "tool_calls"
    final, chunks = streamed(server, temperature=0)
    assert final.choices[0].message.content == "Let me look."
    assert validated(final.choices[0].message.tool_calls) == want
    assert [c.choices[0].delta.tool_calls[0].index for c in chunks if c.choices and c.choices[0].delta.tool_calls] == [
        0,
        0,
        1,
        1,
    ]
    one = ask(server, temperature=0, parallel_tool_calls=False)
    assert validated(one.choices[0].message.tool_calls) == want[:1]
    final, _ = streamed(server, temperature=0, parallel_tool_calls=False)
    assert validated(final.choices[0].message.tool_calls) == want[:1]
    none = ask(server, temperature=0, tool_choice="none")  # read as text
    assert none.choices[0].message.tool_calls is None and "<tool_call>" in none.choices[0].message.content


def test_parallel_calls_where_allowed_one_call_where_not(qwen, serve):
    server = serve(qwen)
    counts = []
    for seed in range(12):
        done = ask(server, tool_choice="required", temperature=1.0, seed=seed)
        counts.append(len(validated(done.choices[0].message.tool_calls)))
        one = ask(server, tool_choice="required", temperature=1.0, seed=seed, parallel_tool_calls=False)
        assert len(validated(one.choices[0].message.tool_calls)) == 1
    assert max(counts) > 1, counts  # the grammar lets the model make several


def test_a_call_cut_by_max_tokens_is_dropped_never_closed_inside_a_string(qwen, serve):
    """Strings without a maxLength: the random model writes them until max_tokens. Its call is not
    closed by force inside the string (it came back as a call of junk arguments with finish_reason
    length): a call the model finishes is whole (finish_reason tool_calls), one it cannot finish within
    max_tokens is dropped (no call, no markup in content, finish_reason length), streamed or not."""
    note = {"type": "object", "properties": {"text": {"type": "string"}, "tags": {"type": "array"}}}
    tool = {"type": "function", "function": {"name": "note", "parameters": {**note, "required": ["text", "tags"]}}}
    server = serve(qwen)
    reasons = []
    for seed in range(8):
        fields = {"tools": [tool], "tool_choice": "required", "temperature": 1.0, "seed": seed, "max_tokens": 100}
        done = ask(server, parallel_tool_calls=False, **fields)
        final, _ = streamed(server, parallel_tool_calls=False, **fields)
        for reply in (done, final):
            choice = reply.choices[0]
            assert not choice.message.content, choice.message.content
            calls = choice.message.tool_calls or []
            for call in calls:
                jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
            assert choice.finish_reason == ("tool_calls" if calls else "length"), (choice.finish_reason, calls)
            assert reply.usage is None or reply.usage.completion_tokens <= 100
        reasons.append(done.choices[0].finish_reason)
    assert "length" in reasons, reasons  # the random model does run out of room


def test_call_markup_never_reaches_the_content(qwen, serve):
    """A reply cut inside its call (max_tokens 12): the call is dropped, not returned as content (the
    raw `<tool_call>` markup came back as content), streamed or not; finish_reason length."""
    server = serve(qwen)
    for seed in (None, 1, 2):
        sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
        done = ask(server, tool_choice="required", max_tokens=12, **sampling)
        final, chunks = streamed(server, tool_choice="required", max_tokens=12, **sampling)
        for reply in (done, final):
            choice = reply.choices[0]
            assert not choice.message.content and not choice.message.tool_calls, choice.message
            assert choice.finish_reason == "length"
        assert not any(c.choices and c.choices[0].delta.content for c in chunks)


TWICE = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
)


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_a_call_already_made_is_not_made_again(fallback, serve, monkeypatch, choice):
    """A model that writes the same call twice (as the embedded model did, up to 16 times): the grammar's
    mask refuses the second at its last id, so the reply itself never holds it twice; the server gives
    the call once, with finish_reason tool_calls."""
    scripted(fallback, TWICE, monkeypatch)
    server = serve(fallback, defaults=SamplingParams(lookup=0))
    params = SamplingParams(temperature=0, max_tokens=200, lookup=0, tools=ToolCalls.of(TOOLS, choice))
    reply = list(fallback.generate(ASK, fallback.new_session(), params))[-1].reply
    made = [(c.name, json.loads(c.arguments)) for c in parse_calls(reply)[1]]
    assert made[0] == ("get_weather", {"city": "Paris", "unit": "celsius"}) and made.count(made[0]) == 1, reply
    for reply in (
        ask(server, tool_choice=choice, temperature=0),
        streamed(server, tool_choice=choice, temperature=0)[0],
    ):
        calls = validated(reply.choices[0].message.tool_calls)
        assert calls[0] == made[0] and calls.count(made[0]) == 1 and reply.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("template", ["qwen", "fallback", "llama", "mistral"])
def test_sampled_calls_are_whole_distinct_and_never_content(template, request, serve):
    """Every syntax, required and auto, sampled, max_tokens 80 (room for a call or two): each call
    validates, no call twice, no call markup of any syntax in the content, and finish_reason tool_calls
    wherever there are calls (they were closed inside their strings to fit, and ended `length`)."""
    engine = request.getfixturevalue(template)
    server = serve(engine)
    for choice in ("required", "auto"):
        for seed in range(6):
            done = ask(server, tool_choice=choice, temperature=1.0, seed=seed, max_tokens=80)
            final, _ = streamed(server, tool_choice=choice, temperature=1.0, seed=seed, max_tokens=80)
            for reply in (done, final):
                choice_ = reply.choices[0]
                calls = validated(choice_.message.tool_calls or [])
                assert len({json.dumps(c, sort_keys=True) for c in calls}) == len(calls), calls
                content = choice_.message.content or ""
                assert not any(m in content for m in ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "python_tag"))
                if calls:
                    assert choice_.finish_reason == "tool_calls"
                if choice == "required":  # calls, or none where the one begun was cut (dropped)
                    assert not content and (calls or choice_.finish_reason == "length")


def test_drafts_under_a_required_call_give_the_single_step_reply(qwen):
    if not qwen.runner.exact_verify:
        pytest.skip("this runner does not draft")
    params = SamplingParams(temperature=0, max_tokens=300, tools=ToolCalls.of(TOOLS, "required"))
    messages = [{"role": "user", "content": 'Call {"name": "get_weather", "arguments": {"city": "Paris"}}'}]
    runs = [list(qwen.generate(messages, qwen.new_session(), params.with_(lookup=n))) for n in (8, 0)]
    ids = [[e.token_id for e in events if isinstance(e, Token)] for events in runs]
    assert ids[0] == ids[1] and runs[0][-1].stats.draft_tokens > 0
    assert parse_calls(runs[0][-1].reply)[1]


def test_a_response_format_beside_auto_tools_is_that_json_or_calls(qwen):
    from chatcli.engine import ResponseFormat

    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    for seed in range(6):
        params = SamplingParams(
            temperature=1.0,
            seed=seed,
            max_tokens=300,
            tools=ToolCalls.of(TOOLS),
            response_format=ResponseFormat.json_schema(schema),
        )
        reply = list(qwen.generate(ASK, qwen.new_session(), params))[-1].reply
        text, calls = parse_calls(reply)
        if calls:
            assert not text.strip()
        else:
            jsonschema.validate(json.loads(reply), schema)


# -- conversations with calls and results ------------------------------------------------------


def round_trip(arguments='{"city": "Paris", "unit": "celsius"}', call_id: str = "call_1"):
    call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": "18 degrees and sunny"},
    ]


@pytest.mark.parametrize("template", ["qwen", "fallback"])
def test_a_conversation_with_a_call_and_its_result_renders_and_answers(template, request, serve):
    engine = request.getfixturevalue(template)
    server = serve(engine)
    done = ask(server, messages=round_trip(), temperature=0, max_tokens=10)
    assert done.choices[0].finish_reason in ("stop", "length")
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 degrees and sunny"},
    ]
    ids = engine.tokenizer.encode_chat(messages, TOOLS)
    assert done.usage.prompt_tokens == len(ids)  # the server's messages are these, arguments as an object
    text = engine.tokenizer.decode(ids, skip_special_tokens=False)
    call = call_text("get_weather", {"city": "Paris", "unit": "celsius"})
    assert call in text and "<tool_response>\n18 degrees and sunny\n</tool_response>" in text and "<tools>" in text
    if template == "fallback":  # the result is a user turn; the system turn lists the tools
        assert "<|im_start|>user\n<tool_response>" in text
        assert "<|im_start|>system\nYou may call functions" in text


# -- the Llama 3.1 JSON syntax -------------------------------------------------------------------


def test_llama_json_calls(llama, serve):
    assert llama.tokenizer.tool_syntax == LLAMA3
    server = serve(llama)
    for seed in (None, 1, 2):
        sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
        done = ask(server, tool_choice="required", **sampling)
        assert len(validated(done.choices[0].message.tool_calls)) == 1  # Llama 3.1 calls one at a time
        final, _ = streamed(server, tool_choice="required", **sampling)
        assert validated(final.choices[0].message.tool_calls) == validated(done.choices[0].message.tool_calls)


def test_mistral_list_calls(mistral, serve):
    """Mistral's syntax: calls held to a JSON list (one or more), read back the same streamed or not; a
    conversation with a call and its result renders in the template's own words."""
    assert mistral.tokenizer.tool_syntax == MISTRAL
    server = serve(mistral)
    for seed in (None, 1, 2):
        sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
        one = {"tool_choice": "required", "parallel_tool_calls": False, **sampling}
        done = ask(server, **one)
        calls = validated(done.choices[0].message.tool_calls)
        assert len(calls) == 1 and done.choices[0].finish_reason == "tool_calls"
        final, _ = streamed(server, **one)
        assert validated(final.choices[0].message.tool_calls) == calls
        for reply in (done, final):  # the ids the server gave come back in the template, which takes them
            (call,) = reply.choices[0].message.tool_calls
            assert len(call.id) == 9 and call.id.isalnum()
            result = {"role": "tool", "tool_call_id": call.id, "content": "sunny"}
            follow = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]}, result]
            assert ask(server, messages=follow, temperature=0, max_tokens=4).choices[0].finish_reason
    several = ask(server, tool_choice="required", temperature=0, max_tokens=900)  # a list of up to MAX_CALLS
    assert len(validated(several.choices[0].message.tool_calls)) >= 1
    done = ask(server, messages=round_trip(call_id="a1b2c3d4e"), temperature=0, max_tokens=10)  # call, result
    assert done.choices[0].finish_reason in ("stop", "length")
    call = {"id": "a1b2c3d4e", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    turns = [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "sunny"}]
    text = mistral.tokenizer.decode(mistral.tokenizer.encode_chat(turns, TOOLS), skip_special_tokens=False)
    assert "[TOOL_CALLS] " + call_text("get_weather", {"city": "Paris"}, MISTRAL) in text
    assert "[TOOL_RESULTS] sunny[/TOOL_RESULTS]" in text and "[AVAILABLE_TOOLS]" in text


def test_mistral_scanner():
    two = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "search", "arguments": {}}]'
    for text in (two, two.removeprefix("[TOOL_CALLS]"), "\n" + two):  # the token is special: often not in the text
        content, calls = parse_calls(text, MISTRAL)
        assert content == "" and calls == [Call("get_weather", '{"city": "Rome"}'), Call("search", "{}")]
        for size in (1, 5):
            scanner = CallScanner(MISTRAL)
            pieces = [p for i in range(0, len(text), size) for p in scanner.push(text[i : i + size])]
            assert pieces == [] and scanner.finish() == calls  # held to the end, read whole
    for text in ("[a link](x) and text", "[]", "[1, 2]", "plain words"):
        assert parse_calls(text, MISTRAL) == (text, [])  # not calls: text, as it was
    assert parse_calls('[{"name": 3}]', MISTRAL) == ("", [])  # a list of calls that does not parse: dropped
    scanner = CallScanner(MISTRAL)
    assert scanner.push("Sure") == ["Sure"]  # text that cannot open a call is not held
    assert call_text("f", {"a": 1}, MISTRAL) == '[{"name": "f", "arguments": {"a": 1}}]'
    assert syntax_of(MISTRAL_TOOLS) == MISTRAL and syntax_of(LLAMA_TOOLS) == LLAMA3


def test_syntax_and_scanner():
    assert syntax_of(QWEN_TOOLS) == HERMES and syntax_of(LLAMA_TOOLS) == LLAMA3 and syntax_of(CHATML) == HERMES
    text, calls = parse_calls(CALLS)
    assert text == "Let me look." and [c.name for c in calls] == ["get_weather", "search"]
    for size in (1, 3, 7):  # any split of the stream gives the same pieces
        scanner = CallScanner()
        pieces = [p for i in range(0, len(CALLS), size) for p in scanner.push(CALLS[i : i + size])]
        pieces += scanner.finish()
        assert "".join(p for p in pieces if isinstance(p, str)) == text
        assert [p for p in pieces if not isinstance(p, str)] == calls
    broken = "<tool_call>\n{not json}\n</tool_call> and <tool_call>\n{"
    assert parse_calls(broken) == (" and ", [])  # what does not parse is dropped, never text
    scanner = CallScanner()
    assert scanner.push(broken) == [] and "".join(scanner.finish()) == " and " and scanner.cut  # the last was cut
    whole = '<tool_call>\n{"name": "f", "arguments": {}}'
    for tail in ("", "\n</tool_", "\n</tool_call>\n<tool_"):  # the call whole, what follows cut
        scanner = CallScanner()
        assert scanner.push(whole + tail) + scanner.finish() == [Call("f", "{}")]
        assert scanner.cut == tail.endswith("<tool_"), tail
    tagged = '<tool_call>\n{"name": "f", "arguments": {"s": "a</tool_call>b"}}\n</tool_call>'
    for size in (1, 4, len(tagged)):  # the tag inside a string does not end the block
        scanner = CallScanner()
        pieces = [p for i in range(0, len(tagged), size) for p in scanner.push(tagged[i : i + size])]
        assert pieces + scanner.finish() == [Call("f", '{"s": "a</tool_call>b"}')]
    text, calls = parse_calls("<tool_call>{bad}</tool_call> then " + tagged)
    assert text == " then" and calls == [Call("f", '{"s": "a</tool_call>b"}')]
    assert parse_calls("  x < y\n") == ("  x < y\n", [])
    llama_call = '<|python_tag|>{"name": "search", "parameters": {"query": "a"}}'
    assert parse_calls(llama_call, LLAMA3)[1][0].arguments == '{"query": "a"}'
    assert parse_calls("{not a call", LLAMA3) == ("", [])  # a call begun, never finished: dropped
    assert parse_calls("Sure, {x} it is", LLAMA3) == ("Sure, {x} it is", [])


# -- bad tools -----------------------------------------------------------------------------------

OPEN = {"type": "object", "properties": {f"p{i}": {"enum": ["a", "b"]} for i in range(2000)}}
BAD_PROPERTY = {"type": "object", "properties": {"x": {"type": "nosuchtype"}}}  # the grammar engine refuses it


def function(name="f", parameters=None):
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


@pytest.mark.parametrize(
    "fields,param,words",
    [
        ({"tools": [{"type": "retrieval"}]}, "tools", "tools[0] must be an object of type function"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools", "with a name"),
        ({"tools": [function("no spaces")]}, "tools", "letters, digits"),
        ({"tools": [function(parameters=[1])]}, "tools[0].function.parameters", "JSON schema object"),
        ({"tools": [function(), function("g", {"type": "string"})]}, "tools[1].function.parameters", "type object"),
        ({"tools": [function(), function()]}, "tools", "twice"),
        ({"tools": {"f": 1}}, "tools", "array"),
        ({"tools": [function(parameters=BAD_PROPERTY)]}, "tools", "tools[0] (f)"),
        ({"tools": [function(), function("g", {"$ref": "#/$defs/missing"})]}, "tools", "tools[1] (g)"),
        ({"tools": [function(parameters=OPEN)]}, "tools", "too large or too open"),
        (  # beside a good response_format, the bad tool is named
            {"tools": [function(parameters=BAD_PROPERTY)], "response_format": {"type": "json_object"}},
            "tools",
            "tools[0] (f)",
        ),
        ({"tools": [function()], "tool_choice": {"type": "function", "function": {"name": "h"}}}, "tool_choice", "'h'"),
        ({"tools": [function()], "tool_choice": "always"}, "tool_choice", "tool_choice must be"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": [function()], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
        ({"functions": [{"name": "f"}]}, "functions", "send tools"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "tool_call_id"),
        (
            {"messages": round_trip("{not json")},
            "messages[1].tool_calls[0].function.arguments",
            "not JSON",
        ),
    ],
)
def test_bad_tools_are_one_clear_400(qwen, serve, fields, param, words):
    server = serve(qwen)
    r = server.post({"messages": ASK, "max_tokens": 5, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"] and "\n" not in error["message"], error
    assert httpx.get(server.url + "/health").json()["requests"]["failed"] == 0  # refused before any work


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "say"}}, "auto"])
@pytest.mark.parametrize("parameters", [{"type": "string"}, {"type": ["object", "null"]}, {"type": "array"}])
def test_parameters_that_are_not_an_object_are_a_400_through_the_openai_client(qwen, serve, choice, parameters):
    """A call's arguments are a JSON object: parameters of another type are refused, as OpenAI refuses them
    (`invalid_function_parameters`, naming the tool's parameters), not answered with a call the reply cannot
    hold (it came back as content, finish_reason "length")."""
    import openai

    server = serve(qwen)
    tool = {"type": "function", "function": {"name": "say", "parameters": parameters}}
    with pytest.raises(openai.BadRequestError) as refused:
        client(server).chat.completions.create(
            model="tiny", messages=ASK, tools=[tool], tool_choice=choice, max_tokens=25, temperature=0
        )
    error = refused.value
    assert error.status_code == 400 and error.code == "invalid_function_parameters"
    assert error.param == "tools[0].function.parameters" and "'say'" in error.message and "type object" in error.message


def test_parameters_that_do_not_say_their_type_are_an_objects(qwen, serve):
    """A schema without `type` (only `properties`) is taken as an object's: the required call parses."""
    server = serve(qwen)
    untyped = {"properties": {"city": {"type": "string"}}, "required": ["city"]}
    tool = {"type": "function", "function": {"name": "where", "parameters": untyped}}
    done = ask(server, tools=[tool], tool_choice="required", temperature=0, max_tokens=200)
    calls = done.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "where" and isinstance(json.loads(calls[0].function.arguments), dict)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_tool_turn_whose_client_leaves_is_cancelled(tools_loaded, serve, choice, stream):
    """A turn with tools, free or held to calls, streamed or not, stops when its client leaves (0.5 s a
    forward: a required call, drafted, was once whole in 7 forwards, 0.7 s at 0.1 s a forward, before the
    client's 0.5 s without a byte was up)."""
    server = serve(slow_endless(with_template(tools_loaded, QWEN_TOOLS), 0.5))
    leaves(server, "/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "tool_choice": choice, "stream": stream})


def test_a_pydantic_tool_is_parsed_by_the_openai_client(qwen, serve):
    """`openai.pydantic_function_tool`: a strict schema with $defs; `parse` gives the model back."""
    from typing import Literal

    import openai
    from pydantic import BaseModel, Field

    class Place(BaseModel):
        city: str = Field(max_length=6)
        kind: Literal["town", "city"]

    class Lookup(BaseModel):
        place: Place
        days: int = Field(ge=1, le=7)

    server = serve(qwen)
    done = client(server).chat.completions.parse(
        model="tiny", messages=ASK, tools=[openai.pydantic_function_tool(Lookup)], tool_choice="required", temperature=0
    )
    parsed = done.choices[0].message.tool_calls[0].function.parsed_arguments
    assert isinstance(parsed, Lookup) and isinstance(parsed.place, Place)


# -- the embedded model (the fallback: SmolLM2's template has no tools) -------------------------

REAL_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"],
            },
        },
    }
]


@pytest.mark.real_model
def test_the_embedded_model_calls_and_answers_the_result(real_default, serve):
    server = serve(real_default)
    schema = REAL_TOOLS[0]["function"]["parameters"]
    for seed in (1, 2, 3):
        done = ask(server, tools=REAL_TOOLS, tool_choice="required", temperature=1.0, seed=seed, max_tokens=300)
        for call in done.choices[0].message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), schema)
    done = ask(server, tools=REAL_TOOLS, tool_choice="required", temperature=0, max_tokens=300)
    call = done.choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments)["city"] == "Paris"
    conversation = [
        *ASK,
        done.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "sunny"}'},
    ]
    answer = ask(server, tools=REAL_TOOLS, messages=conversation, temperature=0, max_tokens=40)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


def test_the_params_carry_the_tools():
    tools = ToolCalls.of(TOOLS, "search", parallel=False)
    assert tools.forced and [f["name"] for f in tools.callable()] == ["search"]
    assert ToolCalls.of(TOOLS, "none").offered() is None and ToolCalls.of(TOOLS).callable() == [
        t["function"] for t in TOOLS
    ]
    with pytest.raises(ValueError, match="names no function"):
        ToolCalls.of(TOOLS, "nope")


@pytest.mark.real_model
def test_the_embedded_model_makes_whole_calls_within_max_tokens(real_default, serve):
    """The embedded model under `required` and a named function, sampled, max_tokens 60 (a valid call
    came with a junk one or was cut, finish_reason length, and the openai client's `.parse()` and
    `.stream()` raised): each reply is calls, whole, distinct and valid, finish_reason tool_calls, and
    neither helper raises; a named function is called once."""
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in REAL_TOOLS]  # as `.parse()` asks
    schema = REAL_TOOLS[0]["function"]["parameters"]
    server = serve(real_default)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        for seed in range(4):
            fields = dict(model=ALIAS, messages=ASK, tools=strict, tool_choice=choice, max_tokens=60)
            fields.update(temperature=1.0, seed=seed)
            parsed = client(server).chat.completions.parse(**fields)
            with client(server).chat.completions.stream(**fields) as stream:
                final = stream.get_final_completion()
            for reply in (parsed, final):
                assert reply.choices[0].finish_reason == "tool_calls" and not reply.choices[0].message.content
                calls = [json.loads(c.function.arguments) for c in reply.choices[0].message.tool_calls]
                for arguments in calls:
                    jsonschema.validate(arguments, schema)
                assert len({json.dumps(a, sort_keys=True) for a in calls}) == len(calls) >= 1
                assert choice == "required" or len(calls) == 1


def test_a_call_whose_string_loops_is_taken_back_to_its_first_cycle_and_closed(real_default, serve):
    """No max_tokens (an agent's request: the server's budget is the context) and a model caught in a loop
    inside a call's string (here by a logit bias on " Paris", which a string takes anywhere): once the string
    has repeated one short cycle over `loops.LOOP_IDS` ids, its repeats are taken back (the grammar, the KV
    cache, the events held while the string ran) and the string closes after the cycle's first time; the
    calls end whole (`tool_calls`), not as a cut call dropped thousands of ids later at the context's end."""
    loop = real_default.tokenizer.encode(" Paris")[0]
    server = serve(real_default)
    for stream in (False, True):
        fields = dict(model=ALIAS, messages=ASK, tools=REAL_TOOLS, tool_choice="required", temperature=0)
        reply = client(server).chat.completions.create(**fields, logit_bias={str(loop): 100}, stream=stream)
        if stream:
            chunks = list(reply)
            reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert reasons == ["tool_calls"]
            assert not any(c.choices[0].delta.content for c in chunks if c.choices)
            arguments: dict[int, str] = {}
            for call in (t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()):
                arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
            cities = [json.loads(a)["city"] for a in arguments.values()]
        else:
            choice = reply.choices[0]
            assert choice.finish_reason == "tool_calls" and not choice.message.content
            cities = [json.loads(c.function.arguments)["city"] for c in choice.message.tool_calls]
            assert reply.usage.completion_tokens < 200  # the calls as they stand: no repeats counted
        assert cities and set(cities) == {" Paris"}


def test_a_looping_string_s_repeats_never_reach_the_events(real_default):
    """The engine's own events for the same reply: every Token sent is one of the reply's ids as it stands,
    their texts are the reply, and the taken-back ids (hundreds) never came out."""
    from chatcli.engine import SamplingParams, Token
    from chatcli.engine.params import ToolCalls

    loop = real_default.tokenizer.encode(" Paris")[0]
    params = SamplingParams(
        temperature=0, max_tokens=4000, tools=ToolCalls.of(REAL_TOOLS, "required"), logit_bias=((loop, 100.0),)
    )
    session = real_default.new_session()
    events = list(real_default.generate(ASK, session, params))
    tokens, finished = [e for e in events if isinstance(e, Token)], events[-1]
    assert "".join(t.text for t in tokens) == finished.reply and finished.reply.count(" Paris") <= 4
    assert [t.completion_tokens for t in tokens if t.token_id >= 0] == list(
        range(1, finished.stats.completion_tokens + 1)
    )
    reply_ids = [t.token_id for t in tokens if t.token_id >= 0]
    cached = list(session.cache.ids[finished.stats.prompt_tokens :])  # the KV cache: the reply as it stands
    assert cached == reply_ids[: len(cached)] and len(cached) >= len(reply_ids) - 1


def test_free_text_that_loops_without_max_tokens_ends_at_once_and_one_with_max_tokens_runs_to_it(real_default, serve):
    """An agent's request (tools offered, `auto`, no max_tokens: only the context's end would stop the reply) whose
    model writes text in a loop (a logit bias on " Paris"): the reply ends once it has repeated one short cycle
    over `loops.LOOP_IDS` ids, with finish_reason length, not at the context's end; a request that sets
    max_tokens bounded its reply itself, and runs to it."""
    from chatcli.engine.sample.loops import LOOP_EVERY, LOOP_IDS, MAX_PERIOD
    from chatcli.server.schema import TO_CONTEXT

    loop = real_default.tokenizer.encode(" Paris")[0]
    server = serve(real_default, defaults=SamplingParams(max_tokens=TO_CONTEXT))  # `chatcli serve`'s default
    fields = dict(model=ALIAS, messages=ASK, tools=REAL_TOOLS, tool_choice="auto", temperature=0)
    reply = client(server).chat.completions.create(**fields, logit_bias={str(loop): 100})
    choice = reply.choices[0]
    assert (
        choice.finish_reason == "length" and not choice.message.tool_calls and "Paris Paris" in choice.message.content
    )
    assert LOOP_IDS < reply.usage.completion_tokens <= LOOP_IDS + MAX_PERIOD + LOOP_EVERY
    bounded = client(server).chat.completions.create(**fields, logit_bias={str(loop): 100}, max_tokens=700)
    assert bounded.choices[0].finish_reason == "length" and bounded.usage.completion_tokens == 700
