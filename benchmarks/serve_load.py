"""N clients streaming at once through `chatcli serve`'s HTTP API: what a team sharing one server,
or an agent's parallel calls, get from it.

    python benchmarks/serve_load.py [--model PATH] [--clients 1,4,8] [--tokens 64] [--json]
    python benchmarks/serve_load.py --api openai,anthropic,ollama  # the same requests through each API
    python benchmarks/serve_load.py --clients 1 --api openai,anthropic,ollama --rounds 15  # paired, judged
    python benchmarks/serve_load.py --model FILE.gguf --llama-server PATH  # llama-server -np N beside it
    python benchmarks/serve_load.py --hostile 4  # clients that send 20,000 messages and leave, and a `hi`

For each number of clients N the server is started once with a slot a client (`chatcli serve
--parallel N`, or `llama-server -np N` on the same GGUF where a binary is given or on PATH), warmed
with one request, then N threads each send one streamed chat completion at once (greedy, `--tokens`
tokens, `ignore_eos`-free: a prompt that asks for a long answer, different per client so no prefix
is shared). Reported: the aggregate rate (all tokens / the wall time from the first request to the
last token: prompts' prefill included), the aggregate decode rate (the tokens after each client's first
/ the time from the earliest first token to the last token: what llama-batched-bench calls S_TG, the
generation of sequences decoded together), each client's own rate (median), and time to first token
(p50, p95). The OpenAI-
compatible `stream_options.include_usage` gives the token counts where the server sends them, else
the streamed chunks are counted.

`--api` names the APIs the clients speak, comma-separated: `openai` (chat completions, the default),
`anthropic` (`/v1/messages`, its `content_block_delta` events; the count from `message_delta`'s
usage) and `ollama` (`/api/chat`, NDJSON; the count from the last line's `eval_count`). Each number of
clients then runs through each API in turn on the same server: the same requests, the same engine, so
the rows compare what each API's layer costs. llama-server runs beside it for `openai` only. With
`--rounds R`, R rounds of them all, each starting with the next API, and each API's aggregate rate as a
share of chat completions' in the same round: the median over the rounds, with its quartiles (the
machine's speed drifts between minutes, so one round apiece cannot tell a 5 % difference).

`--hostile N` measures what clients that leave cost the others (issue 46): on `chatcli serve` with its
default slots, N clients each POST a conversation of 20,000 one-letter messages (680 KB; every other
one streamed) and leave after `--leave` s; once all are queued or running, a well-behaved `hi` is sent.
Reported: the seconds the `hi` took, and the slots' release time: for each hostile client, from its
leaving to the server counting its request cancelled (`/health`'s `requests.cancelled`, read every
10 ms), the longest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx

PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how a refrigerator works, step by step.",
    "Describe the history of the printing press and its effects on Europe.",
    "Write a long letter to a friend about a trip through the mountains.",
    "Explain how to bake bread at home, with every step and why it matters.",
    "Tell a long fairy tale about a fox, a crow and a river.",
    "Describe a day in the life of a medieval blacksmith in detail.",
    "Explain how the internet routes a message from one computer to another.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(kind: str, model: str | None, clients: int | None, threads: int, binary: str | None):
    """The server with `clients` slots (None: chatcli's default), once /health answers."""
    port = free_port()
    if kind == "chatcli":
        argv = [sys.executable, "-m", "chatcli", "serve", "--port", str(port)]
        argv += ["--parallel", str(clients)] if clients else []  # a slot a client, as llama-server's -np below
        argv += ["--alias", MODEL]  # the name the requests give the model
        argv += ["--model", model] if model else []
    else:
        argv = [binary, "-m", model, "--port", str(port), "-np", str(clients), "-t", str(threads)]
        argv += ["-c", str(2048 * clients)]  # each slot a context of its own
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{kind} exited with {proc.returncode} before it answered")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"{kind} did not answer /health within 300 s")


MODEL = "bench"  # chatcli serve --alias bench; llama-server answers to any name
APIS = ("openai", "anthropic", "ollama")


def request(api: str, prompt: str, tokens: int) -> tuple[str, dict]:
    """The route and body of one streamed, greedy request of `tokens` tokens through `api`."""
    messages = [{"role": "user", "content": prompt}]
    if api == "anthropic":
        return "/v1/messages", {"model": MODEL, "messages": messages, "max_tokens": tokens, "temperature": 0,
                                "stream": True}  # fmt: skip
    if api == "ollama":
        options = {"num_predict": tokens, "temperature": 0}
        return "/api/chat", {"model": MODEL, "messages": messages, "options": options, "stream": True}
    return "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": tokens, "temperature": 0,
                                    "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip


def read(api: str, line: str) -> tuple[bool, int | None]:
    """A streamed line: whether it brings text, and the reply's token count where it says it."""
    if api == "ollama":
        event = json.loads(line) if line.strip() else {}
        return bool((event.get("message") or {}).get("content")), event.get("eval_count") if event.get("done") else None
    if not line.startswith("data: ") or line == "data: [DONE]":
        return False, None
    event = json.loads(line[6:])
    if api == "anthropic":
        count = (event.get("usage") or {}).get("output_tokens") if event.get("type") == "message_delta" else None
        return bool((event.get("delta") or {}).get("text")), count
    count = (event.get("usage") or {}).get("completion_tokens")
    return any((c.get("delta") or {}).get("content") for c in event.get("choices") or []), count


def one_request(url: str, prompt: str, tokens: int, t0: float, out: list, i: int, api: str = "openai") -> None:
    """One streamed completion: (seconds to the first token, tokens, seconds to the last token), from t0."""
    route, body = request(api, prompt, tokens)
    first = last = count = None
    chunks = 0
    with httpx.stream("POST", url + route, json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            text, said = read(api, line)
            count = said if said is not None else count
            if text:
                now = time.perf_counter() - t0
                first = now if first is None else first
                last = now
                chunks += 1
    out[i] = (first or 0.0, count or chunks, last or 0.0)


def load(url: str, clients: int, tokens: int, api: str = "openai") -> dict:
    one_request(url, "Say hello.", 8, time.perf_counter(), [None], 0, api)  # warm: the first request's costs
    results: list = [None] * clients
    t0 = time.perf_counter()
    workers = [
        threading.Thread(
            target=one_request, args=(url, PROMPTS[i % len(PROMPTS)] + f" ({i})", tokens, t0, results, i, api)
        )
        for i in range(clients)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return summary(clients, results)


def summary(clients: int, results: list) -> dict:
    """The row for `clients` from each client's (seconds to its first token, tokens, seconds to its last)."""
    ttft = sorted(r[0] for r in results)
    total = sum(r[1] for r in results)
    wall = max(r[2] for r in results)
    own = [(r[1] - 1) / (r[2] - r[0]) for r in results if r[1] > 1 and r[2] > r[0]]
    decoded, span = sum(max(r[1] - 1, 0) for r in results), wall - min(r[0] for r in results)
    return {
        "clients": clients,
        "tokens": total,
        "aggregate_tok_s": round(total / wall, 1) if wall > 0 else 0.0,
        "decode_tok_s": round(decoded / span, 1) if span > 0 else 0.0,
        "per_client_tok_s": round(statistics.median(own), 1) if own else 0.0,
        "ttft_p50_s": round(statistics.median(ttft), 3),
        "ttft_p95_s": round(ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))], 3),
    }


