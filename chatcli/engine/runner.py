"""The model forward and its KV cache, behind one small interface.

A `ModelRunner` turns token ids into next-token logits and appends their keys and
values to a `KVCache`. The cache remembers exactly which ids it holds (`cache.ids`),
so the engine can compare them with the next turn's prompt and keep the common
prefix. `HFRunner` is the reference path over any transformers causal LM; faster
runners (the lean Llama path) implement the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class KVCache(ABC):
    """Keys/values of the ids fed so far; `len(cache) == len(cache.ids)`."""

    def __init__(self) -> None:
        self.ids: list[int] = []

    def __len__(self) -> int:
        return len(self.ids)

    def crop(self, keep: int) -> None:
        """Forget everything after the first `keep` ids."""
        keep = max(0, min(keep, len(self.ids)))
        if keep < len(self.ids):
            self._crop(keep)
            del self.ids[keep:]

    @abstractmethod
    def _crop(self, keep: int) -> None: ...

    @property
    @abstractmethod
    def nbytes(self) -> int: ...

    def state(self) -> dict[str, torch.Tensor]:
        """The held keys/values as named tensors (for saving to disk); empty where unsupported."""
        return {}

    def restore(self, ids: list[int], state: dict[str, torch.Tensor]) -> bool:
        """Load what `state()` gave, for exactly `ids`; False (and left empty) where unsupported."""
        return False


class ModelRunner(ABC):
    context_limit: int
    device: torch.device
    dtype: torch.dtype
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
    def forward(self, ids: list[int], cache: KVCache) -> torch.Tensor:
        """Feed `ids` after what `cache` holds; return fp32 logits `[V]` of the last position."""

    @abstractmethod
    def verify(self, ids: list[int], cache: KVCache) -> torch.Tensor:
        """`forward`, returning fp32 logits `[S, V]` of every position: one pass that checks a
        drafted continuation (see `chatcli.engine.lookup`); the caller crops what it rejects."""


class HFCache(KVCache):
    def __init__(self, config) -> None:
        super().__init__()
        from transformers import DynamicCache

        self._config = config
        self.hf = DynamicCache(config=config)

    def _crop(self, keep: int) -> None:
        layers = getattr(self.hf, "layers", [])
        if keep == 0 or not all(getattr(layer, "is_croppable", True) for layer in layers):
            from transformers import DynamicCache

            self.hf = DynamicCache(config=self._config)  # sliding/linear layers: start over
            self.ids.clear()
            return
        self.hf.crop(-(len(self.ids) - keep))  # transformers 5: a negative count to remove

    def state(self) -> dict[str, torch.Tensor]:
        out = {}
        for i, layer in enumerate(getattr(self.hf, "layers", [])):
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if not isinstance(keys, torch.Tensor) or getattr(layer, "is_sliding", False):
                return {}  # sliding-window or linear-attention layers: not saved
            out[f"k{i}"], out[f"v{i}"] = keys.contiguous(), values.contiguous()  # [1, KV, S, hd]
        return out

    def restore(self, ids: list[int], state: dict[str, torch.Tensor]) -> bool:
        from transformers import DynamicCache

        self.hf = DynamicCache(config=self._config)
        self.ids = []
        layers = len(state) // 2
        try:
            for i in range(layers):
                keys, values = state[f"k{i}"], state[f"v{i}"]
                if keys.shape[-2] != len(ids) or values.shape != keys.shape:
                    raise ValueError("saved cache does not match its ids")
                self.hf.update(keys, values, i)
        except (KeyError, ValueError, RuntimeError):
            self.hf = DynamicCache(config=self._config)
            return False
        self.ids = list(ids)
        return layers > 0

    @property
    def nbytes(self) -> int:
        total = 0
        for layer in getattr(self.hf, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total


class HFRunner(ModelRunner):
    """The reference: the transformers model's own forward with a DynamicCache."""

    def __init__(self, model, context_limit: int, quantized: bool = False) -> None:
        self.model = model
        self.context_limit = context_limit
        self.device = model.device
        self.dtype = model.dtype
        self.quantized = quantized  # the model is a dynamically quantized copy (quantize_hf_model)
        config = model.config
        layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
        # sliding-window or recurrent layers cannot be cropped back by a few positions mid-turn
        self.rewinds = not getattr(config, "sliding_window", None) and layer_types <= {"full_attention"}

    @property
    def exact_verify(self) -> bool:
        return self.rewinds and not self.quantized

    def new_cache(self) -> HFCache:
        return HFCache(self.model.config)

    def forward(self, ids: list[int], cache: KVCache) -> torch.Tensor:
        return self._logits(ids, cache, 1)[-1]  # [V]

    def verify(self, ids: list[int], cache: KVCache) -> torch.Tensor:
        return self._logits(ids, cache, 0)  # [S, V]

    def _logits(self, ids: list[int], cache: KVCache, keep: int) -> torch.Tensor:
        """[S] ids -> fp32 logits of the last `keep` positions (0: all) `[keep, V]`."""
        assert isinstance(cache, HFCache)
        if not ids:
            raise ValueError("forward needs at least one id")
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)  # [1, S]
        out = self.model(input_ids=input_ids, cache=cache.hf, use_cache=True, logits_to_keep=keep)
        cache.ids.extend(ids)
        return out.logits[0].float()  # [keep or S, V]
