"""The model forward and its KV cache, behind one small interface.

A `ModelRunner` turns token ids into next-token logits and appends their keys and
values to a `KVCache`. The cache remembers exactly which ids it holds (`cache.ids`),
so the engine can compare them with the next turn's prompt and keep the common
prefix. Logits come back as numpy float32 arrays whatever computed them, so the engine
and the sampler need no torch. `hf_runner.HFRunner` is the reference path over any
transformers causal LM; the lean Llama runners (`lean.LeanRunner` on torch,
`native.NativeRunner` on the compiled kernel) implement the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class KVCache(ABC):
    """Keys/values of the ids fed so far; `len(cache) == len(cache.ids)`."""

    def __init__(self) -> None:
        self.ids: list[int] = []

    def __len__(self) -> int:
        return len(self.ids)

    def reachable(self, keep: int) -> int:
        """What `crop(keep)` keeps: `keep` (at most what is held), or 0 where the cache cannot go back
        that far (sliding-window layers that have dropped the keys position `keep` would read)."""
        return max(0, min(keep, len(self.ids)))

    def crop(self, keep: int) -> None:
        """Forget everything after the first `keep` ids (everything where it cannot keep those: `reachable`)."""
        keep = self.reachable(keep)
        if keep < len(self.ids):
            self._crop(keep)
            del self.ids[keep:]

    @abstractmethod
    def _crop(self, keep: int) -> None: ...

    @property
    @abstractmethod
    def nbytes(self) -> int: ...

    def state(self) -> dict[str, tuple[str, object]]:
        """The held keys/values as named (safetensors dtype code, numpy array) pairs, BF16 as uint16
        (for saving to disk; see persist); empty where unsupported."""
        return {}

    def restore(self, ids: list[int], state: dict[str, tuple[str, object]]) -> bool:
        """Load what `state()` gave, for exactly `ids`; False (and left empty) where unsupported."""
        return False


class ModelRunner(ABC):
    context_limit: int
    device: object  # a torch.device, or "cpu"
    dtype: object  # a torch.dtype, or its name
    quantized: bool = False

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
        drafted continuation (see `chatcli.engine.lookup`); the caller crops what it rejects."""

    def files(self) -> list:
        """The lean files this runner memory-maps (none for the transformers runner)."""
        return []


def weights_dtype(runner) -> str:
    """What a runner's weights are: int8, q4 or q8 where quantized (a native runner's lean file
    says which), else its dtype (float32, bfloat16, …)."""
    if getattr(runner, "quantized", False):
        kind = getattr(getattr(runner, "config", None), "kind", None)
        return kind if kind in ("q4", "q8") else "int8"
    return str(getattr(runner, "dtype", "?")).removeprefix("torch.")
