"""References the engine is measured against: transformers' `generate()`, this CPU's
sgemm ceiling for the model's prefill, llama.cpp when it happens to be installed, and a
one-shot process start-up timed in a child process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time


def _timed_generate(model, ids, new_tokens: int) -> float:
    import torch

    input_ids = torch.tensor([ids], dtype=torch.long, device=model.device)  # [1, S]
    mask = torch.ones_like(input_ids)  # [1, S]
    pad = getattr(model.generation_config, "pad_token_id", None)
    if pad is None:
        pad = getattr(model.config, "eos_token_id", None) or 0
        pad = pad[0] if isinstance(pad, (list, tuple)) else pad
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad,
            temperature=None,
            top_p=None,
            top_k=None,
        )
    return time.perf_counter() - t0


def hf_generate(model, decode_ids: list[int], prefill_ids: list[int], new_tokens: int) -> dict:
    """transformers' own `generate()`, greedy, on the same model, prompts and dtype.

    Decode rate: (N - 1) tokens over the time N new tokens take beyond one new token,
    so prefill and the first token cancel out. Prefill rate: the long prompt with one new token.
    """
    new_tokens = max(2, new_tokens)
    _timed_generate(model, decode_ids[:8], 2)  # warm-up
    one = min(_timed_generate(model, decode_ids, 1) for _ in range(2))
    many = _timed_generate(model, decode_ids, new_tokens)
    prefill_s = _timed_generate(model, prefill_ids, 1)
    return {
        "hf_generate_decode_tok_s": (new_tokens - 1) / max(many - one, 1e-9),
        "hf_generate_prefill_tok_s": len(prefill_ids) / max(prefill_s, 1e-9),
        "hf_generate_ttft_s": one,
        "new_tokens": new_tokens,
    }


def sgemm_ceiling(config, prompt_tokens: int, chunk: int, dtype=None, reps: int = 3) -> dict:
    """The fastest prefill this CPU's matmuls allow: the model's projections alone, at their shapes.

    Times `[S, in] @ [in, out]` for every projection of one layer (q/k/v, output, gate/up,
    down) for each prefill chunk size S, times the layer count, plus the output head for
    one row. Attention's matmuls (causal: QK^T and PV over the cached and new positions)
    are added as FLOPs at the rate the projections reached. Element-wise work is left out.
    """
    import torch

    dtype = dtype or torch.float32
    hidden, inter = config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    hd = getattr(config, "head_dim", None) or hidden // heads
    shapes = [(hidden, (heads + 2 * kv) * hd), (heads * hd, hidden), (hidden, 2 * inter), (inter, hidden)]
    sizes = [chunk] * (prompt_tokens // chunk) + ([prompt_tokens % chunk] if prompt_tokens % chunk else [])
    total_s = flops = 0.0
    with torch.inference_mode():
        for size in sorted(set(sizes)):
            layer_s = 0.0
            for n_in, n_out in shapes:
                a = torch.randn(size, n_in, dtype=dtype)  # [S, in]
                b = torch.randn(n_in, n_out, dtype=dtype)  # [in, out]
                out = torch.empty(size, n_out, dtype=dtype)  # [S, out]
                torch.matmul(a, b, out=out)
                best = float("inf")
                for _ in range(reps):
                    t0 = time.perf_counter()
                    torch.matmul(a, b, out=out)
                    best = min(best, time.perf_counter() - t0)
                layer_s += best
                flops += 2.0 * size * n_in * n_out * config.num_hidden_layers * sizes.count(size)
            total_s += layer_s * config.num_hidden_layers * sizes.count(size)
        head_a = torch.randn(1, hidden, dtype=dtype)  # [1, D]
        head_b = torch.randn(hidden, config.vocab_size, dtype=dtype)  # [D, V]
        t0 = time.perf_counter()
        head_a @ head_b
        total_s += (time.perf_counter() - t0) * len(sizes)
    rate = flops / max(total_s, 1e-9)  # FLOP/s
    attn_flops = 0.0
    offset = 0
    for size in sizes:  # per layer: QK^T and PV, 2 * H * hd * S * (offset + S/2) each
        attn_flops += 4.0 * heads * hd * size * (offset + size / 2) * config.num_hidden_layers
        offset += size
    with_attention_s = total_s + attn_flops / rate
    return {
        "prompt_tokens": prompt_tokens,
        "ceiling_prefill_tok_s": prompt_tokens / with_attention_s,
        "ceiling_projections_tok_s": prompt_tokens / max(total_s, 1e-9),
        "sgemm_gflop_s": rate / 1e9,
        "attention_flop_share": attn_flops / (attn_flops + flops),
    }


def llama_python() -> str | None:
    """An interpreter that has llama-cpp-python: `$CHATCLI_LLAMA_PYTHON` (a benchmark-only venv's
    python, the recommended set-up), else this one where `llama_cpp` is importable, else None."""
    other = os.environ.get("CHATCLI_LLAMA_PYTHON")
    if other:
        return other if os.access(other, os.X_OK) else None
    return sys.executable if importlib.util.find_spec("llama_cpp") is not None else None


_LLAMA = r"""
import json, sys, time
from llama_cpp import Llama
a = json.loads(sys.argv[1])
llm = Llama(model_path=a["gguf"], n_ctx=max(2048, len(a["prefill"]) + 64), n_threads=a["threads"], n_batch=512,
            verbose=False, logits_all=False)
