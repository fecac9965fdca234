"""The TUI's decode speed beside the one-shot's, on the same prompt and settings (issue 50).

    python benchmarks/tui_speed.py [--rounds 2] [--cases story,code] [--sizes 140x45,80x24] [--json]
    python benchmarks/tui_speed.py --before /tmp/old   # and that checkout's TUI, in the same rounds
    python benchmarks/tui_speed.py --busy   # each measurement beside a busy process on one core
    python benchmarks/tui_speed.py --history 20   # a long chat: 20 earlier turns on screen

Each measurement is a fresh process, as a user starts one: the one-shot (`chatcli -p PROMPT
--temperature 0 --max-tokens N [--logit-bias ID=-100 …] --json --no-save`), then the real app driven
headless with Pilot (`ChatApp.run_test`, this file run with `--tui`) on the same prompt and settings,
the prompt typed and sent with Enter, a pair taken together (this machine's speed drifts between
minutes: only figures taken side by side compare). The cases:

- `story`: "Write a long story about a lighthouse keeper.", 300 tokens;
- `code`: "Show five Python examples, each in its own code block …", 2,000 tokens with the end-of-turn
  ids banned (`--logit-bias ID=-100`) and `--frequency-penalty 0.5` (else the embedded model writes one
  block for ever), so the reply is long and has many code blocks (their count is printed).

Per case and terminal size: decode tok/s and TTFT of each (the engine's own figures, `TurnStats`:
the panels' and `--json`'s), the TUI's share of the one-shot's speed, `shown`: the time from Enter to
the reply's first text drawn (what a user sees as TTFT), the UI thread's CPU seconds a second while the
reply streams (`ui cpu`) and, on a line below, its CPU time in each layout and paint of the screen
(Textual's `Screen._refresh_layout`: a key or Esc waits behind the one under way), then a third run of
the TUI where keys are typed into the prompt while the reply streams (one every 100 ms): how long each
took to show in the prompt (the key sent to the app, to the refresh after the prompt holds it: p50 /
p95), and, half-way through the reply, Esc: the time to the last token the screen took in (`stop`: the
reply stops growing) and to the turn's end (`end`: the reply marked stopped, after its KV cache was
written to disk; the worst of the rounds). Headless, the app lays out and renders every frame but writes
no terminal: a real terminal costs a little more.
The load average at the start and end is printed: other processes on a 2-core machine change all of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    prompt: str
    tokens: int
    ban: tuple[int, ...] = ()  # ids given --logit-bias ID=-100 (SmolLM2's end-of-turn ids: 0 and 2)
    frequency_penalty: float = 0.0  # the embedded model repeats one block for ever without it


CASES = {
    "story": Case("Write a long story about a lighthouse keeper.", 300),
    "code": Case(
        "Show five Python examples, each in its own code block: a loop, a function, a class, a list comprehension "
        "and a dictionary.",
        2000,
        (0, 2),
        0.5,
    ),
}
KEY_EVERY_S = 0.1
# `--history N`: a long chat's earlier turns on screen before the prompt, each a question and this reply
# (~10 KB: paragraphs and code blocks), as a conversation opened with /resume shows them
HISTORY_REPLY = "\n\n".join(
    f"Step {i}: a paragraph that explains the next example in a sentence or two, as a model writes them."
    f"\n\n```python\ndef step_{i}(items):\n    total = 0\n    for item in items:\n        total += item * {i}\n"
    f"    return total\n```"
    for i in range(40)
)


def code_blocks(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.lstrip().startswith("```")) // 2


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- the one-shot ----------------------------------------------------------------


def oneshot(case: Case, env: dict) -> dict:
    cmd = [sys.executable, "-m", "chatcli", "-p", case.prompt, "--temperature", "0", "--max-tokens", str(case.tokens)]
    for token_id in case.ban:
        cmd += ["--logit-bias", f"{token_id}=-100"]
    if case.frequency_penalty:
        cmd += ["--frequency-penalty", str(case.frequency_penalty)]
    out = subprocess.run([*cmd, "--json", "--no-save"], env=env, capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    stats = result["stats"]
    return {
        "decode": stats["decode_tok_s"],
        "ttft": stats["ttft_s"],
        "tokens": stats["completion_tokens"],
        "blocks": code_blocks(result["reply"]),
    }


# -- the TUI, in a process of its own (`--tui CASE WxH MODE`) ----------------------------


def params_of(case: Case):
    from chatcli.engine import SamplingParams

    bias = tuple((i, -100.0) for i in case.ban)
    return SamplingParams(
        temperature=0, max_tokens=case.tokens, logit_bias=bias, frequency_penalty=case.frequency_penalty
    )


async def echo_latency(app, prompt, char: str) -> float:
    """Send one key to the app as the terminal would; seconds until the prompt holds it and the screen refreshed."""
    from textual import events

    sent = time.perf_counter()
    before = prompt.text
    app._driver.send_message(events.Key(char, char))
    while prompt.text == before:
        await asyncio.sleep(0.0005)
    await prompt.wait_for_refresh()
    return time.perf_counter() - sent


async def drive(case: Case, size: tuple[int, int], typing: bool) -> dict:
    from chatcli.ui.persist import PromptHistory

    with tempfile.TemporaryDirectory(prefix="tui-speed-history-") as folder:
        return await drive_in(case, size, typing, PromptHistory(Path(folder) / "history.jsonl"))


async def drive_in(case: Case, size: tuple[int, int], typing: bool, history) -> dict:
    from textual import events

    from chatcli.options import StartOptions
    from chatcli.ui.app import ChatApp

    app = ChatApp(StartOptions(params=params_of(case)), history=history, remember=False)
    result: dict = {}
    async with app.run_test(size=size) as pilot:
        while app.chat_screen is None or app.chat_screen.engine is None:
            await asyncio.sleep(0.02)
        screen = app.chat_screen
        if screen.load_error:
            raise SystemExit(f"the model did not load: {screen.load_error}")
        for n in range(int(os.environ.get("TUI_SPEED_HISTORY", "0"))):
            screen.pane.add_user(f"Earlier question {n}.")
            screen.pane.add_saved_reply(HISTORY_REPLY, "earlier", 2 * n + 2)
        screen.pane.follow()
        if hasattr(screen.pane, "settle"):  # (a checkout before the shelf)
            screen.pane.settle()
        await pilot.pause()
        screen.prompt.load_text(case.prompt)
        await pilot.pause()
        shown: list[float] = []  # when the reply's first text was drawn
        flush = screen._flush

        async def first_flush() -> None:
            text = bool(screen._buffer)  # text to draw
            await flush()
            if text and not shown:
                shown.append(time.perf_counter())

        screen._flush = first_flush
        draws: list[float] = []  # the UI thread's seconds in each layout and paint of the screen while it streams
        refresh_layout = type(screen)._refresh_layout

        def timed_refresh(*args, **kwargs):
            start = time.thread_time()
            try:
                return refresh_layout(screen, *args, **kwargs)
            finally:
                draws.append(time.thread_time() - start)

        screen._refresh_layout = timed_refresh
        cpu, wall = time.thread_time(), time.perf_counter()
        await pilot.press("enter")
        echoes: list[float] = []
        stop_s = end_s = None
        while screen.turns_done == 0:
            if not typing:
                await asyncio.sleep(0.02)
                continue
            if screen.live.tokens >= case.tokens // 2 and stop_s is None:
                esc = last = time.perf_counter()
                app._driver.send_message(events.Key("escape", None))
                tokens = screen.live.tokens
                while screen.busy:
                    if screen.live.tokens != tokens:
                        tokens, last = screen.live.tokens, time.perf_counter()
                    await asyncio.sleep(0.0005)
                stop_s, end_s = last - esc, time.perf_counter() - esc
                break
            if screen.live.tokens > 0:
                echoes.append(await echo_latency(app, screen.prompt, "abcdefghij"[len(echoes) % 10]))
            await asyncio.sleep(KEY_EVERY_S)
        while screen.busy:
            await asyncio.sleep(0.01)
        shown_s = shown[0] - wall if shown else float("nan")
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        stats = screen.last_stats
        reply = screen.conversation.messages[-1].content
        result = {
            "decode": stats.decode_tok_s,
            "ttft": stats.ttft_s,
            "tokens": stats.completion_tokens,
            "blocks": code_blocks(reply),
            "ui_cpu": cpu / wall,
            "shown": shown_s,
            "draw_ms": [d * 1000 for d in draws],
        }
        if typing:
            result["echo_ms"] = [e * 1000 for e in echoes]
            result["stop_ms"] = None if stop_s is None else stop_s * 1000
            result["end_ms"] = None if stop_s is None else end_s * 1000
        app.action_quit_clean()
    return result


def tui(case: Case, size: tuple[int, int], typing: bool, env: dict) -> dict:
    mode = "typing" if typing else "plain"
    cmd = [
        sys.executable,
        __file__,
        "--tui",
        next(k for k, v in CASES.items() if v == case),
        f"{size[0]}x{size[1]}",
        mode,
    ]
    # from its checkout: the generation process (`python -m chatcli.engine.process.host`) puts the working
    # directory first on its path, so another checkout's front end would start this one's
    out = subprocess.run(cmd, env=env, cwd=env["PYTHONPATH"], capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"the TUI run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the report ------------------------------------------------------------------


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)] if values else float("nan")


def summary(name: str, size: tuple[int, int], tree: str, runs: list[tuple[dict, dict, dict]]) -> dict:
    """One case at one size for one checkout: `runs` are (one-shot, TUI, TUI typing) taken together."""
    ratios = [t["decode"] / o["decode"] for o, t, _ in runs]
    echoes = [e for *_, k in runs for e in k["echo_ms"]]
    return {
        "case": name,
        "size": f"{size[0]}x{size[1]}",
        "tree": tree,
        "oneshot_tok_s": statistics.median(o["decode"] for o, _, _ in runs),
        "tui_tok_s": statistics.median(t["decode"] for _, t, _ in runs),
        "tui_share": statistics.median(ratios),
        "shares": ratios,
        "oneshot_ttft_ms": statistics.median(o["ttft"] for o, _, _ in runs) * 1000,
        "tui_ttft_ms": statistics.median(t["ttft"] for _, t, _ in runs) * 1000,
        "tui_shown_ms": statistics.median(t["shown"] for _, t, _ in runs) * 1000,
        "ui_cpu": statistics.median(t["ui_cpu"] for _, t, _ in runs),
        "typing_tok_s": statistics.median(k["decode"] for *_, k in runs),
        "echo_p50_ms": statistics.median(echoes) if echoes else float("nan"),
        "echo_p95_ms": p95(echoes),
        "stop_ms": max(k["stop_ms"] if k["stop_ms"] is not None else float("nan") for *_, k in runs),
        "end_ms": max(k["end_ms"] if k["end_ms"] is not None else float("nan") for *_, k in runs),
        "tokens": runs[-1][1]["tokens"],
        "code_blocks": runs[-1][1]["blocks"],
        "draw_ms": sorted(d for _, t, _ in runs for d in t["draw_ms"]),
    }


def measure(cases: list[str], sizes: list[tuple[int, int]], rounds: int, trees: dict[str, dict]) -> list[dict]:
    """`trees`: each checkout's environment by its label (this one's first); in each round the one-shot
    runs once, then each checkout's TUI, so that every figure of a round is taken within a minute."""
    rows = []
    here = next(iter(trees.values()))
    for name in cases:
        case = CASES[name]
        for size in sizes:
            runs: dict[str, list] = {label: [] for label in trees}
            for _ in range(rounds):
                one = oneshot(case, here)
                for label, env in trees.items():
                    runs[label].append((one, tui(case, size, False, env), tui(case, size, True, env)))
            for label in reversed(trees):
                rows.append(summary(name, size, label, runs[label]))
                print_row(rows[-1])
    return rows


