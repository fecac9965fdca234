"""The model field (issue 48): the served model answers to its id, its file name and every `--alias`,
another name is a 404 `model_not_found` naming what is served; OpenAI's routes without `/v1`, as
llama-server serves them; the `--api` client refuses a name the server does not list."""

from __future__ import annotations

import httpx
import pytest

from chatcli.engine.remote import RemoteEngine, RemoteError
from tests.servers import ALIAS, TIMEOUT, USER, alone


def openai_client(url: str):
    from openai import OpenAI

    return OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=TIMEOUT)


def test_the_model_answers_to_its_id_and_each_alias_and_another_name_is_a_404(tiny_lean, serve):
    from openai import NotFoundError

    server = serve(tiny_lean, aliases=(ALIAS, "gpt-4o-mini"))
    client = openai_client(server.url + "/v1")
    expected = alone(tiny_lean, USER, temperature=0, max_tokens=6)
    for name in (tiny_lean.name, ALIAS, "gpt-4o-mini"):
        done = client.chat.completions.create(model=name, messages=USER, temperature=0, max_tokens=6)
        assert done.choices[0].message.content == expected and done.model == tiny_lean.name  # its id
    with pytest.raises(NotFoundError) as caught:
        client.chat.completions.create(model="nosuch-model", messages=USER, max_tokens=4)
    error = caught.value.body
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "nosuch-model" in error["message"] and tiny_lean.name in error["message"] and ALIAS in error["message"]
    with pytest.raises(NotFoundError):  # the legacy completions too
        client.completions.create(model="nosuch-model", prompt="Hello", max_tokens=4)
    assert client.completions.create(model=ALIAS, prompt="Hello", max_tokens=2).model == tiny_lean.name
    bad = httpx.post(server.url + "/v1/chat/completions", json={"model": 7, "messages": USER}, timeout=TIMEOUT)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "model"


def test_the_models_list_names_each_name_and_retrieve_answers_for_each(tiny_lean, serve):
    from openai import NotFoundError

    server = serve(tiny_lean, aliases=(ALIAS, "other"))
    client = openai_client(server.url + "/v1")
    listed = client.models.list().data
    assert [m.id for m in listed] == [tiny_lean.name, ALIAS, "other"]  # the id first: what a client picks
    for name in (tiny_lean.name, ALIAS, "other"):
        got = client.models.retrieve(name)
        assert got.id == name and got.object == "model"
    with pytest.raises(NotFoundError):
        client.models.retrieve("nosuch")
    assert httpx.get(server.url + "/v1/models/", timeout=TIMEOUT).status_code == 404


def test_a_gguf_models_file_name_is_one_of_its_names(tiny_lean, serve, monkeypatch):
    monkeypatch.setattr(tiny_lean, "source", "/models/Some-Model-Q4_K_M.gguf", raising=False)
    server = serve(tiny_lean, aliases=())
    client = openai_client(server.url + "/v1")
    assert [m.id for m in client.models.list().data] == [tiny_lean.name, "Some-Model-Q4_K_M.gguf"]
    done = client.chat.completions.create(model="Some-Model-Q4_K_M.gguf", messages=USER, max_tokens=2)
    assert done.choices[0].finish_reason == "length"


def test_the_routes_without_v1_answer_as_llama_servers_do(tiny_lean, serve):
    server = serve(tiny_lean)
    bare = openai_client(server.url)  # base URL without /v1: /chat/completions, /completions, /models
    expected = alone(tiny_lean, USER, temperature=0, max_tokens=6)
    done = bare.chat.completions.create(model=ALIAS, messages=USER, temperature=0, max_tokens=6)
    assert done.choices[0].message.content == expected
    chunks = bare.chat.completions.create(model=ALIAS, messages=USER, temperature=0, max_tokens=6, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert bare.completions.create(model=ALIAS, prompt="Hello", max_tokens=3).usage.completion_tokens == 3
    assert [m.id for m in bare.models.list().data][0] == tiny_lean.name
    assert bare.models.retrieve(ALIAS).id == ALIAS
    missing = httpx.post(server.url + "/chat/completions", json={"model": "x", "messages": USER}, timeout=TIMEOUT)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_the_api_client_refuses_a_model_the_server_does_not_list(tiny_lean, serve):
    server = serve(tiny_lean)
    assert RemoteEngine(server.url, model=ALIAS).connect().name == ALIAS
    with pytest.raises(RemoteError, match="nosuch-model") as caught:
        RemoteEngine(server.url, model="nosuch-model").connect()
    assert tiny_lean.name in str(caught.value)


def test_serve_takes_aliases(monkeypatch):
    from click.testing import CliRunner

    import chatcli.server.app
    from chatcli.server import cli as server_cli

    seen = []

    def create_app(engine, **kwargs):
        seen.append(kwargs["aliases"])
        raise SystemExit(0)  # no server

    monkeypatch.setattr(chatcli.server.app, "create_app", create_app)
    result = CliRunner().invoke(server_cli.serve_command, ["--alias", "gpt-4o", "--alias", "local"])
    assert result.exit_code == 0, result.output
    assert seen == [("gpt-4o", "local")]
    refused = CliRunner().invoke(server_cli.serve_command, ["--alias", " "])
    assert refused.exit_code == 2 and "--alias" in refused.output
