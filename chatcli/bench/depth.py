"""`chatcli bench --depth N[,N…] [--vs llama.cpp|ik]`: the speeds a user lives with as a chat grows.

For each depth N one conversation is filled with N tokens (one user message, one reply token), then
measured there, as `llama-bench -d N` measures: decode (`--max-tokens` greedy tokens after a short
question) and prefill (a `--prefill-tokens` message, one reply token), each from the same N-token KV
cache (cropped back to it between runs), the best of `--repeat`. `--vs` runs each peer's own
`llama-bench` binary on the same GGUF with the same threads, depths, prompt and decode lengths, flash
attention on (`peers.py`); the result names the command each peer ran. One table, one run.
"""

from __future__ import annotations

import click

from chatcli.bench.errors import BenchError

PEERS = ("llama.cpp", "ik")


def _depths(_ctx, _param, value):
    if value is None:
        return None
    try:
        depths = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{value}: not a comma-separated list of token counts") from None
    if not depths or min(depths) < 0:
        raise click.BadParameter(f"{value}: give one or more token counts >= 0, e.g. 0,4096,16384")
    return depths


def depth_options(command):
    """`--depth` and `--vs`, declared once for `chatcli bench`."""
    command = click.option(
        "--vs",
        "peers",
        multiple=True,
        type=click.Choice(PEERS),
        help="with --depth (default 0): also run this peer's llama-bench on the same GGUF "
        "($CHATCLI_LLAMA_BENCH / $CHATCLI_IK_BENCH name the binaries; llama.cpp's may be on PATH)",
    )(command)
    return click.option(
        "--depth",
        "depths",
        default=None,
        callback=_depths,
        metavar="N[,N…]",
        help="decode and a --prefill-tokens prefill after N tokens of context, one row each "
        "(as llama-bench -d); e.g. --depth 0,4096,16384 --prefill-tokens 512",
    )(command)


def long_filler(tokenizer, tokens: int) -> str:
    """About `tokens` tokens of the bench's text: whole copies, then `filler` for the rest."""
    from chatcli.bench.prompts import TEXT, filler

    per_copy = len(tokenizer.encode(TEXT + " "))
    copies = max(0, tokens // per_copy - 1)
    rest = tokens - copies * per_copy
    return " ".join([TEXT] * copies + ([filler(tokenizer, rest)] if rest > 8 else []))


def at_depth(engine, depth: int, decode_tokens: int, chunk: int, repeat: int) -> dict:
    """Decode and prefill speeds of `engine` after `depth` tokens of one conversation."""
    from chatcli.bench.measure import GREEDY, run_turn
    from chatcli.bench.prompts import DECODE_PROMPT, filler
    from chatcli.engine.kv.prefix import reusable_prefix

    session = engine.new_session()
    context: list[dict] = []
    if depth:  # the template's own tokens (a default system prompt) count towards the depth
        overhead = len(engine.tokenizer.encode_chat([{"role": "user", "content": ""}]))
        context = [{"role": "user", "content": long_filler(engine.tokenizer, max(1, depth - overhead))}]
        done, _ = run_turn(engine, context, session, 1)
        context.append({"role": "assistant", "content": done.reply})

    def best(messages: list[dict], max_tokens: int, key: str):
        target, dropped = engine.fit_prompt(messages, GREEDY.with_(max_tokens=max_tokens))
        if dropped:
            raise BenchError(f"depth {depth} leaves no room in the context ({engine.context_limit} tokens)")
        keep = session.cache.reachable(reusable_prefix(session.cache.ids, target))
        runs = []
        for _ in range(repeat):
            session.cache.crop(keep)
            runs.append(run_turn(engine, messages, session, max_tokens)[0])
        return max(runs, key=lambda d: getattr(d.stats, key)), keep

    dec, keep = best([*context, {"role": "user", "content": DECODE_PROMPT}], decode_tokens, "decode_tok_s")
    pre, _ = best([*context, {"role": "user", "content": filler(engine.tokenizer, chunk)}], 1, "prefill_tok_s")
    return {
        "depth": depth,
        "context_tokens": keep,  # what the KV cache held when each measurement began
        "decode_tok_s": dec.stats.decode_tok_s,
        "decode_tokens": dec.stats.completion_tokens,
        "prefill_tok_s": pre.stats.prefill_tok_s,
        "prefill_tokens": pre.stats.prefill_tokens,
    }


def bench_depth(model, options, depths, peers, decode_tokens, chunk, repeat, threads, progress) -> dict:
    """The `--depth` rows of `model` (LoadOptions `options`), each peer's beside them."""
    from chatcli.bench import peers as peer_runs
    from chatcli.bench.baseline import cpu_name
    from chatcli.bench.measure import load, warm_up
    from chatcli.engine.engine import ContextOverflow

    engine = load(model, options, threads, progress)
    need = max(depths) + chunk + decode_tokens + 64
    if need > engine.context_limit:
        raise BenchError(
            f"--depth {max(depths)} needs about {need} tokens of context; {engine.name}'s is {engine.context_limit}"
        )
    threads = getattr(engine.runner, "threads", None) or threads
    result: dict = {
        "model": engine.name,
        "weights": engine.runner.weights_dtype,
        "cpu": cpu_name(),
        "threads": threads,
        "repeat": repeat,
        "decode_tokens": decode_tokens,
        "prefill_chunk": chunk,
        "rows": [],
        "peers": {},
    }
    warm_up(engine)
    try:
        for depth in depths:
            progress(f"depth {depth}: decode {decode_tokens} tokens, prefill {chunk}")
            result["rows"].append(at_depth(engine, depth, decode_tokens, chunk, repeat))
    except ContextOverflow as exc:
        raise BenchError(str(exc)) from None
    gguf = peer_runs.gguf_of(model)
    for name in peers:
        progress(f"{name}: llama-bench on the same file")
        result["peers"][name] = peer_runs.run_peer(
            name, gguf, depths, decode_tokens, chunk, repeat, threads, options.kv_dtype
        )
    return result
