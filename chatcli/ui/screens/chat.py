"""The chat screen: a conversation's turns — sending, streaming, stopping — on top of
`ConversationScreen` (`conversations.py`: layout, loading, switching conversations).

The screens draw; the rest is elsewhere: `Chats` (`chat/manager.py`) holds the store, the
session pool and the list of conversations, `LiveTurn` (`ui/live.py`) the numbers of the
streaming reply, and `slash.HANDLERS` what each command does: a handler sees this screen only
as a `SlashTarget` (`slash_target.py`), which the two screens implement between them.

Turns run in a Textual thread worker that iterates `engine.generate(...)` (the TUI's engine runs
in a generation process of its own: `chatcli.engine.ProcessEngine`) and puts each event, as a
`TurnEvent`, in the screen's `Inbox` (`ui/inbox.py`), which the screen empties at each draw tick
(a turn's start, its first token — drawn at once — and its end wake it at once); the handlers only
buffer text and numbers. While a reply streams, the draw tick (10 Hz; a draw at each, or fewer where
drawing is dear: `DrawPace`) writes the buffered text to the reply's Markdown stream
— Textual's `MarkdownStream`: the finished blocks stay as they were laid out, only the last one is
parsed and laid out again — and a panel tick (`PANEL_S`) refreshes the panels and the sparkline, which
touches nothing of the chat pane. So the UI's cost a second stays bounded whatever the token rate;
and no full garbage collection walks the UI's objects while a reply streams (`QuietHeap`).
"""

from __future__ import annotations

import threading

from textual import work
from textual.binding import Binding

from chatcli.chat.attach import with_attachments
from chatcli.chat.commands import is_command
from chatcli.chat.saved import save_kv
from chatcli.engine import Finished, FinishReason, Prefilled, ProcessLost, Token, TurnStats
from chatcli.errors import one_line
from chatcli.ui.format import drafts_text, reply_note
from chatcli.ui.inbox import Inbox
from chatcli.ui.live import DrawPace, LiveTurn, QuietHeap, final_values, prompt_opens_thinking, restored_text
from chatcli.ui.messages import CacheNotSaved, EventsWaiting, TurnEvent, TurnFailed
from chatcli.ui.screens import slash
from chatcli.ui.screens.conversations import ConversationScreen
from chatcli.ui.screens.editing import Editing
from chatcli.ui.screens.inspector import TokenInspector
from chatcli.ui.screens.loading import EngineLoading, let_go
from chatcli.ui.screens.tool_turns import ToolTurns
from chatcli.ui.widgets.chat_pane import ReplyBox, UserMessage
from chatcli.ui.widgets.prompt import PromptInput

TICK_S = 1 / 10  # draw ticks while a reply streams (a draw at each, or fewer: ui/live.py DrawPace)
# The live panels refresh every PANEL_S, on a timer of their own: a number that changes 10 times a
# second is unreadable, and their repaint is the UI's work, which a 2-core machine's decode shares.
PANEL_S = 0.3


