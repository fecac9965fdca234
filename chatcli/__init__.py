"""chatcli: a terminal chat for local LLMs with a KV cache kept per conversation."""

__version__ = "0.1.0"
