"""MCP tools on the chat screen (`--mcp NAME`): the tools offered to the model each turn, the calls of its
reply shown (tool, arguments) and run once the user allows them (`AllowTool`: once, always for this
tool, no; Esc stops the turn), each result folded under its call and fed back, then the model again,
until it answers with text (`chat.toolturn.MAX_ROUNDS` replies with calls at most).

A mixin of `ChatScreen`, on its turn state (`busy`, `cancel`, `begin_turn`, `_end_turn`): the app starts
the servers in a thread of its own and posts `ToolsReady`; prompts sent meanwhile wait, as they do
while the model loads. The calls run on the hub's loop (`chat.mcp.Hub`); this screen only awaits them.
"""

from __future__ import annotations

import asyncio

from chatcli.chat.mcp import ERROR, TIMEOUT, Result
from chatcli.chat.toolturn import (
    MAX_ROUNDS,
    Toolbox,
    arguments_of,
    bad_arguments,
    denied,
    split_reply,
    stopped,
    syntax_of,
)
from chatcli.engine import CallScanner, FinishReason
from chatcli.errors import one_line, shown
from chatcli.ui.messages import ToolsReady
from chatcli.ui.screens.allow_tool import ALWAYS, NO, STOP, AllowTool


class ToolTurns:
    toolbox: Toolbox | None = None  # the --mcp servers' tools, once started
    tools_starting = False  # the app is starting them: prompts wait
    tool_round = 0  # replies with calls so far in this turn
    _scanner: CallScanner | None = None  # the streaming reply's calls, held back from its text

    def on_tools_ready(self, message: ToolsReady) -> None:
        self.tools_starting = False
        for why in message.failed:
            self.app.notify(shown(why), title="MCP server", severity="error", timeout=10, markup=False)
        if message.hub.tools:
            self.toolbox = Toolbox(message.hub, self.app.start.allow_tools)
            names = ", ".join(sorted({t.server for t in message.hub.tools}))
            asks = "they run without asking (--allow-tools)" if self.toolbox.allow_all else "each call asks you first"
            self.note(f"Tools: {len(message.hub.tools)} from {names}; {asks}. /tools lists them.")
        self._next_in_queue()

    # -- a round's reply ---------------------------------------------------------------

    def tool_params(self, params):
        """The turn's params, offering the tools (not past MAX_ROUNDS: the model then answers in text)."""
        self._scanner = CallScanner(syntax_of(self.engine)) if self.toolbox is not None else None
        if self.toolbox is None or self.tool_round >= MAX_ROUNDS:
            return params
        return self.toolbox.params(params)

    def visible(self, text: str, final: bool = False) -> str:
        """The streamed text to show: the reply's calls held back (they show as tool boxes)."""
        if self._scanner is None:
            return text
        pieces = self._scanner.push(text) + (self._scanner.finish() if final else [])
        return "".join(p for p in pieces if isinstance(p, str))

    def reply_calls(self, done) -> tuple[str, list[dict]]:
        """A finished reply's text and its calls: none where no tools were offered, or where the user
        stopped the reply (Esc: a call it had written is not run)."""
        offered = self._scanner is not None and self.toolbox is not None and self.tool_round < MAX_ROUNDS
        if not offered or done.finish_reason == FinishReason.CANCELLED:
            return done.reply, []
        return split_reply(done.reply, syntax_of(self.engine))

    # -- the calls ------------------------------------------------------------------------

    def start_calls(self, calls: list[dict]) -> None:
        """The reply's calls, one after another (the turn stays busy), then the model again."""
        self.tool_round += 1
        self.run_worker(self._run_calls(self.turn, calls), group="tools", exit_on_error=False)

    async def _run_calls(self, turn: int, calls: list[dict]) -> None:
        conv, cancel = self.conversation, self.cancel
        for call in calls:
            box = self.pane.add_tool_call(call)
            self.pane.follow()
            result = await self._one_call(call, box, cancel)
            if turn != self.turn:  # quitting: stop_all ended the turn
                return
            message = conv.add_result(call, result.text, result.status)
            self.chats.save_result(conv, message)
            box.show(message, result)
            if result.status in (ERROR, TIMEOUT):
                self.app.notify(
                    shown(f"{call['name']}: {result.short(160)}"), title="Tool failed", severity="error", markup=False
                )
            elif result.cut:
                self.app.notify(
                    shown(f"{call['name']}: the result was cut to what the model can take ({result.cut:,} chars)"),
                    markup=False,
                )
        if cancel is not None and cancel.is_set():
            self.note("Stopped: the results are kept, the model was not asked again.")
            self._end_turn()
            return
        self.begin_turn()  # the model again, with the results

    async def _one_call(self, call: dict, box, cancel) -> Result:
        if cancel is not None and cancel.is_set():
            return stopped()
        hub = self.toolbox.hub
        tool = hub.tool(call["name"])
        arguments = arguments_of(call)
        if arguments is None:
            return bad_arguments(call)
        if tool is None:  # no such tool: the hub's error result says which there are
            return await asyncio.wrap_future(hub.call_future(call["name"], arguments))
        if not self.toolbox.allowed(tool.name):
            box.waiting("waiting for you: Y run once · A always for this tool · N no · Esc stop")
            answer = await self.app.push_screen_wait(AllowTool(tool.name, tool.server, call["arguments"]))
            if answer == STOP:
                if cancel is not None:
                    cancel.set()
                return stopped()
            if answer == NO:
                return denied()
            if answer == ALWAYS:
                self.toolbox.always.add(tool.name)
        box.waiting("running… (Esc stops it)")
        future = hub.call_future(call["name"], arguments)
        while not future.done():
            if cancel is not None and cancel.is_set():
                future.cancel()
                return stopped()
            await asyncio.sleep(0.05)
        try:
            return future.result()
        except Exception as exc:  # noqa: BLE001 - the model is told, the chat goes on
            return Result(f"Error: the tool {call['name']} failed: {one_line(exc)}", ERROR)
