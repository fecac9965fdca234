"""Tool calls through `chatcli serve`, as an agent sees them (issues 35 and 48): over `--requests`
seeds, for each `tool_choice` (`required`; `auto` with a few-shot history: one call and its result
shown; a named function), temperature and `max_tokens`, how many replies repeat a call, how many calls
parse and validate, whether `finish_reason` is `tool_calls` on every reply with calls, whether call
markup reaches `content`, and whether the openai client's `.parse()` / `.stream()` raise.

    python benchmarks/tool_calls.py [--model PATH | --tiny-qwen3] [--requests 50] [--url URL] [--json]
        [--choices required,auto,named] [--temperatures 1,0] [--max-tokens 60,120,unset]

Starts `chatcli serve` on a free port with `--ctx-size` (2048: where an `unset` reply ends, unless it loops,
in a call's string or in its text, and is cut sooner: `chatcli/engine/sample/loops.py`; or uses
`--url`) and a config file of its own; `--tiny-qwen3` serves a random Qwen3-shaped
GGUF (the embedded model's tokenizer, 512 ids) with a Qwen tools template instead of the embedded
model, which has none (it gets the fallback prompt). Request i asks prompt i % 5 (three tools offered)
with seed i; even requests go through `client.chat.completions.parse`, odd ones through
`chat.completions.stream` (each raises on finish_reason `length`: counted in `raised`, the reply
still read). `unset` sends no `max_tokens` (the server's default: the context limit). Per row:
`calls` made, `dup` replies holding one call twice, `valid` calls that name a tool and whose arguments
validate (jsonschema, against the schema as sent), `named` replies of a named choice with exactly one
call of that function, `tool_calls` replies with calls whose finish_reason says so, `length` replies
(in `--json`, `length_tokens`: each one's tokens, None where a streamed reply's usage never came),
`markup` replies with call markup in `content`. Under `required` at the first temperature and
max_tokens unset, each good reply is followed at once by a round trip (its calls and a result each
sent back, `usage.prompt_tokens_details.cached_tokens` read: issue 35's goal, a round trip prefills
only the result), summed up after the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import jsonschema

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from serve_load import MODEL, start_server  # noqa: E402 - beside this script: `chatcli serve` (--alias MODEL) started

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "strict": True,  # what `.parse()` asks of a tool; this server holds every call to its schema
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
            "strict": True,
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
            "strict": True,
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
PROMPTS = [  # each with the function a named tool_choice gives it
    ("What is the weather like in Paris today?", "get_weather"),
    ("Find me three recent articles about solar panels.", "search_web"),
    ("Email bob@example.com that the meeting moved to 3pm.", "send_email"),
    ("Is it raining in Tokyo right now? Use fahrenheit.", "get_weather"),
    ("Search for a good pancake recipe.", "search_web"),
]
ROME = '{"city": "Rome", "unit": "celsius"}'
SHOT = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ROME}}
FEW_SHOT = [  # auto: one exchange with a call and its result before the question
    {"role": "user", "content": "How warm is it in Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [SHOT]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'},
    {"role": "assistant", "content": "It is 21 °C and clear in Rome."},
]
MARKUP = ("<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]")


def ask_for(choice: str, i: int, temperature: float, max_tokens: int | None) -> tuple[dict, str | None]:
    prompt, function = PROMPTS[i % len(PROMPTS)]
    messages = [{"role": "user", "content": prompt}]
    tool_choice = choice
    if choice == "auto":
        messages = [*FEW_SHOT, *messages]
    elif choice == "named":
        tool_choice = {"type": "function", "function": {"name": function}}
    ask = dict(model=MODEL, messages=messages, tools=TOOLS, tool_choice=tool_choice, temperature=temperature, seed=i)
    if max_tokens is not None:
        ask["max_tokens"] = max_tokens
    return ask, function if choice == "named" else None


def one(client, ask: dict, stream: bool):
    """The reply, and whether the openai client raised for it (LengthFinishReasonError)."""
    from openai import LengthFinishReasonError

    try:
        if stream:
            with client.chat.completions.stream(**ask, stream_options={"include_usage": True}) as s:
                return s.get_final_completion(), False
        return client.chat.completions.parse(**ask), False
    except LengthFinishReasonError as exc:
        return exc.completion, True


def valid(call) -> bool:
    schema = SCHEMAS.get(call.function.name)
    try:
        jsonschema.validate(json.loads(call.function.arguments), schema)
    except (TypeError, ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return schema is not None


def run(client, choice: str, temperature: float, max_tokens: int | None, n: int, trips: list | None = None) -> dict:
    """One row of the table; `trips`: where given, each good reply's round trip (`round_trip`) is added,
    made at once (while the server's cache still holds the reply)."""
    row = dict(choice=choice, temperature=temperature, max_tokens=max_tokens or "unset", replies=n)
    row.update(with_calls=0, calls=0, dup=0, valid=0, named=0, tool_calls=0, length=0, markup=0, raised=0)
    row["length_tokens"] = []  # the tokens of each `length` reply (where a loop was cut, or the context's end)
    failures = []
    t0 = time.perf_counter()
    for i in range(n):
        ask, function = ask_for(choice, i, temperature, max_tokens)
        done, raised = one(client, ask, stream=bool(i % 2))
        message, reason = done.choices[0].message, done.choices[0].finish_reason
        calls = message.tool_calls or []
        keys = [(c.function.name, json.dumps(json.loads(c.function.arguments), sort_keys=True)) for c in calls]
        wrong = []
        row["with_calls"] += bool(calls)
        row["calls"] += len(calls)
        row["valid"] += sum(valid(c) for c in calls)
        row["length"] += reason == "length"
        if reason == "length":
            row["length_tokens"].append(done.usage.completion_tokens if done.usage else None)
        row["raised"] += raised
        if len(set(keys)) < len(keys):
            row["dup"] += 1
            wrong.append("a call twice")
        if calls and reason == "tool_calls":
            row["tool_calls"] += 1
        elif calls:
            wrong.append(f"finish_reason {reason} with calls")
        if any(m in (message.content or "") for m in MARKUP):
            row["markup"] += 1
            wrong.append(f"markup in content: {message.content[:60]!r}")
        if function is not None:
            row["named"] += [k[0] for k in keys] == [function]
        if not all(valid(c) for c in calls):
            wrong.append("a call that does not validate")
        if wrong:
            failures.append({"request": i, "problems": wrong, "calls": keys, "content": message.content})
        if calls and not wrong and trips is not None:
            trips.append(round_trip(client, ask, message, done.usage))
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return {**row, "failures": failures}


def round_trip(client, ask: dict, message, usage) -> dict:
    """The request again with the reply's calls and a result for each, under auto, for one token: the
    tokens the server read from its KV cache and the ones it prefilled (the call kept: the cache held the
    first prompt and the whole reply). A reply that filled the context leaves no room for it (`fits` false:
    counted apart)."""
    from openai import BadRequestError

    calls = [{"id": c.id, "type": "function", "function": c.function.model_dump()} for c in message.tool_calls]
    results = [{"role": "tool", "tool_call_id": c.id, "content": f"{c.function.name}: ok"} for c in message.tool_calls]
    follow = {**ask, "tool_choice": "auto", "temperature": 0, "max_tokens": 1}
    follow["messages"] = [*ask["messages"], {"role": "assistant", "content": None, "tool_calls": calls}, *results]
    try:
        after = client.chat.completions.create(**follow).usage
    except BadRequestError:  # the reply ran to the context's end: the round trip does not fit (the server says so)
        return {"held": usage.prompt_tokens + usage.completion_tokens, "fits": False}
    cached = after.prompt_tokens_details.cached_tokens if after.prompt_tokens_details else 0
    held = usage.prompt_tokens + usage.completion_tokens
    return {
        "held": held,
        "cached": cached,
        "prefilled": after.prompt_tokens - cached,
        "kept": cached >= held - 1,
        "fits": True,
    }


def tiny_qwen3(folder: Path) -> str:
    """A random Qwen3-shaped GGUF (tests/gguf_models.py's, 4,096 positions) under a Qwen tools template."""
    sys.path.insert(0, str(HERE.parent))  # the tests' model builders and Qwen tools template
    from tests.gguf_models import rewrite_gguf, tiny, write_gguf
    from tests.test_server_tools import QWEN_TOOLS

    model = tiny("qwen3", tied=False)
    model.config.max_position_embeddings = 4096
    plain = write_gguf(model, folder / "tiny-qwen3.gguf")
    import gguf

    template = {"tokenizer.chat_template": (QWEN_TOOLS, gguf.GGUFValueType.STRING)}
    return str(rewrite_gguf(plain, folder / "tiny-qwen3-tools.gguf", template))


def table(rows: list[dict]) -> str:
    names = "tool_choice temp max_tokens replies with_calls calls dup valid named tool_calls length markup raised s"
    lines = ["| " + " | ".join(names.split()) + " |", "|" + "---|" * len(names.split())]
    for r in rows:
        valid_share = f"{r['valid']}/{r['calls']}"
        named = str(r["named"]) if r["choice"] == "named" else "-"
        calls_share = f"{r['tool_calls']}/{r['with_calls']}"
        cells = [r["choice"], f"{r['temperature']:g}", str(r["max_tokens"]), str(r["replies"]), str(r["with_calls"])]
        cells += [str(r["calls"]), str(r["dup"]), valid_share, named, calls_share, str(r["length"]), str(r["markup"])]
        cells += [str(r["raised"]), str(r["seconds"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a .gguf, folder or hub id (default: the embedded model)")
    ap.add_argument("--tiny-qwen3", action="store_true", help="serve a random Qwen3-shaped model with a tools template")
    ap.add_argument("--url", help="an already running server (http://host:port) instead of starting one")
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--choices", default="required,auto,named")
    ap.add_argument("--temperatures", default="1,0")
    ap.add_argument("--max-tokens", default="60,120,unset")
    ap.add_argument("--ctx-size", type=int, default=2048, help="the served context (what `unset` runs to)")
    ap.add_argument("--no-round-trips", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from openai import OpenAI

    limits = [None if m == "unset" else int(m) for m in args.max_tokens.split(",")]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        model = tiny_qwen3(Path(scratch)) if args.tiny_qwen3 else args.model
        config = Path(scratch) / "config.toml"  # a config of its own: no [sampling] defaults of the user's
        config.write_text(f"ctx_size = {args.ctx_size}\n")
        os.environ["CHATCLI_CONFIG"] = str(config)
        proc, url = (
            (None, args.url.rstrip("/").removesuffix("/v1")) if args.url else start_server("chatcli", model, 1, 0, None)
        )
        try:
            client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
            trips, rows = [], []
            for choice in args.choices.split(","):
                for t in temperatures:
                    for m in limits:
                        first = choice == "required" and t == temperatures[0] and m is None and not args.no_round_trips
                        rows.append(run(client, choice, t, m, args.requests, trips if first else None))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    if args.json:
        print(json.dumps({"rows": rows, "round_trips": trips}, indent=2))
        return
    print(table(rows))
    for r in rows:
        for f in r["failures"][:5]:
            print(
                f"  {r['choice']} t={r['temperature']:g} max_tokens={r['max_tokens']} request {f['request']}: "
                f"{'; '.join(f['problems'])}"
            )
    fit = [t for t in trips if t["fits"]]
    if fit:
        filled = sorted(t["prefilled"] for t in fit)
        print(
            f"round trips: {sum(t['kept'] for t in fit)}/{len(fit)} found the whole reply cached; "
            f"prefilled a follow-up: median {filled[len(filled) // 2]} tokens ({filled[0]}-{filled[-1]})"
        )
    if len(fit) < len(trips):
        print(f"round trips that did not fit the context (the reply had filled it): {len(trips) - len(fit)}")


if __name__ == "__main__":
    main()
