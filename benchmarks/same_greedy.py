"""chatcli's greedy text against llama.cpp's on the same GGUF file and prompt, and which of the two the exact
computation takes where they part (issue 47: a base model's `--raw` continuation).

    CHATCLI_LLAMA_PYTHON=/path/to/python-with-llama-cpp-python \
        python benchmarks/same_greedy.py FILE.gguf [--tokens 32] [--prompt TEXT ...]

Per prompt, three greedy continuations of `--tokens` tokens:
- chatcli: `chatcli -m FILE --raw -p PROMPT --temperature 0 --lookup 0` as a user runs it (its int8 activations,
  its default KV cache);
- llama.cpp: llama-cpp-python over the same file (its own activation quantization, its f16 KV cache), greedy;
- exact: chatcli with `--quantize none --kv-dtype float32` (the file's weights dequantized, fp32 activations and
  cache: what both approximate).
It prints where each pair first differs (or that they agree to the end) and, at chatcli's and llama.cpp's first
difference, the exact run's choice there with the gap between its two best log-probabilities: two engines that
round their activations differently part at a near tie, and the question is which kept to the exact model.
Both sides tokenize the prompt themselves; where their prompts' token counts differ, that is said.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from same_logits import llama_python  # this folder's: the script's own

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]

LLAMA = """
import json, sys
from llama_cpp import Llama
path, prompt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = Llama(model_path=path, n_ctx=512, verbose=False, n_threads=2)
ids = model.tokenize(prompt.encode(), add_bos=True, special=False)
out = []
for token in model.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
    if token == model.token_eos() or len(out) == n:
        break
    out.append(token)
print(json.dumps({"prompt": ids, "ids": out}))
"""


def llama_greedy(python: str, path: Path, prompt: str, n: int) -> tuple[list[int], int]:
    """The generated ids and the prompt's token count."""
    done = subprocess.run([python, "-c", LLAMA, str(path), prompt, str(n)], check=True, capture_output=True, text=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return got["ids"], len(got["prompt"])


def chatcli_greedy(path: Path, prompt: str, n: int, *extra: str) -> tuple[list[dict], int]:
    """Each generated token's {id, token, top: [{id, logprob} x2]} from the one-shot's --json --logprobs, and the
    prompt's token count."""
    args = ["-m", str(path), "--raw", "-p", prompt, "--temperature", "0", "--max-tokens", str(n)]
    args += ["--lookup", "0", "--no-save", "--json", "--logprobs", "2", *extra]
    done = subprocess.run([sys.executable, "-m", "chatcli", *args], check=True, capture_output=True, text=True)
    got = json.loads(done.stdout)
    return got["logprobs"], got["stats"]["prompt_tokens"]


def parted(a: list[int], b: list[int]) -> int | None:
    """The first index where the two differ, or None where the shorter is a prefix of the longer."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt", action="append", help="a prompt (repeatable; default: three fixed ones)")
    args = ap.parse_args()
    python = llama_python("same_greedy")
    if not python:
        return 2
    equal = 0
    prompts = args.prompt or PROMPTS
    for prompt in prompts:
        ours, ours_prompt = chatcli_greedy(args.file, prompt, args.tokens)
        exact, _ = chatcli_greedy(args.file, prompt, args.tokens, "--quantize", "none", "--kv-dtype", "float32")
        theirs, theirs_prompt = llama_greedy(python, args.file, prompt, args.tokens)
        ids = {"chatcli": [t["id"] for t in ours], "llama.cpp": theirs, "exact": [t["id"] for t in exact]}
        counts = f" (prompt tokens: chatcli {ours_prompt}, llama.cpp {theirs_prompt})"
        print(f"{prompt!r}:" + (counts if ours_prompt != theirs_prompt else ""))
        for a, b in (("chatcli", "llama.cpp"), ("chatcli", "exact"), ("llama.cpp", "exact")):
            at = parted(ids[a], ids[b])
            said = f"part at token {at}" if at is not None else f"agree for {min(len(ids[a]), len(ids[b]))} tokens"
            print(f"  {a} / {b}: {said}")
        at = parted(ids["chatcli"], ids["llama.cpp"])
        if at is None:
            equal += 1
        elif parted(ids["chatcli"][:at], ids["exact"][:at]) is None and at < len(exact):
            top = exact[at]["top"]
            pick = {ids["chatcli"][at]: "chatcli's", theirs[at]: "llama.cpp's"}.get(top[0]["id"], "neither's")
            gap = top[0]["logprob"] - top[1]["logprob"]
            best, second = top[0]["token"], top[1]["token"]
            print(f"  at token {at} the exact run takes {pick} ({best!r}, {gap:.3f} nats ahead of {second!r})")
    print(f"chatcli's greedy text equals llama.cpp's for {args.tokens} tokens on {equal} of {len(prompts)} prompts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
