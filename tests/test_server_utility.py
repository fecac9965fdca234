"""llama-server's tokenizer routes on `chatcli serve` (issue 48): /tokenize (with pieces, special tokens added
or not, read or not), /detokenize, /apply-template; bad input a 400 in OpenAI's shape."""

from __future__ import annotations

import httpx
import pytest

from tests.servers import TIMEOUT, USER


def post(server, route: str, body) -> httpx.Response:
    return httpx.post(server.url + route, json=body, timeout=TIMEOUT)


def test_tokenize_and_detokenize_round_trip(tiny_lean, serve):
    server = serve(tiny_lean)
    tok = tiny_lean.tokenizer
    text = "Hello, café <|im_end|> 🙂"
    plain = post(server, "/tokenize", {"content": text}).json()["tokens"]
    assert plain == tok.encode(text) and tok.encode("<|im_end|>")[0] in plain  # special tokens read as such
    assert post(server, "/tokenize", {"content": text, "add_special": True}).json()["tokens"] == tok.encode_prompt(text)
    as_text = post(server, "/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
    assert as_text == tok.encode_text(text) and tok.encode("<|im_end|>")[0] not in as_text
    pieces = post(server, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == plain
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert joined.decode() == text  # each piece its text, or its bytes where a character is split
    assert any(isinstance(p["piece"], list) for p in pieces)  # the emoji's bytes span tokens here
    assert post(server, "/detokenize", {"tokens": plain}).json() == {"content": text}


def test_apply_template_is_the_chat_templates_text(tiny_lean, serve):
    server = serve(tiny_lean)
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    prompt = post(server, "/apply-template", {"messages": messages}).json()["prompt"]
    assert prompt == tiny_lean.tokenizer.render(messages)
    assert prompt.endswith("<|im_start|>assistant\n") and "Be brief." in prompt


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/tokenize", {}, "content"),
        ("/tokenize", {"content": "x", "add_special": "yes"}, "add_special"),
        ("/detokenize", {"tokens": [1, "a"]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/apply-template", {"messages": []}, "messages"),
        ("/apply-template", {"messages": USER, "tools": [{"type": "retrieval"}]}, "tools"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(tiny_lean, serve, route, body, param):
    got = post(serve(tiny_lean), route, body)
    assert got.status_code == 400 and got.json()["error"]["param"] == param
