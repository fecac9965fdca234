"""MCP servers' tools, through the official `mcp` SDK: start the chosen servers (stdio), list their tools
as OpenAI function tools, and run a call with a timeout, its result cut where it is huge.

The SDK is asyncio (anyio); `Hub` runs it on an event loop of its own, in a daemon thread, so that the
TUI (Textual's loop, the engine in a thread worker) and the one-shot (no loop at all) call it alike:
`call()` blocks, `call_future()` gives a concurrent Future (`asyncio.wrap_future` awaits it on another
loop). Each server's stderr goes to a temporary file, never to the terminal (the TUI draws there); a
server that does not start is one line naming it, with the last line it wrote. The config reads
`Server` at every start: asyncio (20 ms) is imported by a Hub only.

Nothing here raises at a user for a tool: a call that fails, times out or names no tool is a `Result`
with a status, its text what the model is told. The SDK is imported on first start only.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chatcli.errors import clip, one_line

if TYPE_CHECKING:
    import concurrent.futures

TIMEOUT_S = 60.0  # a call's default limit (`timeout` in [mcp.NAME])
STARTUP_TIMEOUT_S = 30.0  # a server's default limit to start and list its tools (`startup_timeout`)
MAX_RESULT_CHARS = 8000  # a longer result is cut to this many characters (and says so)
NAME = re.compile(r"[^A-Za-z0-9_-]")  # what an OpenAI function name may not hold

OK, ERROR, TIMEOUT, DENIED, STOPPED = "ok", "error", "timeout", "denied", "stopped"


@dataclass(frozen=True)
class Server:
    """`[mcp.NAME]` of the config: a stdio server, with the keys other MCP clients use (`mcpServers`)."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    cwd: str | None = None
    timeout: float = TIMEOUT_S
    startup_timeout: float = STARTUP_TIMEOUT_S


@dataclass(frozen=True)
class Tool:
    name: str  # the name the model calls it by (an OpenAI function name, unique among the servers')
    server: str
    real_name: str  # the server's own name for it
    description: str
    schema: dict

    def openai(self) -> dict:
        function = {"name": self.name, "parameters": self.schema or {"type": "object", "properties": {}}}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass
class Result:
    """What a call gave: `text` is what the model sees (an error or a cut result says so in it)."""

    text: str
    status: str = OK  # OK, ERROR, TIMEOUT, DENIED, STOPPED
    cut: int | None = None  # the full length, where the result was cut

    def short(self, width: int = 100) -> str:
        """One line of it, for a status line."""
        return clip(self.text, width)


def cut(text: str, limit: int = MAX_RESULT_CHARS) -> Result:
    if len(text) <= limit:
        return Result(text)
    note = f"\n[cut: the result was {len(text):,} characters; the first {limit:,} are shown]"
    return Result(text[:limit] + note, OK, len(text))


