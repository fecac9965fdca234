"""What a front end starts with: the model to load, how, and the chat settings.

Built by `chatcli.cli` from the config file and the command line (flags win), then
handed to the TUI, one-shot mode or the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chatcli.config import Config
from chatcli.engine import LoadOptions, SamplingParams

if TYPE_CHECKING:
    from chatcli.chat.mcp import Server


@dataclass
class StartOptions:
    model: str | None = None  # --model; None: the config default, then the embedded model
    load: LoadOptions = field(default_factory=LoadOptions)
    params: SamplingParams = field(default_factory=SamplingParams)
    system: str | None = None
    system_given: bool = False  # --system was on the command line (it then overrides a resumed conversation's)
    theme: str | None = None
    config: Config = field(default_factory=Config)
    continue_last: bool = False  # -c: reopen the most recent saved conversation
    conversation: str | None = None  # --conversation ID (or a unique prefix)
    cache_budget_bytes: int | None = None  # --cache-budget; None: chatcli.engine.kv.pool.default_budget_bytes()
    api: str | None = None  # --api URL (or the config's `api`): a remote engine instead of a model here
    api_key: str | None = None
    save: bool = True  # one-shot: save the exchange (--save / --no-save, else the config's `save`)
    mcp: list[Server] = field(default_factory=list)  # --mcp NAME: the config's [mcp.NAME] servers, their tools offered
    allow_tools: bool = False  # --allow-tools: run the calls without asking (the one-shot runs none without it)

    def load_engine(self, status=None, process: bool = False):
        """The engine to answer with: a remote one over `api`, else the model loaded here (slow the
        first time: call it off the UI thread), or with `process` in a generation process of its own
        (`ProcessEngine`: the TUI's, so that drawing never slows the decode loop). Raises LoadError (or
        RemoteError) in one line."""
        if self.api:
            from chatcli.engine import RemoteEngine

            if status:
                status(f"Connecting to {self.api}")
            # --model names the server's model; the config's `model` only goes with the config's `api`
            model = self.model or (self.config.model if self.api == self.config.api else None)
            return RemoteEngine(self.api, self.api_key, model).connect()
        if process:
            from chatcli.engine import ProcessEngine

            return ProcessEngine.start(self.model, self.load, config_default=self.config.model, status=status)
        from chatcli.engine import load_engine

        return load_engine(self.model, self.load, config_default=self.config.model, status=status)
