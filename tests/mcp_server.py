"""A tiny MCP server for the tests (stdio, the `mcp` SDK's MCPServer, FastMCP's successor): run as
`python tests/mcp_server.py`. Its tools: `add` (sums two numbers), `shout` (upper-cases a text),
`fail` (raises), `sleep` (waits SECONDS), `huge` (returns N characters)."""

from __future__ import annotations

import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("tiny")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two whole numbers."""
    return str(a + b)


@server.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return text.upper()


@server.tool()
def fail(reason: str = "broken") -> str:
    """Always fails."""
    raise RuntimeError(f"the tool broke: {reason}")


@server.tool()
def sleep(seconds: float) -> str:
    """Wait, then say so."""
    time.sleep(seconds)
    return f"slept {seconds} s"


@server.tool()
def huge(n: int) -> str:
    """A result of n characters."""
    return "x" * n


if __name__ == "__main__":
    server.run()
