"""The in-process engine: load → tokenize → prefill → KV cache → decode → sample → detokenize → stats.

No UI imports anywhere below this package. Importing it is cheap: torch and
transformers are imported by the modules that need them.
"""
