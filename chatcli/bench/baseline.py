"""References the engine is measured against: transformers' `generate()`, this CPU's
sgemm ceiling for the model's prefill, llama.cpp when it happens to be installed, and a
one-shot process start-up timed in a child process.
"""

from __future__ import annotations

import importlib.util
import json
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
            input_ids=input_ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, pad_token_id=pad, temperature=None, top_p=None, top_k=None,
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


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def llama_cpp(gguf_path: str, decode_ids: list[int], prefill_ids: list[int], new_tokens: int, threads: int) -> dict:
    """The same prompts through llama.cpp on the same GGUF file (only when llama-cpp-python is installed)."""
    from llama_cpp import Llama  # optional, never a dependency

    llm = Llama(model_path=gguf_path, n_ctx=max(2048, len(prefill_ids) + 64), n_threads=threads,
                n_batch=512, verbose=False, logits_all=False)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prefill_ids)
    prefill_s = time.perf_counter() - t0
    llm.reset()
    llm.eval(decode_ids)
    token = int(llm.scores[llm.n_tokens - 1].argmax())
    t0 = time.perf_counter()
    for _ in range(new_tokens - 1):
        llm.eval([token])
        token = int(llm.scores[llm.n_tokens - 1].argmax())
    decode_s = time.perf_counter() - t0
    return {
        "decode_tok_s": (new_tokens - 1) / max(decode_s, 1e-9),
        "prefill_tok_s": len(prefill_ids) / max(prefill_s, 1e-9),
        "threads": threads,
    }


_STARTUP = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import transformers
t2 = time.perf_counter()
from chatcli.engine.load import LoadOptions, build_engine, load
from chatcli.engine.engine import Token
from chatcli.engine.sampling import SamplingParams
a = json.loads(sys.argv[1])
t3 = time.perf_counter()
loaded = load(a["model"], LoadOptions(device=a["device"], dtype=a["dtype"], runner=a["runner"], quantize=a["quantize"],
                                       kv_dtype=a["kv_dtype"]))
t4 = time.perf_counter()
engine = build_engine(loaded)
t5 = time.perf_counter()
for event in engine.generate([{"role": "user", "content": "Hello!"}], engine.new_session(),
                             SamplingParams(temperature=0, max_tokens=1)):
    if isinstance(event, Token):
        break
t6 = time.perf_counter()
print(json.dumps({"import_torch_s": t1 - t0, "import_transformers_s": t2 - t1, "import_chatcli_s": t3 - t2,
                  "load_s": t4 - t3, "build_engine_s": t5 - t4, "first_token_s": t6 - t5}))
"""


def startup(model: str | None, device: str, dtype: str, runner: str, quantize: str | None, kv_dtype: str = "auto",
            timeout: float = 300) -> dict:
    """A child process that imports, loads (warm conversion cache), prints the first token and exits."""
    args = json.dumps({"model": model, "device": device, "dtype": dtype, "runner": runner, "quantize": quantize,
                       "kv_dtype": kv_dtype})
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _STARTUP, args], capture_output=True, text=True, timeout=timeout)
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = (proc.stderr or "").strip().splitlines()
        return {"error": lines[-1] if lines else f"exit status {proc.returncode}", "total_s": total}
    parts = json.loads(proc.stdout.strip().splitlines()[-1])
    parts["interpreter_and_exit_s"] = max(0.0, total - sum(parts.values()))
    parts["total_s"] = total
    return parts
