"""serve: each OpenAI field works or is refused (issue 20, part 1), through the openai client."""

from __future__ import annotations

import httpx
import pytest

from tests.servers import USER


def client(server, **kwargs):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=kwargs.pop("api_key", "unused"), max_retries=0, timeout=60)


def reply(server, **fields) -> str:
    done = client(server).chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=24, **fields)
    return done.choices[0].message.content


def test_penalties_change_the_reply_and_repeat_penalty_is_an_alias(tiny_engine, serve):
    server = serve(tiny_engine)
    plain = reply(server)
    assert reply(server, frequency_penalty=2.0) != plain
    assert reply(server, presence_penalty=2.0) != plain
    assert reply(server, extra_body={"repeat_penalty": 1.8}) == reply(server, extra_body={"repetition_penalty": 1.8})
    from openai import BadRequestError

    with pytest.raises(BadRequestError, match=r"presence_penalty must be in \[-2, 2\]"):
        reply(server, presence_penalty=3)


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"prediction": {"type": "content", "content": "Paris"}}, "prediction"),
        ({"extra_body": {"web_search_options": {}}}, "web_search_options"),
        ({"extra_body": {"reasoning_effort": "high"}}, "reasoning_effort"),
    ],
)
def test_fields_that_would_change_the_reply_are_refused(tiny_engine, serve, fields, param):
    from openai import BadRequestError

    server = serve(tiny_engine)
    with pytest.raises(BadRequestError) as info:
        reply(server, **fields)
    error = info.value.body
    assert error["code"] == "unsupported_parameter" and error["param"] == param


def reply_ids(engine, params) -> list[int]:
    from chatcli.engine.events import Token

    session = engine.new_session()
    return [e.token_id for e in engine.generate(USER, session, params) if isinstance(e, Token) and e.token_id >= 0]


def test_a_logit_bias_of_minus_100_bans_a_token(tiny_engine, serve):
    from openai import BadRequestError

    from chatcli.engine.sample.sampling import SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=12, lookup=0)
    ids = reply_ids(tiny_engine, greedy)
    banned = ids[0]
    assert banned not in reply_ids(tiny_engine, greedy.with_(logit_bias={str(banned): -100}))
    assert reply_ids(tiny_engine, greedy.with_(max_tokens=3, logit_bias={"5": 100})) == [5, 5, 5]
    server = serve(tiny_engine)  # the same through the server: the request's field reaches the sampler
    plain = reply(server)
    assert reply(server, logit_bias={str(banned): -100}) != plain
    with pytest.raises(BadRequestError, match=r"logit_bias must be token ids >= 0 with biases in \[-100, 100\]"):
        reply(server, logit_bias={"5": 101})
    with pytest.raises(BadRequestError, match="logit_bias must be an object"):
        reply(server, logit_bias=[5])
    past = tiny_engine.tokenizer.vocab_size
    with pytest.raises(BadRequestError, match=f"token id {past} is past the vocabulary"):
        reply(server, logit_bias={str(past): 5})


def test_a_logit_bias_past_the_vocabulary_is_refused(tiny_lean):
    from chatcli.engine import InvalidParameter
    from chatcli.engine.sample.sampling import SamplingParams

    vocab = tiny_lean.tokenizer.vocab_size
    tiny_lean.check_params(SamplingParams(logit_bias={str(vocab - 1): 5}))  # the last id is fine
    with pytest.raises(InvalidParameter, match=f"token id {vocab} is past the vocabulary .ids 0 to {vocab - 1}."):
        tiny_lean.check_params(SamplingParams(logit_bias={"3": 1, str(vocab): 5}))


def test_their_no_op_values_pass(tiny_engine, serve):
    server = serve(tiny_engine)
    plain = reply(server)
    assert reply(server, response_format={"type": "text"}, logit_bias={}, tool_choice="none") == plain


def test_health_is_open_and_models_can_be_read_by_id(tiny_engine, serve):
    server = serve(tiny_engine, api_key="secret")
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}  # no key: no more than that
    assert httpx.get(server.url + "/v1/models").status_code == 401
    model = client(server, api_key="secret").models.retrieve(tiny_engine.name)
    assert model.id == tiny_engine.name
    missing = httpx.get(server.url + "/v1/models/nope", headers={"Authorization": "Bearer secret"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_dropped_turns_are_reported(tiny_engine, serve):
    server = serve(tiny_engine)
    long = "the quick brown fox jumps over the lazy dog " * 4
    history = []
    for _ in range(6):
        history += [{"role": "user", "content": long}, {"role": "assistant", "content": long}]
    messages = [*history, {"role": "user", "content": "and now?"}]
    raw = client(server).chat.completions.with_raw_response.create(
        model="tiny", messages=messages, temperature=0, max_tokens=4
    )
    dropped = int(raw.headers["x-chatcli-truncated-turns"])
    assert dropped > 0 and raw.parse().usage.model_extra["truncated_turns"] == dropped
    fits = client(server).chat.completions.with_raw_response.create(model="tiny", messages=USER, max_tokens=2)
    assert fits.headers["x-chatcli-truncated-turns"] == "0"
    from openai import BadRequestError

    with pytest.raises(BadRequestError) as info:  # the client asks for no truncation: told, not answered
        client(server).chat.completions.create(
            model="tiny", messages=messages, temperature=0, max_tokens=4, extra_body={"truncation": "disabled"}
        )
    assert info.value.body["code"] == "context_length_exceeded" and "truncation is disabled" in info.value.message
    fits = client(server).chat.completions.create(
        model="tiny", messages=USER, max_tokens=2, extra_body={"truncation": "disabled"}
    )
    assert fits.choices[0].message.content is not None
    auto = client(server).chat.completions.create(
        model="tiny", messages=messages, temperature=0, max_tokens=4, extra_body={"truncation": "auto"}
    )
    assert auto.usage.model_extra["truncated_turns"] == dropped
    bad = httpx.post(server.url + "/v1/chat/completions", json={"messages": USER, "truncation": "never"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "truncation"