def result_text(result) -> str:
    """A CallToolResult's content as text: text parts as they are, others named."""
    parts = []
    for item in result.content or ():
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind == "resource":
            resource = item.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {item.uri}]")
        else:
            parts.append(f"[{kind}: {getattr(item, 'mime_type', '') or 'binary'}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _offered_name(server: str, name: str, taken: set[str]) -> str:
    """The tool's name as the model calls it: OpenAI's characters, prefixed by its server where two clash."""
    base = NAME.sub("_", name)[:64] or "tool"
    return base if base not in taken else NAME.sub("_", f"{server}_{name}")[:64]


def _unheard(task) -> None:
    """A call given up on: its end (a result, an error, a cancel) is read so that nothing warns of it."""
    if not task.cancelled():
        task.exception()


class Hub:
    """The chosen servers, started together on the hub's own loop; `start()` then `tools`, `call()`."""

    def __init__(self, servers: list[Server]) -> None:
        import asyncio

        self.servers = {s.name: s for s in servers}
        self.tools: list[Tool] = []
        self.failed: dict[str, str] = {}  # server -> why it did not start (one line)
        self.ready = threading.Event()  # set once every server started or failed
        self._sessions: dict[str, object] = {}
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()  # set by close(): the sessions end
        self._thread = threading.Thread(target=self._run, name="chatcli-mcp", daemon=True)
        self._started = False

    # -- the loop's thread -----------------------------------------------------------

    def start(self) -> Hub:
        """Start every server (returns at once; `wait()` for them)."""
        if not self._started:
            self._started = True
            self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> dict[str, str]:
        """Block until every server started or failed; the failures, one line each."""
        self.start()
        self.ready.wait(timeout)
        return self.failed

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self.ready.set()

    async def _main(self) -> None:
        import asyncio

        tasks = [asyncio.create_task(self._serve(server)) for server in self.servers.values()]
        await asyncio.gather(*tasks, return_exceptions=True)
        self.ready.set()

    async def _serve(self, server: Server) -> None:
        """One server's life: start it, list its tools, then hold its session open until `close()`."""
        import asyncio
        import tempfile

        log = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        opened = asyncio.Event()
        try:
            await self._open(server, log, opened)
        except BaseException as exc:  # noqa: BLE001 - any failure is one line naming the server
            if not opened.is_set():
                self.failed[server.name] = self._why(server, exc, log)
                self._ready_when_all()
        finally:
            log.close()

    async def _open(self, server: Server, log, opened) -> None:
        import asyncio

        from mcp import ClientSession, StdioServerParameters, stdio_client

        params = StdioServerParameters(
            command=server.command, args=list(server.args), env=dict(server.env) or None, cwd=server.cwd
        )
        async with stdio_client(params, errlog=log) as (read, write):
            async with ClientSession(read, write) as session:
                listed = await asyncio.wait_for(self._listing(session), server.startup_timeout)
                taken = {t.name for t in self.tools}
                for tool in listed:
                    name = _offered_name(server.name, tool.name, taken)
                    taken.add(name)
                    self.tools.append(Tool(name, server.name, tool.name, tool.description or "", tool.input_schema))
                self._sessions[server.name] = session
                opened.set()
                self._ready_when_all()
                await self._stop.wait()

    @staticmethod
    async def _listing(session) -> list:
        await session.initialize()
        tools, cursor = [], None
        while True:
            from mcp.types import PaginatedRequestParams

            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools

    def _ready_when_all(self) -> None:
        if len(self._sessions) + len(self.failed) >= len(self.servers):
            self.ready.set()

    @staticmethod
    def _why(server: Server, exc: BaseException, log) -> str:
        if isinstance(exc, TimeoutError):
            reason = f"it did not answer within {server.startup_timeout:g} s (startup_timeout)"
        elif isinstance(exc, FileNotFoundError):
            reason = f"no such command: {server.command}"
        else:
            while getattr(exc, "exceptions", None):  # a task group's error: the first inside it
                exc = exc.exceptions[0]
            reason = one_line(exc)
        try:
            log.seek(0)
            said = [line.strip() for line in log.read().splitlines() if line.strip()]
        except (OSError, ValueError):
            said = []
        if said and said[-1] not in reason:
            reason += f" (it said: {clip(said[-1], 200)})"  # its own words, shown as a terminal may show them
        return f"the MCP server {server.name!r} did not start: {reason}"

    # -- calls -------------------------------------------------------------------------

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def openai_tools(self) -> list[dict]:
        return [t.openai() for t in self.tools]

    def call_future(self, name: str, arguments: dict) -> concurrent.futures.Future:
        """The call running on the hub's loop; its Future gives a `Result` (cancel() stops it)."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(self._call(name, arguments), self._loop)

    def call(self, name: str, arguments: dict) -> Result:
        return self.call_future(name, arguments).result()

    async def _call(self, name: str, arguments: dict) -> Result:
        import asyncio

        tool = self.tool(name)
        if tool is None:
            known = ", ".join(t.name for t in self.tools) or "none"
            return Result(f"Error: there is no tool named {name!r} (the tools: {known}).", ERROR)
        server = self.servers[tool.server]
        session = self._sessions.get(tool.server)
        if session is None:
            return Result(f"Error: the MCP server {tool.server!r} is not running.", ERROR)
        # The SDK's own read timeout ends the call; the wait beside it is the backstop, and it does not
        # cancel: a cancelled request first tells the server (a write that can itself wait), and
        # asyncio.wait_for would wait for that. A call left behind ends with its session.
        task = asyncio.ensure_future(session.call_tool(tool.real_name, arguments, read_timeout_seconds=server.timeout))
        try:
            finished, _ = await asyncio.wait({task}, timeout=server.timeout + 1)
        except asyncio.CancelledError:  # the user stopped it (Esc): the call is not waited for
            task.add_done_callback(_unheard)
            task.cancel()
            raise
        if not finished:
            task.add_done_callback(_unheard)
            return self._timed_out(server, name)
        try:
            result = task.result()
        except Exception as exc:  # noqa: BLE001 - the model is told, the chat goes on
            if "timed out" in str(exc):
                return self._timed_out(server, name)
            return Result(f"Error: the tool {name} failed: {one_line(exc)}", ERROR)
        text = result_text(result)
        if result.is_error:
            text = text if text.lower().startswith("error") else f"Error: {text or 'the tool failed'}"
            return Result(text[:MAX_RESULT_CHARS], ERROR)
        return cut(text)

    @staticmethod
    def _timed_out(server: Server, name: str) -> Result:
        return Result(f"Error: the tool {name} did not answer within {server.timeout:g} s, so it was stopped.", TIMEOUT)

    def close(self, timeout: float = 10) -> None:
        """Stop the servers (their sessions close, their processes end) and the loop's thread."""
        if not self._started or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=timeout)
