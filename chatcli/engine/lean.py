"""The lean forward for the Llama family: the same weights, less machinery.

transformers' forward is general; on two CPU cores its per-step overhead (module
hooks, cache bookkeeping, mask building, logits for every position) costs as much
as the arithmetic. This runner does only what a Llama decoder needs, gpt-fast style:

- a preallocated KV cache per conversation, `[L, KV, capacity, hd]`, written in place
  at an explicit position; cropping just moves the position (nothing is copied);
- projection weights transposed once at load (`x @ W_t` beats `F.linear` on CPU) and
  fused: q/k/v into one matrix, gate/up into another;
- rotary tables computed once for the whole context;
- logits for the last position only;
- no Python-side shape work in the decode step beyond a few views.

Models it cannot run exactly (other architectures, biases, sliding windows, rope
types other than default/linear/llama3) fall back to `HFRunner`: see `lean_support`.
The tests check that it gives the HF reference's greedy tokens and logits within
tolerance over multi-turn conversations with crops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from chatcli.engine.runner import KVCache, ModelRunner

CACHE_BLOCK = 512  # the KV cache grows in steps of this many positions (amortised, never per step)
LEAN_MODEL_TYPES = ("llama",)
LEAN_ROPE_TYPES = ("default", "linear", "llama3")


def lean_support(model) -> str | None:
    """None if the lean runner reproduces this model exactly, else why not (one line)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in LEAN_MODEL_TYPES:
        return f"architecture {kind!r} is not in the lean path ({', '.join(LEAN_MODEL_TYPES)})"
    if getattr(model, "hf_device_map", None):
        return "the model is split across devices (--device-map)"
    checks = {
        "attention biases": getattr(config, "attention_bias", False),
        "MLP biases": getattr(config, "mlp_bias", False),
        "a sliding window": getattr(config, "sliding_window", None),
        f"activation {getattr(config, 'hidden_act', None)!r}": getattr(config, "hidden_act", "silu") != "silu",
        "pretraining_tp > 1": (getattr(config, "pretraining_tp", 1) or 1) > 1,
    }
    for what, present in checks.items():
        if present:
            return f"the model uses {what}"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in LEAN_ROPE_TYPES:
        return f"rope type {rope_type!r} is not in the lean path"
    if getattr(getattr(model, "model", None), "rotary_emb", None) is None:
        return "the model has no rotary embedding module"
    return None


class Dense:
    """A projection with its weight stored transposed: `x [S, in] @ w_t [in, out]`."""

    def __init__(self, weight: torch.Tensor) -> None:  # weight: [out, in], as nn.Linear stores it
        self.w_t = weight.detach().t().contiguous()  # [in, out]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w_t

    @property
    def nbytes(self) -> int:
        return self.w_t.numel() * self.w_t.element_size()


@dataclass
class LeanLayer:
    attn_norm: torch.Tensor  # [D]
    qkv: object  # [S, D] -> [S, (H + 2 KV) hd]
    out: object  # [S, H hd] -> [S, D]
    mlp_norm: torch.Tensor  # [D]
    gate_up: object  # [S, D] -> [S, 2 F]
    down: object  # [S, F] -> [S, D]


