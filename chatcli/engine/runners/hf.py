"""The reference runner: a transformers causal LM's own forward with a DynamicCache (see runner)."""

from __future__ import annotations

import torch

from chatcli.engine.kv.cache import KVCache
from chatcli.engine.runners.base import ModelRunner
from chatcli.engine.runners.torch_state import from_state, logits_out, to_state


class HFCache(KVCache):
    def __init__(self, config, device=None) -> None:
        super().__init__()
        from transformers import DynamicCache

        self._config = config
        self.device = device
        self.hf = DynamicCache(config=config)

    def reachable(self, keep: int) -> int:
        keep = super().reachable(keep)
        layers = getattr(self.hf, "layers", [])
        croppable = all(getattr(x, "is_croppable", True) and not getattr(x, "is_sliding", False) for x in layers)
        return keep if croppable or keep == len(self.ids) else 0  # sliding/linear layers: start over

    def _crop(self, keep: int) -> None:
        if keep == 0:
            from transformers import DynamicCache

            self.hf = DynamicCache(config=self._config)
            return
        self.hf.crop(-(len(self.ids) - keep))  # transformers 5: a negative count to remove

    def state(self) -> dict:
        out = {}
        for i, layer in enumerate(getattr(self.hf, "layers", [])):
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if not isinstance(keys, torch.Tensor) or getattr(layer, "is_sliding", False):
                return {}  # sliding-window or linear-attention layers: not saved
            out[f"k{i}"], out[f"v{i}"] = to_state(keys), to_state(values)  # [1, KV, S, hd]
        return out

    def restore(self, ids: list[int], state: dict) -> bool:
        from transformers import DynamicCache

        self.hf = DynamicCache(config=self._config)
        self.ids = []
        layers = len(state) // 2
        try:
            for i in range(layers):
                keys, values = from_state(state[f"k{i}"], self.device), from_state(state[f"v{i}"], self.device)
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

    kernel_off = "the transformers runner"

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
        return HFCache(self.model.config, self.device)

    def forward(self, ids: list[int], cache: KVCache):
        return logits_out(self._logits(ids, cache, 1)[-1])  # [V]

    def verify(self, ids: list[int], cache: KVCache):
        return logits_out(self._logits(ids, cache, 0))  # [S, V]

    @torch.inference_mode()
    def hidden_states(self, batch: list[list[int]]) -> list:
        """The decoder's `last_hidden_state` (after its final norm) of each sequence, alone."""
        decoder = self.model.get_decoder()
        out = []
        for ids in batch:
            input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)  # [1, S]
            out.append(decoder(input_ids=input_ids, use_cache=False).last_hidden_state[0].float().cpu().numpy())
        return out

    @torch.inference_mode()  # thread-local: entered in whichever thread runs the step
    def _logits(self, ids: list[int], cache: KVCache, keep: int) -> torch.Tensor:
        """[S] ids -> fp32 logits of the last `keep` positions (0: all) `[keep, V]`."""
        assert isinstance(cache, HFCache)
        if not ids:
            raise ValueError("forward needs at least one id")
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)  # [1, S]
        out = self.model(input_ids=input_ids, cache=cache.hf, use_cache=True, logits_to_keep=keep)
        cache.ids.extend(ids)
        return out.logits[0].float()  # [keep or S, V]
