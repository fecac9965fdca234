"""The bench result as rich tables (the default output; `--json` prints the dict instead)."""

from __future__ import annotations


def _ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a and b else "–"


def _kv_label(result: dict) -> str | None:
    kv = result.get("kv_dtype")
    return f"{kv} KV cache" if kv and kv != result["dtype"] else None


def render(result: dict, console) -> None:
    from rich.table import Table

    base = result.get("baseline") or {}
    title = f"{result['model']} · {result['device']} · {result['dtype']} · runner {result['runner']}"
    if result.get("quantize"):
        title += f" · {result['quantize']}"
    if _kv_label(result):
        title += f" · {_kv_label(result)}"
    if result.get("decode_kernel"):
        title += f" · decode {result['decode_kernel']}"
    main = Table(title=title)
    for col in ("metric", "chatcli", "transformers generate()", "ratio"):
        main.add_column(col, justify="right" if col != "metric" else "left")
    dec, pre = result["decode_tok_s"], result["prefill_tok_s"]
    bd, bp = base.get("hf_generate_decode_tok_s"), base.get("hf_generate_prefill_tok_s")
    main.add_row("decode tok/s", f"{dec:.1f}", f"{bd:.1f}" if bd else "–", _ratio(dec, bd))
    main.add_row(
        f"prefill tok/s ({result['prefill_tokens']} tokens)", f"{pre:.0f}", f"{bp:.0f}" if bp else "–", _ratio(pre, bp)
    )
    main.add_row("TTFT (short prompt)", f"{result['ttft_s'] * 1000:.0f} ms", "", "")
    ceiling = result.get("sgemm")
    if ceiling:
        c = ceiling["ceiling_prefill_tok_s"]
        main.add_row(
            "prefill sgemm ceiling tok/s", f"{c:.0f}", f"{ceiling['sgemm_gflop_s']:.0f} GFLOP/s", f"{pre / c:.0%} of it"
        )
    lcpp = result.get("llama_cpp")
    if lcpp and "error" not in lcpp:
        main.add_row(
            "llama.cpp decode tok/s", f"{dec:.1f}", f"{lcpp['decode_tok_s']:.1f}", _ratio(dec, lcpp["decode_tok_s"])
        )
        main.add_row(
            "llama.cpp prefill tok/s", f"{pre:.0f}", f"{lcpp['prefill_tok_s']:.0f}", _ratio(pre, lcpp["prefill_tok_s"])
        )
    console.print(main)

    if result["turns"]:
        turns = Table(title="multi-turn (one conversation; recompute = the same turn from an empty cache)")
        for col in ("turn", "context", "cached", "prefill", "TTFT", "TTFT recompute", "recompute/cached"):
            turns.add_column(col, justify="right")
        for row in result["turns"]:
            turns.add_row(
                str(row["turn"]),
                str(row["context_tokens"]),
                str(row["cached_tokens"]),
                str(row["prefill_tokens"]),
                f"{row['ttft_s'] * 1000:.0f} ms",
                f"{row['ttft_recompute_s'] * 1000:.0f} ms",
                _ratio(row["ttft_recompute_s"], row["ttft_s"]),
            )
        console.print(turns)

    if result.get("lookup"):
        look = Table(title=f"prompt lookup (greedy): decode without and with --lookup {result['lookup'][0]['lookup']}")
        for col in ("prompt", "off tok/s", "on tok/s", "ratio", "drafts kept", "same reply"):
            look.add_column(col, justify="right" if col != "prompt" else "left")
        for row in result["lookup"]:
            look.add_row(
                row["prompt"],
                f"{row['off_tok_s']:.1f}",
                f"{row['on_tok_s']:.1f}",
                _ratio(row["on_tok_s"], row["off_tok_s"]),
                f"{row['accepted_tokens']}/{row['draft_tokens']}",
                "yes" if row["same_reply"] else "no",
            )
        console.print(look)

    quality = result.get("quality")
    if quality:
        what = " + ".join(filter(None, [result.get("quantize"), _kv_label(result)])) or result["runner"]
        q = Table(title=f"quality: {what} vs the {result['dtype']} reference (greedy)")
        q.add_column("prompt")
        q.add_column("reference")
        q.add_column("answer")
        q.add_column("same", justify="center")
        for row in quality["prompts"]:
            q.add_row(row["prompt"], row["reference"], row["answer"], "yes" if row["identical"] else "no")
        console.print(q)
        console.print(
            f"perplexity on the fixed text ({quality['perplexity_tokens']} tokens): "
            f"{quality['perplexity']:.3f} vs {result['dtype']} {quality['perplexity_reference']:.3f} "
            f"({(quality['perplexity_ratio'] - 1) * 100:+.2f} %)"
        )

    start = result.get("startup")
    if start:
        runs = Table(title=f"one-shot `Hi`, process start to exit (median of {start['runs']}; {result.get('cpu', '')})")
        for col in ("command", "wall", "peak memory", "exit"):
            runs.add_column(col, justify="right" if col != "command" else "left")
        for row in start["rows"]:
            runs.add_row(row["command"], f"{row['wall_s']:.2f} s", f"{row['peak_mib']:.0f} MiB", str(row["exit"]))
        console.print(runs)


