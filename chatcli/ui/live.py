"""The numbers of the reply that is streaming, as the live panels show them. Pure (no Textual).

The chat screen feeds it the turn's events and the cache's size after each; `values()` gives
the panels' text, `final_values` their text once the turn is done. TTFT is the first token's
`elapsed_s`, the same reading as the finished turn's `TurnStats.ttft_s`, so the figure does not
jump when the reply ends. A prefill of a few tokens shows its time, not a rate; a turn whose cache
was read from disk (the first after `-c`) says so. `prompt_opens_thinking` says whether a reply starts in its reasoning.
`DrawPace` says how often the streaming reply is drawn; `QuietHeap` keeps the garbage collector's full passes
out of it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from chatcli.engine import Prefilled, Token, TurnStats, known
from chatcli.ui.format import human_bytes

SPARK_SAMPLES = 128  # decode-rate points kept per reply


class LiveTurn:
    def __init__(self, restored: tuple[int, float] | None = None) -> None:
        self.restored = restored  # (tokens, seconds): this turn's cache was read from disk (Chats.take_restored)
        self.tokens = 0
        self.rate = 0.0  # the engine's running decode rate
        self.prefilled: Prefilled | None = None
        self.ttft_s: float | None = None
        self.context: int | None = None  # tokens in the cache after the latest event
        self.kv_bytes: int | None = None
        self.rates: list[float] = []  # decode rate every `_rate_every` tokens: the sparkline
        self._rate_every = 1
        self._last_sample: tuple[int, float] | None = None  # (tokens, seconds since the first) of the last point

    def cache(self, context_tokens: int | None, kv_bytes: int | None) -> None:
        self.context, self.kv_bytes = context_tokens, kv_bytes

    def prefill(self, event: Prefilled) -> None:
        self.prefilled = event

    def token(self, event: Token) -> None:
        if self.ttft_s is None:
            self.ttft_s = event.elapsed_s
        self.tokens = event.completion_tokens
        self.rate = event.decode_tok_s
        if event.decode_tok_s > 0 and event.completion_tokens % self._rate_every == 0:
            self._sample_rate(event.completion_tokens, event.decode_tok_s)

    def _sample_rate(self, n: int, running: float) -> None:
        """Add the decode speed since the previous sample to the sparkline's points.

        The engine reports a running rate, (n - 1) / (t_n - t_1); inverting it gives each
        token's time since the first, so the speed over an interval needs no UI clock and
        stays exact however the UI batches events. At most SPARK_SAMPLES points are kept:
        when full, neighbours are averaged and sampling halves its pace."""
        elapsed = (n - 1) / running
        if self._last_sample is not None:
            m, before = self._last_sample
            if elapsed > before:
                self.rates.append((n - m) / (elapsed - before))
        self._last_sample = (n, elapsed)
        if len(self.rates) >= SPARK_SAMPLES:
            pairs = zip(self.rates[::2], self.rates[1::2], strict=False)  # an odd last point is dropped
            self.rates = [(a + b) / 2 for a, b in pairs]
            self._rate_every *= 2

    def values(self) -> dict[str, str]:
        """The panels' rows that have a value so far."""
        values = {"tokens": str(self.tokens)}
        pre = self.prefilled
        if pre is not None:
            values["prefill"] = prefill_rate(pre.prefill_tokens, pre.prefill_s)
            values["prompt"] = prompt_text(pre.cached_tokens, pre.prefill_tokens, self.restored is not None)
        if self.ttft_s is not None:
            values["ttft"] = f"{self.ttft_s * 1000:.0f} ms"
        if self.tokens > 1:
            values["decode"] = f"{self.rate:.1f} tok/s"
        if self.context is not None:
            values["kv"] = human_bytes(self.kv_bytes)
        return values


RATE_MIN_TOKENS = 8  # a prefill of fewer tokens shows its time, not a rate


def prefill_rate(tokens: int | None, seconds: float | None) -> str:
    """The prefill row: tokens a second, or the time it took where it prefilled under RATE_MIN_TOKENS
    (one token in 250 ms is no "4 tok/s": a forward's fixed cost, the templating, dominate it)."""
    if tokens is None or seconds is None:
        return "n/a"
    if tokens < RATE_MIN_TOKENS:
        return f"{seconds * 1000:.0f} ms for {tokens} tok"
    return f"{tokens / seconds:.0f} tok/s" if seconds > 0 else "–"


def prefill_seconds(stats: TurnStats) -> float | None:
    """A finished turn's prefill time, from its rate (None: a server's, not measurable)."""
    if stats.prefill_tok_s is None or stats.prefill_tokens is None:
        return None
    return stats.prefill_tokens / stats.prefill_tok_s if stats.prefill_tok_s > 0 else 0.0


