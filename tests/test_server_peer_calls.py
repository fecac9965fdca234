"""The calls of Anthropic's Messages, Ollama's chat and OpenAI's Responses (issue 48) are the calls chat
completions gives for the same request: read by the same `tools.ReplyCalls` (no call twice, a named
function's one call, a call cut by max_tokens dropped, no call markup in the text), and a reply that gives
whole calls ends as a call's reply in each API (`tool_use`, done_reason `stop`, status `completed`), even
where the turn then ran out of room, as chat completions' finish_reason is `tool_calls`."""

from __future__ import annotations

import json

import httpx
import pytest

from chatcli.engine.sample.sampling import SamplingParams
from tests.peer_clients import ASK, TOOLS, scripted, tools_engine
from tests.servers import ALIAS, TIMEOUT
from tests.test_server_tools import CALLS, validated

MARKUP = ("<tool_call>", "</tool_call>")
LIMITS = range(24, 104, 8)  # max_tokens: from cut inside the first call to room for several


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return tools_engine(tmp_path_factory)


def post(server, path: str, body: dict) -> dict:
    response = httpx.post(server.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()


def chat(server, choice, max_tokens: int) -> tuple[list, str, bool]:
    """Chat completions' calls, text, and whether it ended as a call's reply (finish_reason tool_calls)."""
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
    done = client.chat.completions.create(model=ALIAS, messages=ASK, tools=TOOLS, tool_choice=choice,
                                          temperature=0, max_tokens=max_tokens)  # fmt: skip
    message = done.choices[0].message
    return validated(message.tool_calls or []), message.content or "", done.choices[0].finish_reason == "tool_calls"


def anthropic(server, choice, max_tokens: int) -> tuple[list, str, bool]:
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]  # fmt: skip
    named = {"type": "tool", "name": choice["function"]["name"]} if isinstance(choice, dict) else {
        "type": {"required": "any"}.get(choice, choice)}  # fmt: skip
    body = {"model": ALIAS, "messages": ASK, "tools": tools, "tool_choice": named, "max_tokens": max_tokens,
            "temperature": 0}  # fmt: skip
    done = post(server, "/v1/messages", body)
    calls = [(b["name"], b["input"]) for b in done["content"] if b["type"] == "tool_use"]
    text = "".join(b["text"] for b in done["content"] if b["type"] == "text")
    return calls, text, done["stop_reason"] == "tool_use"


def responses(server, choice, max_tokens: int) -> tuple[list, str, bool]:
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    named = {"type": "function", "name": choice["function"]["name"]} if isinstance(choice, dict) else choice
    body = {"model": ALIAS, "input": ASK, "tools": tools, "tool_choice": named, "max_output_tokens": max_tokens,
            "temperature": 0}  # fmt: skip
    done = post(server, "/v1/responses", body)
    calls = [(i["name"], json.loads(i["arguments"])) for i in done["output"] if i["type"] == "function_call"]
    text = "".join(c["text"] for i in done["output"] if i["type"] == "message" for c in i["content"])
    return calls, text, done["status"] == "completed"


def ollama(server, choice, max_tokens: int) -> tuple[list, str, bool]:
    """Ollama's chat has no tool_choice: asked only as auto."""
    body = {"model": ALIAS, "messages": ASK, "tools": TOOLS, "stream": False,
            "options": {"temperature": 0, "num_predict": max_tokens}}  # fmt: skip
    done = post(server, "/api/chat", body)
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in done["message"].get("tool_calls") or ()]
    return calls, done["message"]["content"], done["done_reason"] == "stop"


NAMED = {"type": "function", "function": {"name": "search"}}


@pytest.mark.parametrize(
    ("peer", "choice"),
    [(anthropic, "required"), (anthropic, NAMED), (responses, "required"), (responses, NAMED), (ollama, "auto")],
    ids=["anthropic-any", "anthropic-named", "responses-required", "responses-named", "ollama-auto"],
)
def test_a_peers_calls_are_chat_completions_calls(qwen, serve, peer, choice):
    server = serve(qwen)
    same_calls(server, peer, choice, LIMITS)


# A third call after CALLS' two, for max_tokens to cut: the two whole calls are the reply's
THREE = CALLS + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}\n</tool_call>'


@pytest.mark.parametrize("peer", [anthropic, responses, ollama], ids=["anthropic", "responses", "ollama"])
def test_whole_calls_before_a_cut_one_end_as_calls(qwen, serve, monkeypatch, peer):
    """The model writes text and three calls under auto (Ollama's only choice); max_tokens cuts the reply
    here and there: each API gives chat completions' calls, and ends as a call's reply wherever it gives
    some (Ollama's done_reason was `length` there, the Responses API's status `incomplete`)."""
    scripted(qwen, THREE, monkeypatch)
    server = serve(qwen, defaults=SamplingParams(lookup=0))
    assert same_calls(server, peer, "auto", range(40, 140, 10)) > 0


def same_calls(server, peer, choice, limits) -> int:
    """For each max_tokens of `limits`, `peer`'s calls are chat completions' and end as theirs do: how many
    of its replies gave calls."""
    ended_with_calls = 0
    for max_tokens in limits:
        want, _text, with_calls = chat(server, choice, max_tokens)
        calls, text, ended = peer(server, choice, max_tokens)
        assert calls == want, (max_tokens, calls, want)
        assert not any(m in text for m in MARKUP), (max_tokens, text)
        assert [json.dumps(c, sort_keys=True) for c in calls] == list(dict.fromkeys(json.dumps(c, sort_keys=True)
                                                                                    for c in calls))  # fmt: skip
        if calls:
            assert ended and with_calls, (max_tokens, calls, ended, with_calls)
            ended_with_calls += 1
        if isinstance(choice, dict):
            assert [name for name, _ in calls] in ([], ["search"]), calls
    assert choice == "auto" or ended_with_calls, "no reply gave calls: the test saw nothing"
    return ended_with_calls