class ChatScreen(Editing, ToolTurns, TokenInspector, EngineLoading, ConversationScreen):
    BINDINGS = [
        Binding("escape", "stop", "Stop reply"),
        Binding("f2", "toggle_panels", "Panels"),
        Binding("f3", "toggle_sidebar", "Conversations"),
        Binding("f4", "toggle_tokens", "Tokens"),
        Binding("f5", "copy_reply", "Copy"),
        Binding("f9", "edit_last", "Edit", show=False),
        Binding("f8", "toggle_thinking", "Thinking", show=False),
        Binding("ctrl+n", "new_conversation", "New", priority=True),
        Binding("pageup", "scroll_chat(-1)", "Scroll", show=False, priority=True),
        Binding("pagedown", "scroll_chat(1)", "Scroll", show=False, priority=True),
        Binding("end", "chat_end", "Bottom", show=False, priority=True),
        Binding("ctrl+end", "chat_end(True)", "Bottom", show=False, priority=True),
        Binding("ctrl+q", "app.quit", "Quit"),
    ]

    def __init__(self, params, *args, **kwargs) -> None:
        """`ConversationScreen`'s arguments."""
        super().__init__(params, *args, **kwargs)
        self.turn = 0  # id of the newest turn; events of older ones are ignored
        self.cancel: threading.Event | None = None
        self.turns_done = 0
        self.live = LiveTurn()
        self._spark_len = 0  # sparkline points on the panel
        self._reply: ReplyBox | None = None
        self._buffer: list[str] = []  # text not yet written to the reply widget
        self._drawn = False  # some of the streaming reply's text is on screen
        self.top_logprobs = 5  # alternatives the token inspector records (/top-logprobs N)
        self.editing: int | None = None  # /edit: the index of the user message the prompt replaces
        self._prompt_ids: tuple[list[int], int] = ([], 0)  # this turn's prompt ids, and how many were cached
        self._tokens_of: str | None = None  # the conversation that turn was in
        self._reply_tokens: list[Token] = []  # this turn's reply tokens, for the inspector
        self._streamed: list[str] = []  # all the text of the streaming reply
        self._tick = None  # the draw tick, while a reply streams
        self._panel_tick = None  # the panels' tick, as long
        self._heap = QuietHeap()  # no full garbage collection as long
        self.inbox = Inbox()  # the turn's events, from its worker thread
        self._cache_warned = False
        self._turn_params = params

    # -- sending ---------------------------------------------------------------

    async def run_command(self, text: str) -> None:
        """A slash command: `slash.py` carries it out through `SlashTarget`; the chat follows again."""
        await slash.run_command(self, text)
        self.pane.follow()

    async def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text
        if is_command(text):
            await self.run_command(text)
            return
        if self.load_error is not None and self.remote:  # the server may be up by now: connect again
            self.reconnect()
        elif self.load_error is not None:
            self.note("No model is loaded, so nothing can answer (see the error above).", error=True)
            self.prompt.restore(text)  # kept, not sent
            return
        if self.editing is not None:
            if not await self._branch_for_edit():
                self.prompt.restore(text)  # kept, not sent
                return
        text, self.attachments = with_attachments(text, self.attachments), []  # /file's files, before the text
        waiting = self.busy or self.engine is None or self.tools_starting
        widget = self.pane.add_user(text, queued=waiting)
        self.pane.follow()
        self.queue.append(widget)
        if not waiting:
            self._next_in_queue()

    def _next_in_queue(self) -> None:
        if self.busy or self.engine is None or self.tools_starting or not self.queue:
            return
        widget = self.queue.pop(0)
        widget.remove_class("-queued")
        widget.message = self.conversation.add_user(widget.text)
        widget.number(len(self.conversation.messages))
        self.chats.save_user(self.conversation, widget.message)
        if self.sidebar.is_open:
            self.refresh_sidebar()  # its title and count, before the reply comes
        self.begin_turn()

    def drop_queue(self) -> None:
        for widget in self.queue:
            widget.remove()
        self.queue.clear()

    def begin_turn(self) -> None:
        """Generate a reply to the conversation as it stands (its last message is the user's)."""
        self.turn += 1
        self.busy = True
        self.cancel = threading.Event()
        last = self.conversation.messages[-1] if self.conversation.messages else None
        self._reply = self.pane.add_reply(after=self.pane.widget_of(last))
        self._reply.start_stream(thinking=prompt_opens_thinking(self.engine))
        self._reply.set_note("…")
        self._buffer.clear()
        self._drawn = False  # no text of this reply drawn yet
        self._streamed = []
        self.live = LiveTurn(self.chats.take_restored(self.conversation))
        self._spark_len = 0
        self.panels.reset()
        self.pane.follow()
        self.pane.settle()
        self._pace = DrawPace(TICK_S)
        self._heap.streaming()
        self._tick = self.set_interval(TICK_S, self._on_tick)
        self._panel_tick = self.set_interval(PANEL_S, self._show_live)
        self.session = self.chats.session_for(self.conversation)  # a new one if the pool evicted it
        self._turn_params = self.params
        self._prompt_ids, self._reply_tokens, self._tokens_of = ([], 0), [], self.conversation.id
        params = self.params.with_(logprobs=self.top_logprobs) if self.tokens.display else self.params
        params = self.tool_params(params)  # --mcp: the tools offered (self._turn_params stays without them)
        kv = self.chats.kv_path(self.conversation)
        args = (self.engine, self.turn, self.conversation.for_template(), self.session, params, self.cancel, kv)
        self.call_later(self._generate_when_shown, self._reply, args)

    async def _generate_when_shown(self, box: ReplyBox, args: tuple) -> None:
        """Start the turn's generation after the frame that shows the question and the reply's box: their mount and
        layout would otherwise take a core from the prefill."""
        await box.mounted()
        self.call_after_refresh(self._generate, *args)

    @work(thread=True, exit_on_error=False, group="turn")
    def _generate(self, engine, turn: int, messages: list, session, params, cancel: threading.Event, kv=None) -> None:
        """Worker thread: drive the engine and hand every event to the screen (`Inbox`); never touch a
        widget. The KV cache goes to `kv` (when given) before `Finished` is handed on, so no next turn
        can change the cache while it is written."""
        from chatcli.engine import release_cpu_threads

        first_token = True  # the reply's first token is drawn as it comes, not at the next tick
        try:
            for event in engine.generate(messages, session, params, cancel):
                if kv is not None and isinstance(event, Finished):
                    reason = save_kv(engine, session, kv)
                    if reason:
                        self.post_message(CacheNotSaved(reason))
                here = engine.keeps_cache  # else the server holds the cache: its size is known at the end
                cache = session.cache
                sizes = (len(cache), cache.nbytes) if here else (None, None)
                # a turn's start, its first token and its end wake the screen at once, and after Esc every token (the
                # few the model made before the cancel reached it: drawn as they come, not up to a tick after Esc);
                # other tokens wait for the tick
                wake = not isinstance(event, Token) or first_token or cancel.is_set()
                first_token = first_token and not isinstance(event, Token)
                if self.inbox.put(TurnEvent(turn, event, *sizes), wake=wake):
                    self.post_message(EventsWaiting())
        except Exception as exc:  # noqa: BLE001 - shown inline, the app keeps running
            again = "; /model NAME loads a model again" if isinstance(exc, ProcessLost) else ""
            self.post_message(TurnFailed(turn, one_line(exc) + again))
        finally:
            release_cpu_threads()  # the next turn may run in another pool thread: see engine/runners/threads.py

    def on_cache_not_saved(self, message: CacheNotSaved) -> None:
        if not self._cache_warned:  # once a run: a full disk would say it every turn
            self._cache_warned = True
            self.app.notify(
                f"The KV cache was not saved ({message.reason}); a later start prefills again.",
                title="Cache not saved",
                severity="warning",
                timeout=8,
            )

    # -- streaming -------------------------------------------------------------

    async def on_events_waiting(self, _message: EventsWaiting | None = None) -> None:
        for event in self.inbox.take():
            await self.on_turn_event(event)
        stopping = self.cancel is not None and self.cancel.is_set()  # Esc: what still comes, now, not at the tick
        if self._tick is not None and self._buffer and (not self._drawn or stopping):  # the reply's first text too
            await self._flush()

    async def on_turn_event(self, message: TurnEvent) -> None:
        if message.turn != self.turn:
            return
        self.live.cache(message.context_tokens, message.kv_cache_bytes)
        match message.event:
            case Token(text=text) as token:
                text = self.visible(text)  # a reply's tool calls show as tool boxes, not text
                if text:
                    self._buffer.append(text)
                    self._streamed.append(text)
                if token.token_id >= 0 or token.logprob is not None:  # a server's: no id, maybe its logprob
                    self._reply_tokens.append(token)
                self.live.token(token)
            case Prefilled() as prefilled:
                self.live.prefill(prefilled)
                self._prompt_ids = (prefilled.ids or [], prefilled.cached_tokens or 0)
            case Finished() as done:
                await self._finish(done)

    def _on_tick(self) -> None:
        # As the screen's message, not in the timer's task: the turn's end, if it came, stops this timer,
        # and Textual's Timer.stop cancels the task that runs its callback (the end's work with it).
        self.call_later(self._draw)

    async def _draw(self, now: bool = False) -> None:
        """Take in the tokens that came since the last tick, and draw them: `now`, or where the pace says
        (drawing that costs more than its share is not done at every tick). Not after the turn's end, which
        drew all of it."""
        await self.on_events_waiting()
        if self._tick is not None and (now or self._pace.due()):
            await self._flush()

    async def _flush(self) -> None:
        if self._buffer and self._reply is not None:
            self._drawn = True
            text = "".join(self._buffer)
            self._buffer.clear()
            await self._reply.write(text)

    def _show_live(self) -> None:
        if self._panel_tick is None:  # the turn finished meanwhile: its final figures are shown
            return
        live = self.live
        self.panels.show(**live.values())
        if live.tokens > 1 and len(live.rates) != self._spark_len:  # a repaint only for a new point
            self._spark_len = len(live.rates)
            self.panels.set_speeds(live.rates)
        if live.context is not None and self.engine is not None:
            self.panels.set_context(live.context, self.engine.context_limit)
            self.show_pool()  # the pool grows with this conversation's cache

    async def _finish(self, done: Finished) -> None:
        self._stop_tick()
        self._buffer.append(self.visible("", final=True))
        await self._flush()
        reply = self._reply
        if reply is not None:
            await reply.end_stream()
        stats = done.stats
        text, calls = self.reply_calls(done)
        reply_msg = self.conversation.add_reply(text, done.finish_reason, stats.to_dict(), calls)
        self.chats.save_reply(self.conversation, reply_msg, self._turn_params)
        self.last_stats = stats
        self.turns_done += 1
        if stats.note:  # e.g. the saved KV cache was damaged: this turn prefilled the whole history
            self.app.notify(stats.note[:1].upper() + stats.note[1:] + ".", severity="warning", timeout=8)
        if reply is not None:
            reply.message = reply_msg
            parts = (reply_note(done.finish_reason, stats, done.error), restored_text(self.live.restored))
            reply.set_note(" · ".join(part for part in parts if part), len(self.conversation.messages))
        self.panels.set_speeds(self.live.rates)
        self._show_final(stats)
        self.show_turns()
        self.chats.keep(self.conversation, self.session)
        self.refresh_pool()
        if self.tokens.display:
            self.show_tokens()
        if calls:  # the turn goes on: the calls, then the model again
            self.start_calls(calls)
        else:
            self._end_turn()

    def action_toggle_thinking(self) -> None:
        """Show or fold the reasoning of the newest reply that has some."""
        boxes = [b for b in self.pane.query(ReplyBox) if b.has_reasoning]
        if not boxes:
            self.note("No reply with reasoning (<think>…</think>) in this conversation.")
            return
        if boxes[-1] in self.pane.shelved:  # its height changes: not while it stands shelved
            self.pane.unshelve()
        boxes[-1].fold.collapsed = not boxes[-1].fold.collapsed

    async def action_copy_reply(self) -> None:
        await self.run_command("/copy")

    def _show_final(self, stats: TurnStats) -> None:
        drafts = drafts_text(stats, self.engine.lookup_for(self._turn_params) if self.engine.keeps_cache else None)
        self.panels.show(**final_values(stats, drafts, self.live.restored is not None))
        self.panels.set_context(stats.context_tokens, stats.context_limit or self.engine.context_limit)

    async def on_turn_failed(self, message: TurnFailed) -> None:
        if message.turn != self.turn:
            return
        await self.on_events_waiting()  # the tokens before the fault, as they came
        self._stop_tick()
        if self._reply is not None:
            await self._reply.end_stream()
            self._reply.remove()
        # The user message that failed leaves the conversation, so the next turn starts clean; its
        # text goes back into an empty prompt (Enter sends it again), else it stays on screen, greyed.
        if self.conversation.messages and self.conversation.messages[-1].role == "user":
            failed = self.conversation.messages.pop()
            self.chats.forget_last(self.conversation, 1)
            restore = not self.prompt.text and not self.queue
            if restore:
                self.prompt.restore(failed.content)
            for widget in self.pane.query(UserMessage):
                if widget.message is failed and restore:
                    widget.remove()
                elif widget.message is failed:
                    widget.add_class("-queued")
        self.note(f"Error: {message.error}", error=True)
        self._end_turn()

    def _stop_tick(self) -> None:
        for tick in (self._tick, self._panel_tick):
            if tick is not None:
                tick.stop()
        self._tick = self._panel_tick = None
        self._heap.settled()

    def _end_turn(self) -> None:
        self.pane.settle()
        self.busy = False
        self.tool_round = 0
        self.cancel = None
        self._reply = None
        self._next_in_queue()

    # -- keys ------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.editing is not None and not self.busy:
            self.editing = None
            self.prompt.load_text("")
            self.note("Edit cancelled: the conversation is as it was.")
            return
        if self.busy and self.cancel is not None:
            self.cancel.set()
            self.call_later(self._draw, True)  # the tokens that came before Esc: on screen now, not at the next tick
        elif self.queue:
            self.drop_queue()
            self.note("Dropped the queued prompts.")

    def stop_all(self) -> None:
        """Cancel the running turn (quitting): the worker ends within one decode step, and
        what was streamed so far is saved as a stopped reply (the app will not see `Finished`)."""
        self.queue.clear()
        if self.cancel is not None:
            self.cancel.set()
        if self.busy and self.conversation.messages and self.conversation.messages[-1].role == "user":
            partial = self.conversation.add_reply("".join(self._streamed), FinishReason.CANCELLED)
            self.chats.save_reply(self.conversation, partial, self._turn_params)
            self.turn += 1  # a late event of this turn is ignored
            self.busy = False

    def on_unmount(self) -> None:
        self.stop_all()
        self.app.close_tools()
        let_go(self.engine, wait=True)  # the generation process ends with the app
