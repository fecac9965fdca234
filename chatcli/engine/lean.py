"""The lean forward for the Llama family: the same weights, less machinery.

transformers' forward is general. On two CPU cores its per-step overhead (module
calls, cache bookkeeping, mask building, unfused projections) was about a quarter of
a SmolLM2-135M decode step. This runner does only what a Llama decoder needs, in the
style of gpt-fast:

- a preallocated KV cache per conversation, `[L, KV, capacity, hd]`, written in place
  at an explicit position (`lean_cache.LeanCache`); on the CPU it is reserved for the
  whole context at once (the OS backs only the pages written). It may be
  kept in another dtype than the weights (`kv_dtype`: bf16 on CPUs with AMX), and
  attention then runs in it;
- projection weights transposed once at load (`x @ W_t` beats `F.linear` on CPU) and
  fused: q/k/v into one matrix, gate/up into another;
- the RMSNorm weights folded into the projections after them, and q/k rows
  reordered so rope is one complex multiplication from a table built once;
- logits for the last position only;
- two paths: `prefill` (a chunk of positions, causal mask with an offset) and
  `decode_one_token` (one position: no mask, transposes or copies, beyond a few views);
- for `--quantize int8`, int8 projections in decode steps only (`Projection.decode`);
- where the CPU has AVX-512 VNNI, decode steps and draft checks in one call of the
  compiled kernel (`compiled.py`, `kernels/decode.cpp`); `decode_one_token` is the torch
  path it replaces, and the reference the tests hold it to.

Models it cannot run exactly (other architectures, biases, sliding windows, rope
types other than default/linear/llama3) fall back to `HFRunner`: see `lean_support`.
The tests check that it gives the HF reference's greedy tokens and logits within
tolerance over multi-turn conversations with crops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from chatcli.engine.lean_cache import LeanCache
from chatcli.engine.runner import KVCache, ModelRunner

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


class Projection:
    """A projection with its weight stored transposed: `x [S, in] @ w_t [in, out]`.

    `w_t` may be kept in another dtype than the activations (bf16 prefill weights for an
    int8 model on a CPU with bf16 matmuls): inputs are cast to it and back. With `decode`,
    single-row inputs (decode steps) go to that projection instead (int8 weights: a
    quarter of the bytes, and a decode step is bound by the bytes it reads).
    """

    def __init__(self, w_t: torch.Tensor | None, decode=None) -> None:  # w_t: [in, out], contiguous
        self.w_t = w_t
        self.decode = decode

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.decode is not None and (x.shape[0] == 1 or self.w_t is None):
            return self.decode(x)
        if x.dtype != self.w_t.dtype:
            return (x.to(self.w_t.dtype) @ self.w_t).to(x.dtype)
        return x @ self.w_t

    @property
    def decode_nbytes(self) -> int:
        """The bytes one decode step reads."""
        if self.decode is not None:
            return self.decode.nbytes
        return self.w_t.numel() * self.w_t.element_size()


@dataclass
class LeanLayer:
    qkv: Projection  # [S, D] -> [S, (H + 2 KV) hd]; input norm folded in, q/k rows interleaved for rope
    out: Projection  # [S, H hd] -> [S, D]
    gate_up: Projection  # [S, D] -> [S, 2 F]; post-attention norm folded in
    down: Projection  # [S, F] -> [S, D]


class LeanRunner(ModelRunner):
    """A `ModelRunner` over a transformers Llama's weights, without transformers' forward."""

    def __init__(self, model, context_limit: int, kv_dtype: torch.dtype | None = None, decode_linear=None,
                 prefill_dtype: torch.dtype | None = None, smooth: list[torch.Tensor] | None = None,
                 kernel: bool = True) -> None:
        """`kv_dtype`: the cache's dtype (default the model's). `decode_linear`: a factory
        `weight [out, in] -> projection` for decode steps (`Int8Rows`, `Int8Dense`); prefill keeps
        dense weights in `prefill_dtype` (default the model's). `smooth`: per-layer SmoothQuant
        scales for the down projection (see `quantize.down_smoothing`). `kernel`: run decode
        steps and draft checks through the compiled kernel where it can (`compiled.py`)."""
        reason = lean_support(model)
        if reason:
            raise ValueError(f"the lean runner cannot run this model: {reason}")
        config = model.config
        self.model = model  # the transformers model whose weights these are (the HF reference; see release_reference)
        self.context_limit = context_limit
        self.device = model.device
        self.dtype = model.dtype
        self.kv_dtype = kv_dtype or model.dtype  # the cache's dtype; attention runs in it
        self.quantized = decode_linear is not None
        self.prefill_dtype = prefill_dtype or model.dtype
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.hidden = config.hidden_size
        self.head_dim = getattr(config, "head_dim", None) or self.hidden // self.heads
        self.eps = float(config.rms_norm_eps)
        self._split = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]

        inner = model.model
        self.embed = inner.embed_tokens.weight.detach()  # [V, D]
        smooth = smooth or [None] * len(inner.layers)
        self.layers = [self._layer(block, decode_linear, s) for block, s in zip(inner.layers, smooth)]
        head_t = fused_transposed([model.get_output_embeddings().weight], inner.norm.weight)  # [D, V], norm folded
        # [1, D] -> [1, V]: only ever the last position, so a quantized model keeps no dense head
        self.head = Projection(None, decode_linear(head_t.t())) if decode_linear else Projection(head_t)
        self.rope = self._rope_table(inner.rotary_emb, context_limit)  # [T, 1, hd/2] complex
        self.kernel = kernel
        self._compile()

    def _compile(self) -> None:
        """`self.compiled`: the kernel's step over these weights, or None with `kernel_why_not` saying why."""
        from chatcli.engine.compiled import compile_decode

        self.compiled, self.kernel_why_not = compile_decode(self) if self.kernel else (None, "not asked for")

    @property
    def exact_verify(self) -> bool:
        """The kernel checks a draft's rows as it decodes each alone, int8 included."""
        return self.compiled is not None or not self.quantized

    def _layer(self, block, decode_linear, smooth: torch.Tensor | None) -> LeanLayer:
        def linear(parts: list, scale=None, interleave=()):
            w_t = fused_transposed(parts, scale, interleave)  # [in, out]
            decode = decode_linear(w_t.t()) if decode_linear else None
            return Projection(w_t.to(self.prefill_dtype).contiguous(), decode)

        attn, mlp = block.self_attn, block.mlp
        up, down = mlp.up_proj.weight, mlp.down_proj.weight  # [F, D], [D, F]
        if smooth is not None:  # SmoothQuant: down's input channel j divided by s_j, its weight column times s_j
            up, down = up / smooth[:, None], down * smooth[None, :]  # silu(gate) * up is linear in up
        # RMSNorm's weight scales the input columns of the projection after it: it is folded in.
        # q and k rows are interleaved per head so that rope is one complex multiplication.
        heads = (self.heads, self.kv_heads)
        return LeanLayer(
            qkv=linear([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight],
                       block.input_layernorm.weight, interleave=heads),
            out=linear([attn.o_proj.weight]),
            gate_up=linear([mlp.gate_proj.weight, up], block.post_attention_layernorm.weight),
            down=linear([down]),
        )

    def _rope_table(self, rotary, limit: int) -> torch.Tensor:
        inv_freq = rotary.inv_freq.float()  # [hd/2], rope scaling already folded in by transformers
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        positions = torch.arange(limit, dtype=torch.float32, device=inv_freq.device)  # [T]
        freqs = torch.outer(positions, inv_freq)  # [T, hd/2]
        table = torch.polar(torch.full_like(freqs, scale), freqs)  # [T, hd/2] complex64
        return table[:, None, :].to(self.device)  # [T, 1, hd/2]

    def release_reference(self) -> None:
        """Let go of the transformers model: the lean path holds its own copy of the weights,
        and only tests, the bench and `--runner hf` run the reference. The embedding, the one
        tensor shared with it, is copied: a view would keep the whole weight file mapped."""
        self.embed = self.embed.clone()
        self.model = None
        self._compile()  # the compiled step held the old embedding

    def new_cache(self) -> LeanCache:
        return LeanCache(len(self.layers), self.kv_heads, self.head_dim, self.context_limit, self.kv_dtype, self.device)

    @property
    def weight_bytes(self) -> int:
        """The weight bytes one decode step reads (the bound on decode speed)."""
        total = 0
        for layer in self.layers:
            total += sum(p.decode_nbytes for p in (layer.qkv, layer.out, layer.gate_up, layer.down))
        return total + self.head.decode_nbytes

    def forward(self, ids: list[int], cache: KVCache) -> torch.Tensor:
        assert isinstance(cache, LeanCache)
        if not ids:
            raise ValueError("forward needs at least one id")
        start, length = len(cache.ids), len(ids)
        end = start + length
        if end > self.context_limit:
            raise ValueError(f"{end} positions exceed the context limit {self.context_limit}")
        cache.reserve(end)
        if length == 1 and self.compiled is not None:
            logits = self.compiled(ids, cache.k, cache.v, start, every=False)  # [V]
        else:
            tokens = torch.tensor(ids, dtype=torch.long, device=self.device)  # [S]
            step = self.decode_one_token if length == 1 else self.prefill
            logits = step(tokens, cache.k, cache.v, start)  # [V]
        cache.ids.extend(ids)
        return logits

    def verify(self, ids: list[int], cache: KVCache) -> torch.Tensor:
        """A few ids -> logits [S, V] of each (a draft to check; see `ModelRunner.verify`)."""
        assert isinstance(cache, LeanCache)
        start, end = len(cache.ids), len(cache.ids) + len(ids)
        if not ids or end > self.context_limit:
            raise ValueError(f"verify needs 1..{self.context_limit - start} ids, got {len(ids)}")
        cache.reserve(end)
        if self.compiled is not None:
            logits = self.compiled(ids, cache.k, cache.v, start, every=True)  # [S, V], each row as if alone
        else:
            tokens = torch.tensor(ids, dtype=torch.long, device=self.device)  # [S]
            if len(ids) == 1:
                logits = self.decode_one_token(tokens, cache.k, cache.v, start)[None]  # [1, V]
            else:
                logits = self.prefill(tokens, cache.k, cache.v, start, every=True)  # [S, V]
        cache.ids.extend(ids)
        return logits

    def prefill(self, tokens: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int,
                every: bool = False) -> torch.Tensor:
        """tokens [S] at positions start.. (written into k_cache/v_cache [L, KV, cap, hd]) -> logits [V] of the
        last; `every`: logits [S, V] of each position."""
        length = tokens.shape[0]
        end = start + length
        x = self.embed[tokens]  # [S, D]
        rope = self.rope[start:end]  # [S, 1, hd/2]
        mask = None
        if start > 0:  # a chunk after cached positions: causal with an offset
            cols = torch.arange(end, device=self.device)  # [T]
            rows = torch.arange(start, end, device=self.device)  # [S]
            allowed = cols[None, :] <= rows[:, None]  # [S, T]
            # additive, in the cache's dtype: SDPA would otherwise convert a bool mask in every layer
            mask = torch.zeros(allowed.shape, dtype=k_cache.dtype, device=self.device).masked_fill_(~allowed, float("-inf"))
        causal = start == 0
        for i, layer in enumerate(self.layers):
            x = x + self._attention(i, layer, self._norm(x), k_cache[i], v_cache[i], start, rope, mask, causal)  # [S, D]
            x = x + self._mlp(layer, x)  # [S, D]
        if every:
            return self.head(self._norm(x)).float()  # [S, V]
        return self.head(self._norm(x[-1:]))[0].float()  # [V]

    def decode_one_token(self, token: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int) -> torch.Tensor:
        """token [1] at position pos -> logits [V]: `prefill` for one row, with no mask, transposes or copies."""
        heads, kv_heads, hd = self.heads, self.kv_heads, self.head_dim
        n_qk = (heads + kv_heads) * hd
        x = self.embed[token]  # [1, D]
        rope = self.rope[pos]  # [1, hd/2]
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(self._norm(x))  # [1, (H+2KV) hd]
            pairs = qkv[0, :n_qk].view(heads + kv_heads, hd // 2, 2)  # [H+KV, hd/2, 2]
            if pairs.dtype != torch.float32:
                pairs = pairs.float()
            qk = torch.view_as_real(torch.view_as_complex(pairs) * rope).view(heads + kv_heads, hd)  # [H+KV, hd]
            k_cache[i, :, pos] = qk[heads:]  # [KV, hd]
            v_cache[i, :, pos] = qkv[0, n_qk:].view(kv_heads, hd)  # [KV, hd]
            q = qk[:heads].view(1, heads, 1, hd)  # [1, H, 1, hd]
            if q.dtype != k_cache.dtype:
                q = q.to(k_cache.dtype)
            out = F.scaled_dot_product_attention(
                q, k_cache[i, None, :, : pos + 1], v_cache[i, None, :, : pos + 1], enable_gqa=heads != kv_heads,
            ).view(1, heads * hd)  # [1, H hd]
            if out.dtype != x.dtype:
                out = out.to(x.dtype)
            x = x + layer.out(out)  # [1, D]
            x = x + self._mlp(layer, x)  # [1, D]
        return self.head(self._norm(x))[0].float()  # [V]

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm without its weight (folded into the next projection), in fp32 like transformers."""
        xf = x if x.dtype == torch.float32 else x.float()  # [S, D]
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed if normed.dtype == x.dtype else normed.to(x.dtype)

    def _mlp(self, layer: LeanLayer, x: torch.Tensor) -> torch.Tensor:
        gate, up = layer.gate_up(self._norm(x)).chunk(2, -1)  # [S, F] each
        return layer.down(F.silu(gate).mul_(up))  # [S, D]

    def _attention(self, i, layer: LeanLayer, h, k_cache, v_cache, start, rope, mask, causal):
        """h [S, D] -> [S, D]; writes positions start.. of this layer's k_cache/v_cache [KV, cap, hd]."""
        length = h.shape[0]
        end = start + length
        heads, kv_heads, hd = self.heads, self.kv_heads, self.head_dim
        qkv = layer.qkv(h)  # [S, (H+2KV) hd]
        qk = _apply_rope(qkv[:, : (heads + kv_heads) * hd], rope, heads + kv_heads, hd)  # [S, H+KV, hd]
        v = qkv[:, (heads + kv_heads) * hd :].view(length, kv_heads, hd)  # [S, KV, hd]
        k_cache[:, start:end] = qk[:, heads:].transpose(0, 1)
        v_cache[:, start:end] = v.transpose(0, 1)
        q = qk[:, :heads].transpose(0, 1).to(k_cache.dtype)  # [H, S, hd]
        out = F.scaled_dot_product_attention(
            q[None], k_cache[None, :, :end], v_cache[None, :, :end], attn_mask=mask, is_causal=causal,
            enable_gqa=heads != kv_heads,
        )  # [1, H, S, hd]
        return layer.out(out[0].transpose(0, 1).reshape(length, heads * hd).to(self.dtype))  # [S, D]


def fused_transposed(parts: list[torch.Tensor], scale=None, interleave: tuple = ()) -> torch.Tensor:
    """nn.Linear weights `[out_i, in]` → one contiguous `[in, sum out_i]`, written once, in place.

    `scale [in]` multiplies the input rows (a folded RMSNorm weight). The first
    `len(interleave)` parts (q, k with that many heads) get their rows reordered per head
    from rotate-half pairs (i, i + hd/2) to adjacent pairs (2i, 2i + 1); q and k get the
    same order, so attention scores are unchanged.
    """
    parts = [p.detach() for p in parts]
    dim_in = parts[0].shape[1]
    out = torch.empty(dim_in, sum(p.shape[0] for p in parts), dtype=parts[0].dtype, device=parts[0].device)
    col = 0
    for i, weight in enumerate(parts):
        n = weight.shape[0]
        dest = out[:, col : col + n]  # [in, n], a view
        src = weight.t()  # [in, n], a view
        if i < len(interleave):
            heads = interleave[i]
            half = n // heads // 2
            dest = dest.view(dim_in, heads, half, 2)  # adjacent pairs
            src = src.view(dim_in, heads, 2, half).transpose(2, 3)  # rotate-half pairs, as a view
        if scale is not None:
            torch.mul(src, scale.detach().view(-1, *([1] * (src.dim() - 1))), out=dest)
        else:
            dest.copy_(src)
        col += n
    return out


def _apply_rope(x: torch.Tensor, rope: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """x [S, N hd] (adjacent pairs) times rope [S, 1, hd/2] complex -> [S, N, hd] in x's dtype."""
    length = x.shape[0]
    pairs = x.float().view(length, heads, head_dim // 2, 2)  # [S, N, hd/2, 2]
    rotated = torch.view_as_real(torch.view_as_complex(pairs) * rope)  # [S, N, hd/2, 2]
    return rotated.view(length, heads, head_dim).to(x.dtype)