HEADER = (
    f"{'case':6} {'size':7} {'tree':6} {'one-shot':>9} {'TUI':>7} {'share':>6} {'TTFT 1/TUI ms':>14} {'shown':>6} "
    f"{'ui cpu':>6} {'typing':>7} {'echo p50/p95 ms':>16} {'Esc: stop/end ms':>17} {'tokens':>6} {'blocks':>6}"
)


def print_row(r: dict) -> None:
    print(
        f"{r['case']:6} {r['size']:7} {r['tree']:6} {r['oneshot_tok_s']:9.1f} {r['tui_tok_s']:7.1f} "
        f"{r['tui_share']:6.0%} {r['oneshot_ttft_ms']:6.0f} / {r['tui_ttft_ms']:5.0f} {r['tui_shown_ms']:6.0f} "
        f"{r['ui_cpu']:6.2f} "
        f"{r['typing_tok_s']:7.1f} {r['echo_p50_ms']:7.1f} / {r['echo_p95_ms']:6.1f} "
        f"{r['stop_ms']:7.1f} / {r['end_ms']:7.1f} {r['tokens']:6} {r['code_blocks']:6}",
        flush=True,
    )
    draws = r["draw_ms"]
    if draws:  # a key or Esc waits behind the draw under way
        n = len(draws)
        print(
            f"{'':22}draws: {n}, the UI thread's ms each p50 {draws[n // 2]:.1f}, p90 {draws[int(0.9 * n)]:.1f}, "
            f"max {draws[-1]:.1f}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="pairs per case and size (medians are printed)")
    ap.add_argument("--cases", default="story,code")
    ap.add_argument("--sizes", default="140x45,80x24")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--before", metavar="CHECKOUT", help="another checkout's TUI, measured in the same rounds")
    ap.add_argument(
        "--busy", action="store_true", help="every measurement beside a busy process (a Python loop on one core)"
    )
    ap.add_argument("--history", type=int, default=0, help="earlier turns on screen before the prompt (a long chat)")
    ap.add_argument("--tui", nargs=3, metavar=("CASE", "SIZE", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tui:
        name, size, mode = args.tui
        width, height = map(int, size.split("x"))
        print(json.dumps(asyncio.run(drive(CASES[name], (width, height), mode == "typing"))))
        return
    with tempfile.TemporaryDirectory(prefix="tui-speed-") as folder:  # its data dir holds each reply's KV cache
        run(args, Path(folder))


def run(args: argparse.Namespace, home: Path) -> None:
    env = {
        **os.environ,
        "CHATCLI_DATA_DIR": str(home / "data"),
        "CHATCLI_CONFIG": str(home / "config.toml"),
        "TUI_SPEED_HISTORY": str(args.history),
    }
    trees = {"after" if args.before else "": {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}}
    if args.before:
        trees["before"] = {**env, "PYTHONPATH": str(Path(args.before).resolve())}
    sizes = [tuple(map(int, s.split("x"))) for s in args.sizes.split(",")]
    print(f"load average at the start: {load_average()}  ({os.cpu_count()} CPUs)")
    # a browser tab or a build on the other core: the one-shot and the TUI under the same load
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        notes = ["beside a busy process"] if spinner else []
        notes += [f"{args.history} earlier turns on screen"] if args.history else []
        print(HEADER + "".join(f"  ({note})" for note in notes))
        rows = measure(args.cases.split(","), sizes, args.rounds, trees)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    print(f"load average at the end: {load_average()}")
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
