"""The chat screen: the current conversation (a `Conversation` and its engine `Session`) with its panes.

The conversations side — the store, the session pool, the sidebar, switching — lives
in the `Conversations` mixin (`conversations.py`), the slash commands in `SlashCommands`.

Turns run in a Textual thread worker that iterates `engine.generate(...)` and posts each
event as a `TurnEvent`; the handlers only buffer text and numbers. A UI tick (10 Hz, only
while a reply streams) writes the buffered text to the reply's Markdown stream and
refreshes the panels, so the cost per second stays bounded whatever the token rate.
"""

from __future__ import annotations

import threading

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Static

from chatcli.chat.commands import is_command
from chatcli.chat.conversation import Conversation
from chatcli.ui.format import drafts_text, human_bytes, reply_note, sampling_line, turn_line
from chatcli.ui.messages import EngineReady, LoadFailed, LoadStatus, TurnEvent, TurnFailed
from chatcli.ui.persist import PromptHistory
from chatcli.ui.screens.conversations import Conversations, one_line
from chatcli.ui.screens.slash import SlashCommands
from chatcli.ui.widgets.chat_pane import ChatPane, LoadingLine, ReplyBox, UserMessage
from chatcli.ui.widgets.panels import StatsPanel
from chatcli.ui.widgets.prompt import PromptInput

TICK_S = 1 / 10  # UI refresh while a reply streams: smooth enough, and leaves the GIL to the decode loop
# The live panels refresh every PANEL_EVERY ticks: a number that changes 10 times a second is
# unreadable, and on 2 cores their repaint took ~15 % of decode speed (33 -> 36 tok/s without it).
PANEL_EVERY = 3
NARROW_BELOW = 80  # columns
SPARK_SAMPLES = 128  # decode-rate points kept per reply


class InfoBar(Static):
    DEFAULT_CSS = "InfoBar { dock: top; height: auto; max-height: 2; padding: 0 1; background: $primary 25%; }"


def engine_label(engine) -> str:
    runner = getattr(engine, "runner", None)
    device = getattr(getattr(runner, "device", None), "type", getattr(runner, "device", "?"))
    dtype = str(getattr(runner, "dtype", "?")).removeprefix("torch.")
    return f"{getattr(engine, 'name', 'model')} · {device} · {dtype}"


def save_kv(engine, session, path) -> None:
    """Keep the conversation's KV cache on disk for the next start (best effort, in the worker)."""
    try:
        from chatcli.oneshot import save_kv as write

        write(engine, session, path)
    except Exception:  # noqa: BLE001 - an engine without a saveable cache: the next start prefills
        pass


