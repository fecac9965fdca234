"""Tool calls through `chatcli serve`: how many replies under `tool_choice: required` parse and validate
(issue 35's goal: all of them, over 50 sampled requests on the embedded model), beside what the same
model makes of the same requests under `auto`, where its text is free.

    python benchmarks/tool_calls.py [--model PATH] [--requests 50] [--url URL] [--json]

Starts `chatcli serve` on a free port (or uses `--url`), then sends `--requests` sampled chat
completions (temperature 1.0, seed i for request i, prompts and three tools in turn, every other one
streamed through the openai client's `chat.completions.stream`) with `tool_choice: required`, then
the same ones with `auto`. A required reply counts as good when it has calls and no text, and each
call names one of the tools with arguments that are JSON valid against the function's parameters
(jsonschema, on the schema as the client sent it); its finish_reason is tool_calls, or length where
the calls were closed early to end within max_tokens (counted apart: `cut`). For auto the replies
with calls are counted, and of those the ones whose calls all validate. Each good required reply is
followed by a round trip (`round_trip`): its calls and a result for each sent back, and the server's
`usage.prompt_tokens_details.cached_tokens` says whether the call stayed in the KV cache (issue 35's
goal: a round trip costs one prefill of the result).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import start_server  # noqa: E402 - beside this script: `chatcli serve` started and waited for

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_web",
            "description": "Search the web and return the top results",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "send_email",
            "description": "Send an email",
            "parameters": {
                "type": "object",
                "properties": {
                    "to": {"type": "string"},
                    "subject": {"type": "string"},
                    "body": {"type": "string"},
                },
                "required": ["to", "subject", "body"],
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
PROMPTS = [
    "What is the weather like in Paris today?",
    "Find me three recent articles about solar panels.",
    "Email bob@example.com that the meeting moved to 3pm.",
    "Is it raining in Tokyo right now? Use fahrenheit.",
    "Search for a good pancake recipe.",
]


def problems(message, reason: str, required: bool) -> list[str]:
    """What is wrong with a reply's calls (none: every call parses and validates)."""
    found = []
    if required and reason not in ("tool_calls", "length"):
        found.append(f"finish_reason {reason}")
    if required and message.content:
        found.append(f"text beside the calls: {message.content[:60]!r}")
    calls = message.tool_calls or []
    if required and not calls:
        found.append("no call")
    for call in calls:
        schema = SCHEMAS.get(call.function.name)
        if schema is None:
            found.append(f"unknown function {call.function.name!r}")
            continue
        try:
            jsonschema.validate(json.loads(call.function.arguments), schema)
        except (ValueError, jsonschema.ValidationError) as exc:
            found.append(f"{call.function.name}: {str(exc).splitlines()[0][:100]}")
    return found


def run(client, choice: str, n: int, max_tokens: int) -> dict:
    from openai import LengthFinishReasonError

    good = with_calls = calls = cut = 0
    failures, trips = [], []
    t0 = time.perf_counter()
    for i in range(n):
        ask = dict(
            model="m",
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            tools=TOOLS,
            tool_choice=choice,
            temperature=1.0,
            seed=i,
            max_tokens=max_tokens,
        )
        try:
            if i % 2:
                with client.chat.completions.stream(**ask, stream_options={"include_usage": True}) as stream:
                    done = stream.get_final_completion()
            else:
                done = client.chat.completions.create(**ask)
        except LengthFinishReasonError as exc:  # the stream helper's way to say finish_reason length
            done = exc.completion
        message, reason = done.choices[0].message, done.choices[0].finish_reason
        wrong = problems(message, reason, choice == "required")
        with_calls += bool(message.tool_calls)
        calls += len(message.tool_calls or [])
        cut += reason == "length"
        if wrong:
            failures.append({"request": i, "problems": wrong, "reply": message.content})
        elif choice == "required" or message.tool_calls:
            good += 1
            if choice == "required":
                trips.append(round_trip(client, ask, message, done.usage))
    return {
        "tool_choice": choice,
        "requests": n,
        "replies_with_calls": with_calls,
        "calls": calls,
        "valid_replies": good,
        "cut": cut,
        "failures": failures,
        "seconds": round(time.perf_counter() - t0, 1),
        "round_trips": trips,
    }


def round_trip(client, ask: dict, message, usage) -> dict:
    """The request again with the reply's calls and a result for each, under auto, for one token: the
    tokens the server read from its KV cache and the ones it prefilled (the call kept: the cache held the
    first prompt and the whole reply)."""
    calls = [{"id": c.id, "type": "function", "function": c.function.model_dump()} for c in message.tool_calls]
    results = [{"role": "tool", "tool_call_id": c.id, "content": f"{c.function.name}: ok"} for c in message.tool_calls]
    follow = {**ask, "tool_choice": "auto", "temperature": 0, "max_tokens": 1}
    follow["messages"] = [*ask["messages"], {"role": "assistant", "content": None, "tool_calls": calls}, *results]
    after = client.chat.completions.create(**follow).usage
    cached = after.prompt_tokens_details.cached_tokens if after.prompt_tokens_details else 0
    held = usage.prompt_tokens + usage.completion_tokens
    return {"held": held, "cached": cached, "prefilled": after.prompt_tokens - cached, "kept": cached >= held - 1}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a .gguf, folder or hub id (default: the embedded model)")
    ap.add_argument("--url", help="an already running server (http://host:port) instead of starting one")
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--no-auto", action="store_true", help="skip the comparison under tool_choice auto")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from openai import OpenAI

    proc, url = (
        (None, args.url.rstrip("/").removesuffix("/v1"))
        if args.url
        else start_server("chatcli", args.model, 1, 0, None)
    )
    try:
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        results = [run(client, "required", args.requests, args.max_tokens)]
        if not args.no_auto:
            results.append(run(client, "auto", args.requests, min(args.max_tokens, 256)))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        if r["tool_choice"] == "required":
            line = f"required: {r['valid_replies']}/{r['requests']} replies parse and validate"
            line += f", {r['cut']} closed at max_tokens"
            trips = r["round_trips"]
            if trips:
                filled = sorted(t["prefilled"] for t in trips)
                print(
                    f"round trips: {sum(t['kept'] for t in trips)}/{len(trips)} kept the call in the cache; "
                    f"prefilled a follow-up: median {filled[len(filled) // 2]} tokens ({filled[0]}-{filled[-1]})"
                )
        else:
            line = (
                f"auto:     {r['replies_with_calls']}/{r['requests']} replies made calls, "
                f"{r['valid_replies']} of them all valid"
            )
        print(f"{line} ({r['calls']} calls, {r['seconds']} s)")
        for f in r["failures"][:10]:
            print(f"  request {f['request']}: {'; '.join(f['problems'])}")


if __name__ == "__main__":
    main()