HOSTILE = {"messages": [{"role": "user", "content": "a"}] * 20000, "max_tokens": 2}
HI = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=10).json()


def hostile(url: str, n: int, leave_s: float) -> dict:
    """N clients of HOSTILE gone after `leave_s`, a `hi` meanwhile: its latency and the slots' release time."""
    one_request(url, "Say hello.", 8, time.perf_counter(), [None], 0)  # warm
    start = health(url)["requests"]["cancelled"]
    left: list[float] = []
    freed: list[float] = []
    done = threading.Event()

    def leaver(i: int) -> None:
        try:
            body = {**HOSTILE, "stream": i % 2 == 0}
            httpx.post(url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(600, read=leave_s))
        except httpx.ReadTimeout:
            pass
        left.append(time.perf_counter())

    def watch() -> None:
        while len(freed) < n and not done.is_set():
            count = health(url)["requests"]["cancelled"] - start
            freed.extend([time.perf_counter()] * (count - len(freed)))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    leavers = [threading.Thread(target=leaver, args=(i,)) for i in range(n)]
    for t in leavers:
        t.start()
    while health(url)["pending"] < n:
        time.sleep(0.01)
    sent = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=HI, timeout=600)
    hi = time.perf_counter() - sent
    r.raise_for_status()
    for t in leavers:
        t.join()
    watcher.join(60)
    done.set()
    release = [f - t for f, t in zip(freed, sorted(left), strict=False)]
    return {
        "hostile": n,
        "leave_s": leave_s,
        "hi_s": round(hi, 3),
        "hi_after_left_s": round(sent + hi - max(left), 3),
        "release_max_s": round(max(release), 3) if len(release) == n else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a .gguf, folder or hub id (default: the embedded model)")
    ap.add_argument("--clients", default="1,4,8", help="numbers of clients, comma separated")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server's -t")
    ap.add_argument("--llama-server", default=shutil.which("llama-server"), help="llama-server binary")
    ap.add_argument("--api", default="openai", help=f"the APIs the clients speak, comma separated: {', '.join(APIS)}")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of the requests through every --api, each round starting with the next API; with several "
        "rounds, each API's aggregate rate as a share of chat completions' in the same round (their median)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hostile", type=int, metavar="N", help="only: N clients of 20,000 messages that leave, a hi")
    ap.add_argument("--leave", type=float, default=1.0, help="seconds before a hostile client leaves")
    args = ap.parse_args()
    if args.hostile:
        proc, url = start_server("chatcli", args.model, None, args.threads, None)
        try:
            row = hostile(url, args.hostile, args.leave)
        finally:
            proc.terminate()
            proc.wait(30)
        if args.json:
            print(json.dumps(row, indent=1))
            return
        release = "not all counted" if row["release_max_s"] is None else f"{row['release_max_s']:.2f} s"
        print(
            f"hostile {row['hostile']} (20,000 messages each, gone after {row['leave_s']:g} s): hi answered in "
            f"{row['hi_s']:.2f} s ({row['hi_after_left_s']:.2f} s after the last left); slots free within {release} "
            "of their clients leaving"
        )
        return
    counts = [int(c) for c in args.clients.split(",")]
    apis = [a.strip() for a in args.api.split(",") if a.strip()]
    if not apis or set(apis) - set(APIS):
        raise SystemExit(f"--api takes {', '.join(APIS)}, comma separated; got {args.api!r}")
    sides = ["chatcli"]
    if args.llama_server and args.model and args.model.endswith(".gguf"):
        sides.append("llama-server")
    rows = []
    for side in sides:
        for n in counts:
            proc, url = start_server(side, args.model, n, args.threads, args.llama_server)
            try:  # every API on the same server, in turn: the same engine under each
                for turn in range(args.rounds):
                    order = apis[turn % len(apis) :] + apis[: turn % len(apis)] if side == "chatcli" else ["openai"]
                    for api in order:
                        rows.append({"server": side, "api": api, "round": turn, **load(url, n, args.tokens, api)})
            finally:
                proc.terminate()
                proc.wait(30)
    shares = api_shares(rows)
    if args.json:
        print(json.dumps({"rows": rows, "shares": shares} if shares else rows, indent=1))
        return
    print(f"{args.tokens} tokens a client, greedy; {os.cpu_count()} CPUs")
    head = f"{'server':14s} {'api':9s} {'clients':>7s} {'aggregate':>10s} {'decode':>7s} {'per client':>11s}"
    print(f"{head} {'TTFT p50':>9s} {'TTFT p95':>9s}")
    for r in rows:
        print(
            f"{r['server']:14s} {r['api']:9s} {r['clients']:7d} {r['aggregate_tok_s']:10.1f} {r['decode_tok_s']:7.1f} "
            f"{r['per_client_tok_s']:11.1f} {r['ttft_p50_s']:9.3f} {r['ttft_p95_s']:9.3f}"
        )
    for s in shares:
        print(
            f"{s['api']} / openai, {s['clients']} client(s), {s['rounds']} rounds: median {s['median']:.3f} "
            f"(quartiles {s['q1']:.3f}-{s['q3']:.3f}, {s['min']:.3f}-{s['max']:.3f})"
        )


def api_shares(rows: list[dict]) -> list[dict]:
    """Each API's aggregate rate as a share of chat completions' in the same round and number of clients (a pair
    taken within seconds: this machine's speed drifts between minutes), summed up over the rounds."""
    openai = {
        (r["clients"], r["round"]): r["aggregate_tok_s"]
        for r in rows
        if r["server"] == "chatcli" and r["api"] == "openai"
    }
    pairs: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        base = openai.get((r["clients"], r["round"]))
        if r["server"] == "chatcli" and r["api"] != "openai" and base:
            pairs.setdefault((r["api"], r["clients"]), []).append(r["aggregate_tok_s"] / base)
    out = []
    for (api, clients), ratios in pairs.items():
        if len(ratios) < 2:
            continue
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else (min(ratios), 0, max(ratios))
        out.append({"api": api, "clients": clients, "rounds": len(ratios), "median": statistics.median(ratios),
                    "q1": q1, "q3": q3, "min": min(ratios), "max": max(ratios)})  # fmt: skip
    return out


if __name__ == "__main__":
    main()