def prompt_text(cached: int | None, prefilled: int | None, restored: bool = False) -> str:
    """The prompt row: tokens read from the cache and computed anew ("n/a" where a server does not say);
    `restored`: the cache was read from disk for this turn (the first after `-c`)."""
    return f"{known(cached)} {'restored' if restored else 'cached'} · {known(prefilled)} new"


def restored_text(restored: tuple[int, float] | None) -> str:
    """The reply note's part for a turn whose cache came from disk: (tokens, seconds) of the restore."""
    if restored is None:
        return ""
    tokens, seconds = restored
    return f"cache restored from disk: {tokens} tokens in {seconds * 1000:.0f} ms"


def final_values(stats: TurnStats, drafts: str, restored: bool = False) -> dict[str, str]:
    """The panels' rows for a finished turn (`drafts`: its drafts row, "n/a" where a server answered)."""
    return {
        "ttft": f"{stats.ttft_s * 1000:.0f} ms",
        "prefill": prefill_rate(stats.prefill_tokens, prefill_seconds(stats)),
        "decode": f"{stats.decode_tok_s:.1f} tok/s",
        "tokens": str(stats.completion_tokens),
        "prompt": prompt_text(stats.cached_tokens, stats.prefill_tokens, restored),
        "kv": human_bytes(stats.kv_cache_bytes),
        "drafts": drafts,
    }


def prompt_opens_thinking(engine) -> bool:
    """The chat template ends the prompt inside `<think>` (DeepSeek-R1 style): the reply then
    begins with reasoning and has no opening tag of its own. The generation prompt is the
    template's, whatever the conversation: a one-message one shows it."""
    render = getattr(getattr(engine, "tokenizer", None), "render", None)
    if render is None:
        return False
    try:
        return render([{"role": "user", "content": "Hi"}]).rstrip().endswith("<think>")
    except Exception:  # noqa: BLE001 - a template that cannot render fails the turn itself, visibly
        return False


class DrawPace:
    """How often the streaming reply is drawn. The chat screen ticks every `fastest` seconds and draws
    when `due()`: at every tick while drawing costs the UI thread under SHARE of a core, less often (to
    SLOWEST_S apart) while it costs more. A draw lays the reply's last block out and composes the chat
    pane again (it scrolls with the stream): 30 ms of the UI thread at 140x45 on a 2-core machine
    (`benchmarks/tui_speed.py`). The decode loop no longer waits for it (the model runs in a generation
    process: `chatcli.engine.ProcessEngine`), but the cores are shared, and on 2 the kernel's team wants
    both. The cost is the UI thread's CPU time a second since the last draw (`time.thread_time`: the
    ticks and the drawing run on that thread)."""

    SHARE = 0.1  # of a core: what drawing may take from the kernel's threads
    SLOWEST_S = 0.5

    def __init__(
        self,
        fastest: float,
        clock: Callable[[], float] = time.perf_counter,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self.fastest = self.interval = fastest
        self.clock, self.cpu = clock, cpu
        self._last = (clock(), cpu())

    def due(self) -> bool:
        now, used = self.clock(), self.cpu()
        wall = now - self._last[0]
        if wall < self.interval * 0.9:  # a tick a little early still draws
            return False
        busy = (used - self._last[1]) / max(wall, 1e-6)
        if busy > self.SHARE:
            self.interval = min(self.SLOWEST_S, self.interval * 1.5)
        elif busy < self.SHARE / 2:
            self.interval = max(self.fastest, self.interval / 1.5)
        self._last = (now, used)
        return True


class QuietHeap:
    """Python's cyclic garbage collector while a reply streams. Its full collections walk every object
    the UI holds (Textual's widgets and styles, the conversation): 60-100 ms of the UI thread each, one
    or more a second while a reply streams (the drawing makes many short-lived objects), and on a 2-core
    machine that time is taken from the kernel's team. `streaming()` at a turn's start freezes what is
    alive (`gc.freeze`: left out of every collection; the reply's young objects are still collected),
    and collects the young objects less often (STREAMING_THRESHOLDS); `settled()` at its end gives both
    back, and the collector runs as before between turns.

    Less often, because a collection walks the young objects still alive, and the drawing keeps many
    alive from one frame to the next (strips and their caches): at Python's thresholds (700, 10, 10) a
    2,000-token reply with code blocks (`benchmarks/tui_speed.py`'s code case, 140x45) spent 210 ms of
    the UI thread in ~400 collections, three of them of the older objects made since the freeze (45 ms
    each, a key or Esc waiting behind them); at these, 62-79 ms in ~20, none over 13 ms."""

    STREAMING_THRESHOLDS = (10_000, 20, 20)

    def __init__(self) -> None:
        self._thresholds: tuple | None = None  # Python's, while a reply streams: frozen till `settled`

    def streaming(self) -> None:
        gc.freeze()
        if self._thresholds is None:
            self._thresholds = gc.get_threshold()
        gc.set_threshold(*self.STREAMING_THRESHOLDS)

    def settled(self) -> None:
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            gc.unfreeze()
            self._thresholds = None