class LeanCache(KVCache):
    """Keys and values of every layer in two preallocated tensors; the position is `len(self.ids)`."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, limit: int, dtype, device) -> None:
        super().__init__()
        self._shape = (layers, kv_heads, head_dim)
        self.limit = limit
        self.k = torch.empty(layers, kv_heads, 0, head_dim, dtype=dtype, device=device)  # [L, KV, cap, hd]
        self.v = torch.empty_like(self.k)  # [L, KV, cap, hd]

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def reserve(self, n: int) -> None:
        """Make room for `n` positions in all; grows in blocks and copies what is held."""
        if n <= self.capacity:
            return
        cap = min(max(self.limit, n), -(-n // CACHE_BLOCK) * CACHE_BLOCK)
        layers, kv_heads, head_dim = self._shape
        held = len(self.ids)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = torch.empty(layers, kv_heads, cap, head_dim, dtype=old.dtype, device=old.device)
            new[:, :, :held] = old[:, :, :held]
            setattr(self, name, new)

    def _crop(self, keep: int) -> None:
        pass  # positions past `keep` are simply overwritten by the next forward

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class LeanRunner(ModelRunner):
    """A `ModelRunner` over a transformers Llama's weights, without transformers' forward."""

    def __init__(self, model, context_limit: int, linear=Dense, quantize_head: bool = True) -> None:
        reason = lean_support(model)
        if reason:
            raise ValueError(f"the lean runner cannot run this model: {reason}")
        config = model.config
        self.model = model  # the transformers model whose weights these are (the HF reference)
        self.context_limit = context_limit
        self.device = model.device
        self.dtype = model.dtype
        self.quantized = linear is not Dense
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.hidden = config.hidden_size
        self.head_dim = getattr(config, "head_dim", None) or self.hidden // self.heads
        self.eps = float(config.rms_norm_eps)
        self._split = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]

        inner = model.model
        self.embed = inner.embed_tokens.weight.detach()  # [V, D]
        self.final_norm = inner.norm.weight.detach()  # [D]
        self.layers = [self._layer(block, linear) for block in inner.layers]
        head = model.get_output_embeddings().weight
        self.head = (linear if quantize_head else Dense)(head)  # [1, D] -> [1, V]
        self.cos, self.sin = self._rope_tables(inner.rotary_emb, context_limit)  # [T, hd] each

    @staticmethod
    def _layer(block, linear) -> LeanLayer:
        attn, mlp = block.self_attn, block.mlp
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], 0)  # [(H+2KV) hd, D]
        gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], 0)  # [2F, D]
        return LeanLayer(
            attn_norm=block.input_layernorm.weight.detach(),
            qkv=linear(qkv.detach()),
            out=linear(attn.o_proj.weight),
            mlp_norm=block.post_attention_layernorm.weight.detach(),
            gate_up=linear(gate_up.detach()),
            down=linear(mlp.down_proj.weight),
        )

    def _rope_tables(self, rotary, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = rotary.inv_freq.float()  # [hd/2], rope scaling already folded in by transformers
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        positions = torch.arange(limit, dtype=torch.float32, device=inv_freq.device)  # [T]
        freqs = torch.outer(positions, inv_freq)  # [T, hd/2]
        angles = torch.cat([freqs, freqs], -1)  # [T, hd]
        cos = (angles.cos() * scale).to(self.dtype).to(self.device)
        sin = (angles.sin() * scale).to(self.dtype).to(self.device)
        return cos, sin

    def new_cache(self) -> LeanCache:
        return LeanCache(len(self.layers), self.kv_heads, self.head_dim, self.context_limit, self.dtype, self.device)

    @property
    def weight_bytes(self) -> int:
        total = 0
        for layer in self.layers:
            total += sum(getattr(p, "nbytes", 0) for p in (layer.qkv, layer.out, layer.gate_up, layer.down))
        return total + getattr(self.head, "nbytes", 0)

    def forward(self, ids: list[int], cache: KVCache) -> torch.Tensor:
        assert isinstance(cache, LeanCache)
        if not ids:
            raise ValueError("forward needs at least one id")
        start, length = len(cache.ids), len(ids)
        end = start + length
        if end > self.context_limit:
            raise ValueError(f"{end} positions exceed the context limit {self.context_limit}")
        cache.reserve(end)
        tokens = torch.tensor(ids, dtype=torch.long, device=self.device)  # [S]
        x = self.embed[tokens]  # [S, D]
        cos, sin = self.cos[start:end], self.sin[start:end]  # [S, hd]
        mask = None
        if length > 1 and start > 0:  # a chunk after cached positions: causal with an offset
            cols = torch.arange(end, device=self.device)  # [T]
            rows = torch.arange(start, end, device=self.device)  # [S]
            mask = cols[None, :] <= rows[:, None]  # [S, T]
        causal = length > 1 and start == 0
        for i, layer in enumerate(self.layers):
            x = x + self._attention(i, layer, F.rms_norm(x, (self.hidden,), layer.attn_norm, self.eps),
                                    cache, start, end, cos, sin, mask, causal)
            h = F.rms_norm(x, (self.hidden,), layer.mlp_norm, self.eps)  # [S, D]
            gate, up = layer.gate_up(h).chunk(2, -1)  # [S, F] each
            x = x + layer.down(F.silu(gate) * up)  # [S, D]
        last = F.rms_norm(x[-1:], (self.hidden,), self.final_norm, self.eps)  # [1, D]
        logits = self.head(last)  # [1, V]
        cache.ids.extend(ids)
        return logits[0].float()  # [V]

    def _attention(self, i, layer: LeanLayer, h, cache: LeanCache, start, end, cos, sin, mask, causal):
        length = h.shape[0]
        q, k, v = layer.qkv(h).split(self._split, -1)  # [S, H hd], [S, KV hd], [S, KV hd]
        q = _rope(q.view(length, self.heads, self.head_dim).transpose(0, 1), cos, sin)  # [H, S, hd]
        k = _rope(k.view(length, self.kv_heads, self.head_dim).transpose(0, 1), cos, sin)  # [KV, S, hd]
        cache.k[i, :, start:end] = k
        cache.v[i, :, start:end] = v.view(length, self.kv_heads, self.head_dim).transpose(0, 1)
        keys = cache.k[i, :, :end]  # [KV, T, hd], a view
        values = cache.v[i, :, :end]  # [KV, T, hd]
        out = F.scaled_dot_product_attention(
            q[None], keys[None], values[None], attn_mask=mask, is_causal=causal,
            enable_gqa=self.heads != self.kv_heads,
        )  # [1, H, S, hd]
        return layer.out(out[0].transpose(0, 1).reshape(length, self.heads * self.head_dim))  # [S, D]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half convention (transformers' Llama): x [N, S, hd], cos/sin [S, hd]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)  # [N, S, hd]
    return x * cos + rotated * sin
