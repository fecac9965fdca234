"""Structured output (issue 20): replies held to JSON by a token mask each step, on every runner, with
drafts kept exact; the server's response_format through the openai client; the one-shot's --json-schema."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import numpy as np
import pytest

from chatcli.engine.events import Finished, Token
from chatcli.engine.params import ResponseFormat, SamplingParams
from chatcli.engine.sample.grammar import GrammarError, TokenGrammar
from tests.servers import USER

# Bounded, so even the tiny random model's reply completes within max_tokens.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "admin": {"type": "boolean"},
        "role": {"enum": ["user", "guest", "owner"]},
    },
    "required": ["name", "age", "admin", "role"],
    "additionalProperties": False,
}


def turn(engine, params, messages=USER, session=None):
    session = session or engine.new_session()
    events = list(engine.generate(messages, session, params))
    assert isinstance(events[-1], Finished)
    return events, session


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_a_constrained_reply_validates_on_each_runner(tiny_engine, seed):
    """The tiny random model writes noise unconstrained; held to the schema its reply parses and
    validates, greedy and sampled, and the turn ends when the value is complete."""
    fmt = ResponseFormat.json_schema(PERSON)
    params = SamplingParams(temperature=0 if seed is None else 1.0, seed=seed, max_tokens=200, response_format=fmt)
    events, _ = turn(tiny_engine, params)
    done = events[-1]
    jsonschema.validate(json.loads(done.reply), PERSON)
    assert done.finish_reason == "stop"
    free, _ = turn(tiny_engine, params.with_(response_format=None))
    with pytest.raises(ValueError):  # what the constraint is for
        jsonschema.validate(json.loads(free[-1].reply), PERSON)


def test_drafts_under_a_constraint_give_the_single_step_reply(tiny_engine):
    """A drafted id the grammar refuses is rejected like any other: with prompt lookup on, a greedy
    reply's every id is that of single steps, and drafts were both kept and cut. (Sampled, drafts keep
    the distribution, not the draws: `accept_draft` uses the generator differently.)"""
    if not tiny_engine.runner.exact_verify:
        pytest.skip("this runner does not draft")
    messages = [{"role": "user", "content": 'Repeat: {"name": "ab", "age": 7, "admin": true, "role": "user"}'}]
    params = SamplingParams(temperature=0, max_tokens=200, response_format=ResponseFormat.json_schema(PERSON))
    drafted, _ = turn(tiny_engine, params.with_(lookup=8), messages)
    single, _ = turn(tiny_engine, params.with_(lookup=0), messages)
    ids = [[e.token_id for e in events if isinstance(e, Token)] for events in (drafted, single)]
    assert ids[0] == ids[1]
    stats = drafted[-1].stats
    assert 0 < stats.accepted_tokens < stats.draft_tokens
    jsonschema.validate(json.loads(drafted[-1].reply), PERSON)
    sampled, _ = turn(tiny_engine, params.with_(temperature=1.0, seed=3, lookup=8), messages)
    jsonschema.validate(json.loads(sampled[-1].reply), PERSON)


def test_a_turn_ended_by_its_grammar_leaves_the_cache_consistent(tiny_engine):
    params = SamplingParams(temperature=0, max_tokens=200, response_format=ResponseFormat.json_schema(PERSON))
    events, session = turn(tiny_engine, params)
    jsonschema.validate(json.loads(events[-1].reply), PERSON)
    n_reply = sum(1 for e in events if isinstance(e, Token) and e.token_id >= 0)
    prompt = events[0].prompt_tokens
    assert len(session.cache) == prompt + n_reply - 1  # the last id was never fed
    second = [*USER, {"role": "assistant", "content": events[-1].reply}, {"role": "user", "content": "Again"}]
    again, _ = turn(tiny_engine, params, second, session)
    assert again[0].cached_tokens >= prompt  # the next turn reads the first from the cache
    fresh, _ = turn(tiny_engine, params, second)
    assert again[-1].reply == fresh[-1].reply  # as from a cold cache


def test_the_mask_allows_only_what_the_grammar_takes(tiny_engine):
    grammar = TokenGrammar(tiny_engine.tokenizer)
    constraint = grammar.constraint(ResponseFormat.json_schema({"enum": ["yes", "no"]}))
    allowed = [int(i) for i in constraint.allowed().nonzero()[0]]
    texts = {tiny_engine.tokenizer.decode([i]) for i in allowed}
    assert texts and all('"yes"'.startswith(t) or '"no"'.startswith(t) for t in texts), texts
    quote = next(i for i in allowed if tiny_engine.tokenizer.decode([i]) == '"')
    constraint.advance(quote)
    after = {tiny_engine.tokenizer.decode([int(i)]) for i in constraint.allowed().nonzero()[0]}
    assert after and all("yes".startswith(t) or "no".startswith(t) for t in after) and not constraint.stopped


def test_logprobs_under_a_constraint_are_of_the_masked_distribution(tiny_engine):
    params = SamplingParams(
        temperature=0, max_tokens=60, logprobs=5, response_format=ResponseFormat.json_schema({"type": "boolean"})
    )
    events, _ = turn(tiny_engine, params)
    tokens = [e for e in events if isinstance(e, Token) and e.token_id >= 0]
    assert events[-1].reply in ("true", "false")
    first = tokens[0]
    assert first.logprob > float("-inf")
    alternatives = {tiny_engine.tokenizer.decode([i]) for i, _ in first.top_logprobs}
    assert alternatives and all("true".startswith(t) or "false".startswith(t) for t in alternatives), alternatives


LOOP = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
OPEN = {"type": "object", "properties": {f"p{i}": {"enum": ["a", "b"]} for i in range(2000)}}


@pytest.mark.parametrize(
    "schema,words",
    [
        ({"type": "nosuchtype"}, "nosuchtype"),
        ({"$ref": "#/definitions/missing"}, "missing"),
        ({"$ref": "#"}, "admits no JSON value"),  # recursive: no value ever matches
        (LOOP, "admits no JSON value"),
        (OPEN, "too large or too open"),  # the parser's row limit, met right after "{"
    ],
)
def test_a_schema_it_cannot_hold_to_is_one_line(tiny_lean, schema, words):
    with pytest.raises(GrammarError, match=words) as info:
        tiny_lean.check_params(SamplingParams(response_format=ResponseFormat.json_schema(schema)))
    assert "\n" not in str(info.value)


def test_a_response_format_needs_a_schema_object(tiny_lean):
    with pytest.raises(ValueError, match="does not parse"):
        ResponseFormat.json_schema("{not json")
    with pytest.raises(ValueError, match="no reply could match"):
        ResponseFormat.json_schema(False)
    anything = SamplingParams(temperature=0, max_tokens=40, response_format=ResponseFormat.json_schema(True))
    tiny_lean.check_params(anything)  # true: any JSON value
    assert ResponseFormat.json_schema(True).schema_object() == {}
    with pytest.raises(ValueError, match="json_object or json_schema"):
        ResponseFormat("yaml")


# -- the server --------------------------------------------------------------------------------


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def schema_format(schema, name="person"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_served_json_schema_validates_whole_and_streamed(tiny_engine, serve):
    server = serve(tiny_engine)
    ask = dict(model="tiny", messages=USER, max_tokens=200, response_format=schema_format(PERSON))
    whole = client(server).chat.completions.create(temperature=0, **ask)
    jsonschema.validate(json.loads(whole.choices[0].message.content), PERSON)
    assert whole.choices[0].finish_reason == "stop"
    stream = client(server).chat.completions.create(temperature=1.0, seed=5, stream=True, **ask)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.real_model
def test_served_json_object_and_text(real_engine, serve):
    """The embedded model asked for any JSON object (the tiny random one rarely closes its strings)."""
    server = serve(real_engine)
    ask = dict(model="tiny", messages=USER, max_tokens=120, temperature=0)
    done = client(server).chat.completions.create(response_format={"type": "json_object"}, **ask)
    assert isinstance(json.loads(done.choices[0].message.content), dict)
    text = client(server).chat.completions.create(response_format={"type": "text"}, **ask)
    plain = client(server).chat.completions.create(**ask)
    assert text.choices[0].message.content == plain.choices[0].message.content


def test_the_openai_clients_parse_helper_gets_a_model(tiny_lean, serve):
    """`client.chat.completions.parse` with a pydantic model: the client builds the strict schema
    and parses the reply into the model."""
    from typing import Literal

    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=6)
        admin: bool
        role: Literal["user", "guest"]

    server = serve(tiny_lean)
    done = client(server).chat.completions.parse(
        model="tiny", messages=USER, max_tokens=120, temperature=0, response_format=Person
    )
    assert isinstance(done.choices[0].message.parsed, Person)


@pytest.mark.parametrize(
    "response_format,param",
    [
        (schema_format({"type": "nosuchtype"}), "response_format"),
        ({"type": "yaml"}, "response_format.type"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": "not an object"}},
            "response_format.json_schema",
        ),
        ("json", "response_format"),
        (schema_format({"$ref": "#"}), "response_format"),
        (schema_format(OPEN), "response_format"),
    ],
)
def test_a_bad_response_format_is_a_400(tiny_lean, serve, response_format, param):
    server = serve(tiny_lean)
    body = {"model": "tiny", "messages": USER, "response_format": response_format}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_grammar_failing_mid_reply_is_a_400_and_one_log_line(tiny_lean, serve, monkeypatch, caplog):
    from chatcli.engine.sample import grammar

    def refuse(self, token):
        raise GrammarError("the JSON schema is not usable: too large for the grammar engine")

    monkeypatch.setattr(grammar.Constraint, "advance", refuse)
    server = serve(tiny_lean)
    body = {"model": "tiny", "messages": USER, "max_tokens": 20, "response_format": schema_format(PERSON)}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    assert "too large" in r.json()["error"]["message"]
    logged = [rec for rec in caplog.records if "response_format" in rec.getMessage()]
    assert logged and all(rec.exc_info is None for rec in caplog.records)


def test_the_remote_engine_forwards_the_format():
    from chatcli.engine.remote import RemoteEngine

    remote = RemoteEngine("http://127.0.0.1:9/v1", None, "m")
    fmt = ResponseFormat.json_schema(PERSON, "person", strict=True)
    assert remote.body(USER, SamplingParams(response_format=fmt))["response_format"] == schema_format(PERSON)
    loose = ResponseFormat.json_schema(PERSON, "my.schema v2")  # a file's stem: OpenAI's names are [A-Za-z0-9_-]
    sent = remote.body(USER, SamplingParams(response_format=loose))["response_format"]["json_schema"]
    assert sent["name"] == "my_schema_v2" and sent["strict"] is False
    body = remote.body(USER, SamplingParams(response_format=ResponseFormat("json_object")))
    assert body["response_format"] == {"type": "json_object"}


# -- as strict as the strictest peer (issue 48) ----------------------------------------------------

NAMED = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}}, "required": ["name"]}


def takes(engine, fmt: ResponseFormat, text: str) -> bool:
    """The grammar of `fmt` takes `text` whole (each of its ids through the mask, then complete)."""
    constraint = engine.grammar.constraint(fmt)
    for token in engine.tokenizer.encode(text):
        if not constraint.mask(np.zeros(constraint.vocab, dtype=np.float32))[token] > float("-inf"):
            return False
        constraint.advance(token)
    return constraint.matcher.is_accepting()


def test_objects_are_closed_unless_the_schema_opens_them(tiny_lean):
    """An object schema that lists properties and says nothing of others takes no others, `strict` or
    not (OpenAI's strict mode requires it; llama.cpp's converter closes them): a small model otherwise
    writes keys of its own. `additionalProperties: true` (or a schema) opens it."""
    extra = '{"name": "ab", "x": 1}'
    for strict in (False, True):
        assert takes(tiny_lean, ResponseFormat.json_schema(NAMED, strict=strict), '{"name": "ab"}')
        assert not takes(tiny_lean, ResponseFormat.json_schema(NAMED, strict=strict), extra)
    nested = {"type": "array", "items": NAMED}
    assert not takes(tiny_lean, ResponseFormat.json_schema(nested), '[{"name": "ab", "x": 1}]')
    assert takes(tiny_lean, ResponseFormat.json_schema({**NAMED, "additionalProperties": True}), extra)
    assert takes(tiny_lean, ResponseFormat.json_schema({**NAMED, "additionalProperties": {"type": "integer"}}), extra)
    assert takes(tiny_lean, ResponseFormat("json_object"), extra)  # no properties listed: any object


NUMBERS = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "x": {"type": "number"}, "s": {"type": "string", "maxLength": 30}},
    "required": ["n", "x", "s"],
}


def test_numbers_are_bounded_in_length_as_llama_cpp_bounds_them(tiny_lean, serve):
    """Each run of a number's digits (its integral part, fraction, exponent) is at most 16 long, as in
    llama.cpp's json-schema-to-grammar: the random model, whose digits run on to max_tokens unheld,
    ends its numbers; a string's digits are free."""
    assert takes(tiny_lean, ResponseFormat.json_schema({"type": "integer"}), "1234567890123456")
    assert not takes(tiny_lean, ResponseFormat.json_schema({"type": "integer"}), "12345678901234567")
    assert not takes(tiny_lean, ResponseFormat.json_schema({"type": "number"}), "0.12345678901234567")
    assert takes(tiny_lean, ResponseFormat.json_schema({"type": "string"}), '"12345678901234567890"')
    server = serve(tiny_lean)
    fmt = {"type": "json_schema", "json_schema": {"name": "numbers", "schema": NUMBERS}}
    for seed in range(6):
        done = client(server).chat.completions.create(
            model="tiny", messages=USER, max_tokens=200, temperature=1.0, seed=seed, response_format=fmt
        )
        text = done.choices[0].message.content
        value = json.loads(text)
        jsonschema.validate(value, NUMBERS)
        numbers = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)  # the strings' digits are free
        assert max(len(run) for run in re.findall(r"[0-9]+", numbers)) <= 16, text


def test_a_json_object_with_a_schema_is_held_to_it(tiny_lean, serve):
    """`{"type": "json_object", "schema": {...}}`, llama-server's form (instructor's JSON_SCHEMA mode):
    the reply is held to the schema, not to any object (it was ignored with a 200)."""
    server = serve(tiny_lean)
    for seed in range(4):
        done = client(server).chat.completions.create(
            model="tiny",
            messages=USER,
            max_tokens=200,
            temperature=1.0,
            seed=seed,
            response_format={"type": "json_object", "schema": PERSON},
        )
        jsonschema.validate(json.loads(done.choices[0].message.content), PERSON)
    body = {"model": "tiny", "messages": USER, "response_format": {"type": "json_object", "schema": "person"}}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.schema", r.text