def render_shape(result: dict, console) -> None:
    """`chatcli bench --shape`: chatcli beside llama.cpp on a random model of that shape."""
    from rich.table import Table

    ours, theirs = result["chatcli"], result.get("llama_cpp") or {}
    quant = theirs.get("quant", "")
    kernel = f" · kernel {ours['kernel']}" if ours.get("kernel") else ""
    table = Table(title=f"random {result['shape']} · {result['cpu']} · {result['threads']} threads{kernel}")
    for col in ("metric", f"chatcli {ours['kind']}", f"llama.cpp {quant}".strip(), "ratio"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    if theirs.get("error"):
        table.caption = f"llama.cpp: {theirs['error']}"
    elif not theirs:
        table.caption = "llama.cpp: not installed ($CHATCLI_LLAMA_PYTHON names a venv's python)"

    def row(label: str, key: str, fmt: str, scale: float = 1.0) -> None:
        a, b = ours.get(key), theirs.get(key)
        table.add_row(
            label,
            format(a * scale, fmt) if a else "–",
            format(b * scale, fmt) if b else "–",
            _ratio(a, b),
        )

    row("decode tok/s", "decode_tok_s", ".1f")
    row("prefill tok/s", "prefill_tok_s", ".0f")
    row("peak RSS MiB", "peak_rss_kib", ".0f", 1 / 1024)
    table.add_row(
        "weights MiB", f"{ours['weights_mib']:.0f}", f"{theirs['file_mib']:.0f} (file)" if theirs else "–", ""
    )
    console.print(table)


def render_gguf_type(result: dict, console) -> None:
    """`chatcli bench --shape --gguf-type`: chatcli and llama.cpp on one file of that type."""
    from rich.table import Table

    ours, theirs = result["chatcli"], result.get("llama_cpp") or {}
    layers = result.get("layers_of") and result["layers"] < result["layers_of"]
    shape = f"{result['shape']} ({result['layers']} of its {result['layers_of']} layers)" if layers else result["shape"]
    title = f"random {shape} · {result['gguf_type']} ({result['file_mib']:.0f} MiB) · {result['cpu']}"
    kernel = f" · kernel {ours['kernel']}" if ours.get("kernel") else ""
    table = Table(title=f"{title} · {result['threads']} threads{kernel}")
    for col in ("metric", f"chatcli ({ours.get('weights', '')})", "llama.cpp", "ratio"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    if theirs.get("error"):
        table.caption = f"llama.cpp: {theirs['error']}"

    def row(label: str, key: str, fmt: str) -> None:
        a, b = ours.get(key), theirs.get(key)
        table.add_row(label, format(a, fmt) if a else "–", format(b, fmt) if b else "–", _ratio(a, b))

    row("decode tok/s", "decode_tok_s", ".1f")
    row("prefill tok/s", "prefill_tok_s", ".0f")
    row("first start s", "first_start_s", ".2f")
    row("first start peak MiB", "first_start_peak_mib", ".0f")
    row("one-shot s (median)", "oneshot_s", ".2f")
    row("one-shot peak MiB", "oneshot_peak_mib", ".0f")
    table.add_row("cache on disk MiB", f"{ours.get('cache_mib', 0):.0f}", "0", "")
    if ours.get("active_mib") and ours["active_mib"] < ours.get("weights_mib", 0):  # a mixture of experts
        table.add_row("weights a token reads MiB", f"{ours['active_mib']:.0f} of {ours['weights_mib']:.0f}", "", "")
    notes = [f"blocks: {result['blocks']}"] if result.get("blocks") else []
    if layers:
        cap = f", at most {result['max_file_gib']:g} GiB" if result.get("max_file_gib") else ""
        notes.append(
            f"{result['layers']} layers: the file the memory of this machine holds{cap} (bench/gguf_blocks.py)"
        )
    if notes:
        table.caption = " · ".join(filter(None, [table.caption, *notes]))
    console.print(table)


def render_depth(result: dict, console) -> None:
    """`chatcli bench --depth … --vs …`: decode and prefill by depth, each peer's beside chatcli's."""
    from rich.table import Table

    peers = result["peers"]
    title = f"{result['model']} · {result['weights']} · {result['cpu']} · {result['threads']} threads"
    table = Table(title=f"{title} · decode {result['decode_tokens']}, prefill {result['prefill_chunk']} tokens")
    table.add_column("depth", justify="right")
    for what in ("decode tok/s", "prefill tok/s"):
        table.add_column(f"{what} chatcli", justify="right")
        for name in peers:
            table.add_column(f"{name} (ratio)", justify="right")

    def cell(ours, theirs, fmt: str) -> str:
        return f"{format(theirs, fmt)} ({_ratio(ours, theirs)})" if theirs else "–"

    for row in result["rows"]:
        cells = [str(row["depth"])]
        for key, fmt in (("decode_tok_s", ".1f"), ("prefill_tok_s", ".0f")):
            cells.append(format(row[key], fmt))
            for peer in peers.values():
                cells.append(cell(row[key], peer.get("rows", {}).get(str(row["depth"]), {}).get(key), fmt))
        table.add_row(*cells)
    said = [f"{name}: {peer['error']}" for name, peer in peers.items() if peer.get("error")]
    said += [f"{name}: {' '.join(peer['command'])}" for name, peer in peers.items() if not peer.get("error")]
    table.caption = "\n".join(said) or None
    console.print(table)
