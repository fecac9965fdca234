"""What the tests of the other APIs' clients share (Anthropic's, Ollama's, OpenAI's Responses): the tiny
model under a tools-aware template with room for tools (2048 positions), a reply the model is made to
write (`scripted`), the tools of test_server_tools in each API's shape, and the chat messages a request
should template to, for the engine's own reply (`alone`)."""

from __future__ import annotations

from chatcli.engine import ToolCalls
from chatcli.server.tools import parse_tools
from tests.servers import alone
from tests.test_server_tools import ASK, QWEN_TOOLS, SCHEMAS, TOOLS, scripted, with_template

__all__ = ["ASK", "SCHEMAS", "THINKING", "TOOLS", "engine_reply", "scripted", "tool_calls_of", "tools_engine"]

THINKING = "<think>Let me see: the capital.</think>\n\nParis is the capital."  # what a reasoning model writes


def tools_engine(tmp_path_factory):
    """The tiny model under a Qwen-style tools template (the lean runner, one slot), with room for tools:
    each test module's `qwen` fixture."""
    from chatcli.engine.load.hf import LoadOptions, load
    from tests.tiny import build_tiny_model_dir

    folder = build_tiny_model_dir(tmp_path_factory.mktemp("tiny-peers"), max_positions=2048)
    return with_template(load(str(folder), LoadOptions(device="cpu")), QWEN_TOOLS)


def tool_calls_of(tools: list[dict], choice: str = "auto", parallel: bool = True) -> ToolCalls:
    """OpenAI-shaped `tools` as the engine's ToolCalls, as the server reads them."""
    parsed = parse_tools({"tools": tools})
    return ToolCalls(parsed.tools, choice, parallel)


def engine_reply(engine, messages: list[dict], tools: list[dict] | None = None, **params) -> str:
    """The engine's reply to chat `messages` alone (greedy unless told), with `tools` offered."""
    params = {"temperature": 0, **params}
    if tools:
        params["tools"] = tool_calls_of(tools)
    return alone(engine, messages, **params)