llm.reset()
t0 = time.perf_counter()
llm.eval(a["prefill"])
prefill_s = time.perf_counter() - t0
llm.reset()
llm.eval(a["decode"])
token = int(llm.scores[llm.n_tokens - 1].argmax())
t0 = time.perf_counter()
for _ in range(a["new_tokens"] - 1):
    llm.eval([token])
    token = int(llm.scores[llm.n_tokens - 1].argmax())
decode_s = time.perf_counter() - t0
peak = next((int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")), None)
print(json.dumps({"decode_tok_s": (a["new_tokens"] - 1) / max(decode_s, 1e-9),
                  "prefill_tok_s": len(a["prefill"]) / max(prefill_s, 1e-9), "threads": a["threads"],
                  "peak_rss_kib": peak}))
"""

# A one-shot `Hi` as llama-cpp-python's users write it: load, chat-complete one token, exit.
LLAMA_ONESHOT = r"""
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_threads=int(sys.argv[2]), verbose=False)
out = llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=1, temperature=0)
print(out["choices"][0]["message"]["content"])
"""


def llama_cpp(
    python: str,
    gguf_path: str,
    decode_ids: list[int],
    prefill_ids: list[int],
    new_tokens: int,
    threads: int,
    timeout: float = 600,
) -> dict:
    """The same prompts through llama.cpp on the same GGUF file, in a child process of `python`."""
    args = json.dumps(
        {"gguf": gguf_path, "decode": decode_ids, "prefill": prefill_ids, "new_tokens": new_tokens, "threads": threads}
    )
    proc = subprocess.run([python, "-c", _LLAMA, args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        lines = (proc.stderr or "").strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit status {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Runs one command from a small interpreter and prints its wall time, peak RSS (KiB) and status.
# A child forked from the bench itself would report the bench's own resident memory as its
# peak (ru_maxrss counts the image before exec), hence the extra hop.
_LAUNCH = r"""
import json, os, sys, time
devnull = os.open(os.devnull, os.O_RDWR)
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
print(json.dumps([time.perf_counter() - t0, usage.ru_maxrss, os.waitstatus_to_exitcode(status)]))
"""


def process_run(argv: list[str], env: dict | None = None, timeout: float = 300) -> tuple[float, float, int]:
    """One whole process: (wall seconds from start to exit, its peak resident MiB, exit status)."""
    done = subprocess.run(
        [sys.executable, "-S", "-c", _LAUNCH, *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    wall, peak_kib, code = json.loads(done.stdout.strip().splitlines()[-1])
    return wall, peak_kib / 1024, code


def startup(
    model: str | None, runs: int = 5, llama: str | None = None, gguf: str | None = None, threads: int = 2
) -> dict:
    """Whole processes, in turn, after one warm-up each: a one-shot `chatcli -p Hi --max-tokens 1`
    as it starts by default, in fp32 and in int8 (a private data dir: no history written),
    `python -c "import torch"`, and llama.cpp's one-shot `Hi` on the same GGUF where `llama` (an
    interpreter with llama-cpp-python) is given. Per command: the median wall time from start to
    exit and the median peak resident memory."""
    import statistics
    import tempfile

    base = [sys.executable, "-m", "chatcli", "-p", "Hi", "--max-tokens", "1", "--temperature", "0"]
    base += ["--model", model] if model else []
    commands = {
        "chatcli (default)": base,  # --quantize auto: a Q4/Q8 GGUF's own blocks on the kernel
        "chatcli fp32": base + ["--quantize", "none"],
        "chatcli int8": base + ["--quantize", "int8"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    }
    if llama and gguf:
        commands["llama.cpp (llama-cpp-python)"] = [llama, "-c", LLAMA_ONESHOT, gguf, str(threads)]
    with tempfile.TemporaryDirectory() as data:
        env = {**os.environ, "CHATCLI_DATA_DIR": data, "CHATCLI_CONFIG": os.path.join(data, "none.toml")}
        samples: dict[str, list] = {name: [] for name in commands}
        for argv in commands.values():
            process_run(argv, env)  # warm-up: page cache, a first conversion
        for _ in range(runs):
            for name, argv in commands.items():
                samples[name].append(process_run(argv, env))
    rows = []
    for name, got in samples.items():
        codes = {code for _, _, code in got}
        rows.append(
            {
                "command": name,
                "wall_s": statistics.median(w for w, _, _ in got),
                "peak_mib": statistics.median(m for _, m, _ in got),
                "exit": max(codes, key=abs),
            }
        )
    return {"runs": runs, "rows": rows}


def cpu_name() -> str:
    """The CPU's model name, as figures quote it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        import platform

        return platform.processor()
