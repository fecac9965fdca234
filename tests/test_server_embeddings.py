"""Embeddings through `chatcli serve` (issue 48): OpenAI's `/v1/embeddings` with the `openai` client (one
input or a list, float and base64, `dimensions`, `usage`), Ollama's `/api/embed` with the `ollama` client,
the vectors `Engine.embed`'s, computed beside a reply streaming in another slot; refusals are 400s."""

from __future__ import annotations

import base64
import threading

import httpx
import numpy as np
import pytest

from tests.servers import ALIAS, TIMEOUT, USER
from tests.test_embeddings import TEXTS, embedding_gguf  # noqa: F401 - a fixture


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def test_openai_embeddings_are_the_engines_vectors(tiny_lean, serve):
    server = serve(tiny_lean)
    openai = client(server)
    want = tiny_lean.embed(TEXTS)
    one = openai.embeddings.create(model=ALIAS, input=TEXTS[0])  # the client asks for base64 by default
    assert np.allclose(one.data[0].embedding, want.vectors[0], atol=1e-6) and one.model == tiny_lean.name
    many = openai.embeddings.create(model=ALIAS, input=TEXTS, encoding_format="float")
    assert [d.index for d in many.data] == [0, 1, 2]
    for got, vector in zip(many.data, want.vectors, strict=True):
        assert np.allclose(got.embedding, vector, atol=1e-6)
    assert many.usage.prompt_tokens == many.usage.total_tokens == want.tokens
    raw = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[1], "encoding_format": "base64"})
    packed = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(packed, want.vectors[1].astype("<f4"))  # the float32 values' little-endian bytes


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"dimensions": 8}, "dimensions"),  # a chat model's pooled states cannot be cut
        ({"input": []}, "input"),
        ({"input": [1, 2, 3]}, "input"),
        ({"input": "The quick brown fox. " * 80}, "input"),  # past the context of 256
        ({"encoding_format": "int8"}, "encoding_format"),
    ],
)
def test_what_it_does_not_do_is_a_400_naming_the_field(tiny_lean, serve, fields, param):
    from openai import BadRequestError

    server = serve(tiny_lean)
    with pytest.raises(BadRequestError) as caught:
        client(server).embeddings.create(**{"model": ALIAS, "input": "Hi", **fields})
    assert caught.value.body["param"] == param


def test_an_unknown_model_is_a_404(tiny_lean, serve):
    from openai import NotFoundError

    with pytest.raises(NotFoundError):
        client(serve(tiny_lean)).embeddings.create(model="text-embedding-3-small", input="Hi")


def test_ollama_embed(tiny_lean, serve):
    from ollama import Client, ResponseError

    server = serve(tiny_lean)
    ollama = Client(host=server.url, timeout=TIMEOUT)
    want = tiny_lean.embed(TEXTS)
    done = ollama.embed(model=ALIAS, input=TEXTS)
    assert np.allclose(done.embeddings, want.vectors, atol=1e-6) and done.prompt_eval_count == want.tokens
    long = "The quick brown fox. " * 80
    assert len(ollama.embed(model=ALIAS, input=long).embeddings[0]) == len(want.vectors[0])  # truncated to fit
    with pytest.raises(ResponseError) as caught:
        ollama.embed(model=ALIAS, input=long, truncate=False)
    assert caught.value.status_code == 400 and "context" in caught.value.error
    assert np.allclose(ollama.embeddings(model=ALIAS, prompt=TEXTS[0]).embedding, want.vectors[0], atol=1e-6)
    assert "embedding" in ollama.show(ALIAS).capabilities


def test_an_embedding_models_dimensions(embedding_gguf, serve):  # noqa: F811 - the fixture
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions

    _model, files = embedding_gguf
    engine = load_engine(str(files["last"]), LoadOptions(device="cpu", kv_dtype="float32"))
    server = serve(engine)
    want = engine.embed(TEXTS, dimensions=64)
    got = client(server).embeddings.create(model=ALIAS, input=TEXTS, dimensions=64)
    assert [len(d.embedding) for d in got.data] == [64] * 3
    assert np.allclose([d.embedding for d in got.data], want.vectors, atol=1e-6)
    assert engine.name.endswith(".gguf") and client(server).embeddings.create(model=engine.name, input="x").data


def test_embeddings_beside_a_streaming_reply(tiny_engine, serve):
    """A slot streams a long reply while embeddings are computed: both come back whole and exact."""
    from tests.servers import slow_endless

    server = serve(slow_endless(tiny_engine, 0.01), parallel=2)
    want = tiny_engine.embed(TEXTS).vectors
    pieces = []

    def stream() -> None:
        body = {"model": ALIAS, "messages": USER, "max_tokens": 80, "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
            pieces.extend(line for line in r.iter_lines() if line.startswith("data: "))

    streaming = threading.Thread(target=stream)
    streaming.start()
    for _ in range(3):
        got = client(server).embeddings.create(model=ALIAS, input=TEXTS, encoding_format="float")
        assert np.allclose([d.embedding for d in got.data], want, atol=1e-6)
    streaming.join(TIMEOUT)
    assert pieces[-1] == "data: [DONE]" and '"finish_reason":"length"' in pieces[-2]  # all 80 tokens