class ChatScreen(Conversations, SlashCommands, Screen):
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]  # narrow: panels start hidden
    BINDINGS = [
        Binding("escape", "stop", "Stop reply"),
        Binding("f2", "toggle_panels", "Panels"),
        Binding("f3", "toggle_sidebar", "Conversations"),
        Binding("ctrl+n", "new_conversation", "New", priority=True),
        Binding("pageup", "scroll_chat(-1)", "Scroll", show=False, priority=True),
        Binding("pagedown", "scroll_chat(1)", "Scroll", show=False, priority=True),
        Binding("ctrl+q", "app.quit", "Quit"),
    ]

    def __init__(
        self,
        params,
        system: str | None = None,
        history: PromptHistory | None = None,
        store=None,
        resume: tuple[bool, str | None] = (False, None),
        budget: int | None = None,
        system_given: bool = False,
    ) -> None:
        super().__init__()
        self.params = params
        self.engine = None
        self.session = None
        self.default_system = system or None
        self.conversation = Conversation(system=self.default_system)
        self.history = history if history is not None else PromptHistory()
        self.load_error: str | None = None
        self.turn = 0  # id of the newest turn; events of older ones are ignored
        self.busy = False
        self.cancel: threading.Event | None = None
        self.queue: list[UserMessage] = []  # prompts sent while the model loads or a reply streams
        self.last_stats: dict | None = None
        self.turns_done = 0
        self._reply: ReplyBox | None = None
        self._buffer: list[str] = []  # text not yet written to the reply widget
        self._streamed: list[str] = []  # all the text of the streaming reply
        self._live: dict = {}
        self._rates: list[float] = []  # decode rate every `_rate_every` tokens of this reply
        self._rate_every = 1
        self._last_sample: tuple[int, float] | None = None  # (tokens, seconds since the first) of the last point
        self._tick = None
        self._ticks = 0  # ticks of the current reply (the panels refresh every PANEL_EVERY)
        self._loading: LoadingLine | None = None
        self.load_status = "Loading the model…"  # the latest LoadStatus (one may come before on_mount)
        self.pane = ChatPane()
        self.panels = StatsPanel()
        self.prompt = PromptInput(self.history, id="prompt")
        self.info = InfoBar("")
        self._turn_params = params
        self.init_conversations(store, resume, budget, system_given)

    def compose(self) -> ComposeResult:
        yield self.info
        with Horizontal(id="main"):
            yield self.sidebar
            yield self.pane
            yield self.panels
        yield self.prompt
        yield Footer()

    async def on_mount(self) -> None:
        await self.open_at_start()
        if self.engine is None and self.load_error is None:
            self._loading = LoadingLine(self.load_status)
            self.pane.mount(self._loading)
        self.refresh_info()
        self.prompt.focus()

    # -- loading ---------------------------------------------------------------

    def on_load_status(self, message: LoadStatus) -> None:
        self.load_status = message.line()
        if self._loading is not None:
            self._loading.status.update(self.load_status)

    def on_engine_ready(self, message: EngineReady) -> None:
        self.engine = message.engine
        self.start_pool(self.engine)
        self.session = self.session_for(self.conversation)
        self._drop_loading()
        self.panels.set_context(len(self.session.cache), self.engine.context_limit)
        self.refresh_pool()
        self.refresh_info()
        self._next_in_queue()

    def on_load_failed(self, message: LoadFailed) -> None:
        self.load_error = message.error
        self._drop_loading()
        self.pane.add_note(f"Could not load the model: {message.error}", error=True)
        if self.queue:
            self.pane.add_note(f"{len(self.queue)} queued prompt(s) were not sent.", error=True)
            self.queue.clear()
        self.app.notify(message.error, title="Load failed", severity="error", timeout=10)
        self.refresh_info()

    def _drop_loading(self) -> None:
        if self._loading is not None:
            self._loading.remove()
            self._loading = None

    def refresh_info(self) -> None:
        if self.engine is not None:
            head = engine_label(self.engine)
        else:
            head = "model failed to load" if self.load_error else "loading…"
        self.info.update(f"{head} │ {sampling_line(self.params)}")

    # -- sending ---------------------------------------------------------------

    async def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text
        if is_command(text):
            await self.run_command(text)
            return
        if self.load_error is not None:
            self.pane.add_note("No model is loaded, so nothing can answer (see the error above).", error=True)
            return
        waiting = self.busy or self.engine is None
        widget = self.pane.add_user(text, queued=waiting)
        self.pane.follow()
        self.queue.append(widget)
        if not waiting:
            self._next_in_queue()

    def _next_in_queue(self) -> None:
        if self.busy or self.engine is None or not self.queue:
            return
        widget = self.queue.pop(0)
        widget.remove_class("-queued")
        widget.message = self.conversation.add_user(widget.text)
        self.save_user(widget.message)
        self.begin_turn()

    def begin_turn(self) -> None:
        """Generate a reply to the conversation as it stands (its last message is the user's)."""
        self.turn += 1
        self.busy = True
        self.cancel = threading.Event()
        self._reply = self.pane.add_reply()
        self._reply.start_stream()
        self._reply.set_note("…")
        self._buffer.clear()
        self._streamed = []
        self._rates = []
        self._rate_every = 1
        self._last_sample = None
        self._live = {"tokens": 0, "rate": 0.0}
        self.panels.reset()
        self.pane.follow()
        self._ticks = 0
        self._tick = self.set_interval(TICK_S, self._on_tick)
        self.session = self.session_for(self.conversation)  # a new one if the pool evicted it
        self._turn_params = self.params
        kv = self.kv_path(self.conversation)
        self._generate(self.engine, self.turn, self.conversation.for_template(), self.session, self.params, self.cancel, kv)

    @work(thread=True, exit_on_error=False, group="turn")
    def _generate(self, engine, turn: int, messages: list, session, params, cancel: threading.Event, kv=None) -> None:
        """Worker thread: drive the engine and post every event; never touch a widget.
        The KV cache goes to `kv` (when given) before `Finished` is posted, so no next turn
        can change the cache while it is written."""
        from chatcli.engine.threads import release_cpu_threads

        try:
            for event in engine.generate(messages, session, params, cancel):
                cache = session.cache
                if kv is not None and type(event).__name__ == "Finished":
                    save_kv(engine, session, kv)
                self.post_message(TurnEvent(turn, event, len(cache), cache.nbytes))
        except Exception as exc:  # noqa: BLE001 - shown inline, the app keeps running
            self.post_message(TurnFailed(turn, one_line(exc)))
        finally:
            release_cpu_threads()  # the next turn may run in another pool thread: see engine/threads.py

    # -- streaming -------------------------------------------------------------

    async def on_turn_event(self, message: TurnEvent) -> None:
        if message.turn != self.turn:
            return
        event = message.event
        kind = type(event).__name__
        live = self._live
        live["context"] = message.context_tokens
        live["kv"] = message.kv_cache_bytes
        if kind == "Token":
            if event.text:
                self._buffer.append(event.text)
                self._streamed.append(event.text)
            live["tokens"] = event.completion_tokens
            live["rate"] = event.decode_tok_s
            if event.decode_tok_s > 0 and event.completion_tokens % self._rate_every == 0:
                self._sample_rate(event.completion_tokens, event.decode_tok_s)
        elif kind == "Prefilled":
            live["prefilled"] = event
        elif kind == "Finished":
            await self._finish(event, message)

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
                self._rates.append((n - m) / (elapsed - before))
        self._last_sample = (n, elapsed)
        if len(self._rates) >= SPARK_SAMPLES:
            pairs = zip(self._rates[::2], self._rates[1::2])
            self._rates = [(a + b) / 2 for a, b in pairs]
            self._rate_every *= 2

    async def _on_tick(self) -> None:
        await self._flush()
        self._ticks += 1
        if self._tick is not None and self._ticks % PANEL_EVERY == 1:  # the turn may have finished meanwhile
            self._show_live()

    async def _flush(self) -> None:
        if self._buffer and self._reply is not None:
            text = "".join(self._buffer)
            self._buffer.clear()
            await self._reply.write(text)

    def _show_live(self) -> None:
        live = self._live
        pre = live.get("prefilled")
        values = {"tokens": str(live["tokens"])}
        if pre is not None:
            values["prefill"] = f"{pre.prefill_tokens / pre.prefill_s:.0f} tok/s" if pre.prefill_s > 0 else "–"
            values["prompt"] = f"{pre.cached_tokens} cached · {pre.prefill_tokens} new"
            if live["tokens"] and "ttft" not in live:
                live["ttft"] = pre.prefill_s
            if "ttft" in live:
                values["ttft"] = f"{live['ttft'] * 1000:.0f} ms"
        if live["tokens"] > 1:
            values["decode"] = f"{live['rate']:.1f} tok/s"
            if len(self._rates) != live.get("spark_len"):
                live["spark_len"] = len(self._rates)
                self.panels.set_speeds(self._rates)
        if "kv" in live:
            values["kv"] = human_bytes(live["kv"])
        self.panels.show(**values)
        if "context" in live and self.engine is not None:
            self.panels.set_context(live["context"], self.engine.context_limit)

    async def _finish(self, done, message: TurnEvent) -> None:
        if self._tick is not None:
            self._tick.stop()
            self._tick = None
        await self._flush()
        reply = self._reply
        if reply is not None:
            await reply.end_stream()
        stats = done.stats.to_dict()
        reply_msg = self.conversation.add_reply(done.reply, done.finish_reason, stats)
        self.save_reply(reply_msg, self._turn_params)
        self.last_stats = stats
        self.turns_done += 1
        if reply is not None:
            reply.message = reply_msg
            reply.set_note(reply_note(done.finish_reason, stats))
        self.panels.set_speeds(self._rates)
        self._show_final(stats)
        self.panels.add_turn(turn_line(self.turns_done, stats))
        self.keep_session()
        self._end_turn()

    def _show_final(self, stats: dict) -> None:
        self.panels.show(
            ttft=f"{stats['ttft_s'] * 1000:.0f} ms",
            prefill=f"{stats['prefill_tok_s']:.0f} tok/s",
            decode=f"{stats['decode_tok_s']:.1f} tok/s",
            tokens=str(stats["completion_tokens"]),
            prompt=f"{stats['cached_tokens']} cached · {stats['prefill_tokens']} new",
            kv=human_bytes(stats["kv_cache_bytes"]),
            drafts=drafts_text(stats, self.engine.lookup_for(self._turn_params) if self._turn_params else 0),
        )
        self.panels.set_context(stats["context_tokens"], stats["context_limit"] or self.engine.context_limit)

    async def on_turn_failed(self, message: TurnFailed) -> None:
        if message.turn != self.turn:
            return
        if self._tick is not None:
            self._tick.stop()
            self._tick = None
        if self._reply is not None:
            await self._reply.end_stream()
            self._reply.remove()
        # The user message that failed leaves the conversation, so the next turn starts clean.
        if self.conversation.messages and self.conversation.messages[-1].role == "user":
            failed = self.conversation.messages.pop()
            self.forget_last(1)
            for widget in self.pane.query(UserMessage):
                if widget.message is failed:
                    widget.add_class("-queued")
        self.pane.add_note(f"Error: {message.error}", error=True)
        self._end_turn()

    def _end_turn(self) -> None:
        self.busy = False
        self.cancel = None
        self._reply = None
        self._next_in_queue()

    # -- keys ------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.busy and self.cancel is not None:
            self.cancel.set()
        elif self.queue:
            for widget in self.queue:
                widget.remove()
            self.queue.clear()
            self.pane.add_note("Dropped the queued prompts.")

    def action_scroll_chat(self, direction: int) -> None:
        """Page through the chat; scrolling up lets go of the stream, back at the bottom it follows again."""
        if direction < 0:
            self.pane.scroll_page_up(animate=False)
        else:
            self.pane.scroll_page_down(animate=False)

    def action_toggle_panels(self) -> None:
        self.panels.toggle_class("-toggled")  # hides them on a wide terminal, shows them on a narrow one

    def stop_all(self) -> None:
        """Cancel the running turn (quitting): the worker ends within one decode step, and
        what was streamed so far is saved as a stopped reply (the app will not see `Finished`)."""
        self.queue.clear()
        if self.cancel is not None:
            self.cancel.set()
        if self.busy and self.conversation.messages and self.conversation.messages[-1].role == "user":
            partial = self.conversation.add_reply("".join(self._streamed), "cancelled")
            self.save_reply(partial, self._turn_params)
            self.turn += 1  # a late event of this turn is ignored
            self.busy = False

    def on_unmount(self) -> None:
        self.stop_all()
