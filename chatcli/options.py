"""What a front end starts with: the model to load, how, and the chat settings.

Built by `chatcli.cli` from the config file and the command line (flags win), then
handed to the TUI, one-shot mode or the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chatcli.config import Config
from chatcli.engine.load import LoadOptions
from chatcli.engine.params import SamplingParams


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
    cache_budget_bytes: int | None = None  # --cache-budget; None: chatcli.engine.pool.default_budget_bytes()

    def load_engine(self, status=None):
        """Load the model and wrap it in an Engine (can be slow the first time: call it off the UI thread)."""
        from chatcli.engine.load import load_engine

        return load_engine(self.model, self.load, config_default=self.config.model, status=status)
