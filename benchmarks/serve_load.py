"""N clients streaming at once through `chatcli serve`'s HTTP API: what a team sharing one server,
or an agent's parallel calls, get from it.

    python benchmarks/serve_load.py [--model PATH] [--clients 1,4,8] [--tokens 64] [--json]
    python benchmarks/serve_load.py --model FILE.gguf --llama-server PATH  # llama-server -np N beside it

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


def start_server(kind: str, model: str | None, clients: int, threads: int, binary: str | None):
    port = free_port()
    if kind == "chatcli":
        argv = [sys.executable, "-m", "chatcli", "serve", "--port", str(port), "--parallel", str(clients)]
        argv += ["--model", model] if model else []  # a slot a client, as llama-server's -np below
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


def one_request(url: str, prompt: str, tokens: int, t0: float, out: list, i: int) -> None:
    """One streamed completion: (seconds to the first token, tokens, seconds to the last token), from t0."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = last = None
    chunks, usage = 0, None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            if any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
                now = time.perf_counter() - t0
                first = now if first is None else first
                last = now
                chunks += 1
    count = (usage or {}).get("completion_tokens") or chunks
    out[i] = (first or 0.0, count, last or 0.0)


def load(url: str, clients: int, tokens: int) -> dict:
    one_request(url, "Say hello.", 8, time.perf_counter(), [None], 0)  # warm: the first request's costs
    results: list = [None] * clients
    t0 = time.perf_counter()
    workers = [
        threading.Thread(target=one_request, args=(url, PROMPTS[i % len(PROMPTS)] + f" ({i})", tokens, t0, results, i))
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a .gguf, folder or hub id (default: the embedded model)")
    ap.add_argument("--clients", default="1,4,8", help="numbers of clients, comma separated")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server's -t")
    ap.add_argument("--llama-server", default=shutil.which("llama-server"), help="llama-server binary")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    sides = ["chatcli"]
    if args.llama_server and args.model and args.model.endswith(".gguf"):
        sides.append("llama-server")
    rows = []
    for side in sides:
        for n in counts:
            proc, url = start_server(side, args.model, n, args.threads, args.llama_server)
            try:
                rows.append({"server": side, **load(url, n, args.tokens)})
            finally:
                proc.terminate()
                proc.wait(30)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{args.tokens} tokens a client, greedy; {os.cpu_count()} CPUs")
    head = f"{'server':14s} {'clients':>7s} {'aggregate':>10s} {'decode':>7s} {'per client':>11s}"
    print(f"{head} {'TTFT p50':>9s} {'TTFT p95':>9s}")
    for r in rows:
        print(
            f"{r['server']:14s} {r['clients']:7d} {r['aggregate_tok_s']:10.1f} {r['decode_tok_s']:7.1f} "
            f"{r['per_client_tok_s']:11.1f} {r['ttft_p50_s']:9.3f} {r['ttft_p95_s']:9.3f}"
        )


if __name__ == "__main__":
    main()
