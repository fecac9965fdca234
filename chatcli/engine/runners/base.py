"""The model forward and its KV cache, behind one small interface.

A `ModelRunner` turns token ids into next-token logits and appends their keys and
values to a `KVCache`. The cache remembers exactly which ids it holds (`cache.ids`),
so the engine can compare them with the next turn's prompt and keep the common
prefix. Logits come back as numpy float32 arrays whatever computed them, so the engine
and the sampler need no torch. `hf.HFRunner` is the reference path over any
transformers causal LM; the lean Llama runners (`lean.LeanRunner` on torch,
`native.NativeRunner` on the compiled kernel) implement the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from chatcli.engine.kv.cache import KVCache


class ModelRunner(ABC):
    context_limit: int
    device: object  # a torch.device, or "cpu"
    dtype: object  # a torch.dtype, or its name
    quantized: bool = False
    kernel_off = "the torch path"  # why a CPU forward is not the compiled kernel's (the loader says)

    @property
    def exact_verify(self) -> bool:
        """Whether `verify`'s logits for a position are those `forward` would give, so checking a
        draft never changes a reply. Not with torch's int8 kernels: activations are quantized per
        call, so rows verified together share a scale that single-row decode steps do not (the
        lean runner's compiled step scales each row alone: see `LeanRunner.exact_verify`)."""
        return not self.quantized

    @abstractmethod
    def new_cache(self) -> KVCache: ...

    @abstractmethod
    def forward(self, ids: list[int], cache: KVCache):
        """Feed `ids` after what `cache` holds; return fp32 logits `[V]` (numpy) of the last position."""

    @abstractmethod
    def verify(self, ids: list[int], cache: KVCache):
        """`forward`, returning fp32 logits `[S, V]` (numpy) of every position: one pass that checks a
        drafted continuation (see `chatcli.engine.sample.lookup`); the caller crops what it rejects."""

    def hidden_states(self, batch: list[list[int]]) -> list:
        """Each sequence's final hidden states, fp32 `[S, D]` (numpy): after the final norm, its weight
        included, each read from an empty context (no cache is kept): what an embedding pools."""
        raise NotImplementedError(f"{type(self).__name__} does not give its hidden states")

    @property
    def kernel(self) -> str | None:
        """Which build of the compiled kernel runs the forward ("avx512", "avxvnni", "avx2", "neon": the native
        runner's), else "off (why)" on the CPU (`chatcli bench` and the TUI's header say it); None off the
        CPU, where the kernel never runs."""
        return f"off ({self.kernel_off})" if str(getattr(self.device, "type", self.device)) == "cpu" else None

    @property
    def weights_dtype(self) -> str:
        """What the weights are: int8, q4 or q8 where quantized (a native runner's lean file says
        which), else their dtype (float32, bfloat16, …)."""
        if self.quantized:
            config = getattr(self, "config", None)
            kind = getattr(config, "kind", None)
            if kind == "gguf":  # the GGUF's own types, as llama.cpp names them
                return f"gguf {config.types}"
            return kind if kind in ("q4", "q8") else "int8"
        return str(self.dtype).removeprefix("torch.")

    def files(self) -> list:
        """The lean files this runner memory-maps (none for the transformers runner)."""
        return []
