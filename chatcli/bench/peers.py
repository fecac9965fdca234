"""The peers' own `llama-bench` on the file chatcli benches (`chatcli bench --depth … --vs …`).

llama.cpp's measures decode (`-n`) and prefill (`-p`) after `-d N` tokens of context; ik_llama.cpp's
has no `-d`: its decode at depth N is `-gp N,n` (n tokens generated after an N-token prompt, the
prompt not timed), its prefill is measured at depth 0 only. Both run with flash attention on, as
their users run long chats, the threads chatcli used, and `-r` as `--repeat`; each row is their mean
(`avg_ts`). A peer that is missing or fails is reported (`error`), never a failed bench. These are
built from source for benchmarks only: never a dependency.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from chatcli.errors import one_line

BINARIES = {"llama.cpp": "CHATCLI_LLAMA_BENCH", "ik": "CHATCLI_IK_BENCH"}
TIMEOUT_S = 4 * 3600


def gguf_of(model: str | None) -> str | None:
    """The GGUF file the model comes from (the embedded one by default), for the peers."""
    from chatcli.engine.load.sources import embedded_gguf

    if model is None:
        found = embedded_gguf()
        return str(found) if found else None
    return model if model.endswith(".gguf") else None


def binary(name: str) -> str | None:
    """The peer's llama-bench: its variable, else (llama.cpp only) `llama-bench` on PATH."""
    named = os.environ.get(BINARIES[name])
    if named:
        return named
    return shutil.which("llama-bench") if name == "llama.cpp" else None


CACHE_TYPES = {"q8_0": "q8_0"}  # chatcli's --kv-dtype -> the peers' -ctk/-ctv where chatcli's is not their f16 default


def command(
    name: str, path: str, gguf: str, depths, decode_tokens: int, chunk: int, repeat: int, threads, kv: str = "auto"
) -> list:
    common = [path, "-m", gguf, "-t", str(threads), "-r", str(repeat), "-o", "json"]
    common += ["-p", str(chunk), "-n", str(decode_tokens)]
    if kv in CACHE_TYPES:  # the same cache on both sides: a q8_0 KV cache reads half the bytes of f16's
        common += ["-ctk", CACHE_TYPES[kv], "-ctv", CACHE_TYPES[kv]]
    if name == "llama.cpp":
        return [*common, "-fa", "on", "-d", ",".join(str(d) for d in depths)]
    deeper = [arg for d in depths if d for arg in ("-gp", f"{d},{decode_tokens}")]
    return [*common, "-fa", "1", *deeper]


def rows(name: str, tests: list[dict]) -> dict[int, dict]:
    """{depth: {"decode_tok_s", "prefill_tok_s"}} from the peer's JSON tests."""
    out: dict[int, dict] = {}
    for test in tests:
        n_prompt, n_gen, speed = int(test["n_prompt"]), int(test["n_gen"]), float(test["avg_ts"])
        depth = int(test.get("n_depth", 0))
        if n_prompt and n_gen:  # ik's -gp: n_gen tokens after an n_prompt-token prompt
            out.setdefault(n_prompt, {})["decode_tok_s"] = speed
        elif n_gen:
            out.setdefault(depth, {})["decode_tok_s"] = speed
        elif n_prompt:
            out.setdefault(depth, {})["prefill_tok_s"] = speed
    return out


def run_peer(
    name: str, gguf: str | None, depths, decode_tokens: int, chunk: int, repeat: int, threads, kv: str = "auto"
) -> dict:
    """One run of the peer's llama-bench: its command, and its rows by depth (or why there are none)."""
    path = binary(name)
    if not gguf:
        return {"error": "the model is not a GGUF file: the peers run GGUF files only"}
    if not path:
        where = f"set ${BINARIES[name]}" + (" or put llama-bench on PATH" if name == "llama.cpp" else "")
        return {"error": f"no llama-bench for {name}: {where}"}
    argv = command(name, path, gguf, depths, decode_tokens, chunk, repeat, threads, kv)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"command": argv, "error": one_line(exc)}
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return {"command": argv, "error": f"exit {done.returncode}: {said[-1] if said else ''}"}
    try:
        found = rows(name, json.loads(done.stdout))
    except (ValueError, KeyError, TypeError) as exc:
        return {"command": argv, "error": f"its output is not llama-bench's JSON: {one_line(exc)}"}
    return {"command": argv, "rows": {str(d): found.get(d, {}) for d in depths}}
