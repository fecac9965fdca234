"""The lean forward for the lean families (`families`: Llama, Mistral, Qwen2/3, Phi-3, Gemma 2/3, SmolLM3,
Granite, OLMo 2) on torch: the same weights, less machinery.

transformers' forward is general. On two CPU cores its per-step overhead (module
calls, cache bookkeeping, mask building, unfused projections) was about a quarter of
a SmolLM2-135M decode step. This runner does only what a Llama decoder needs, in the
style of gpt-fast, over a lean file's tensors (`weights.lean_file`: fused, transposed,
norm-folded, rope-ordered, memory-mapped; torch views of the mapping, no copies on the CPU):

- a preallocated KV cache per conversation, `[L, KV, capacity, hd]`, written in place
  at an explicit position (`lean_cache.LeanCache`); it may be kept in another dtype than
  the weights (`kv_dtype`: bf16 on CPUs with bf16 matmuls), and attention then runs in it;
- `x @ W_t` on the stored `w_t [k, n]` (it beats `F.linear` on the CPU);
- logits for the last position only;
- two paths: `prefill` (a chunk of positions, causal mask with an offset) and
  `decode_one_token` (one position: no mask, transposes or copies, beyond a few views);
- for `--quantize int8`, int8 projections in decode steps only (`Projection.decode`, torch's
  fbgemm kernels over the int8 lean file's weights); prefill keeps the dense weights.

A family's extras (`LeanConfig`: q/k/v biases, q/k norms, sliding windows, a second rope table or none,
sandwich norms or norms on the outputs alone, GeGLU, soft-capped scores and logits, residual and logit
scales) are a few more ops where the model has them and none where it has not.

This is the path where the compiled kernel cannot run (no AVX2, no compiler, a GPU,
bf16 weights); where it can, `native.NativeRunner` runs the same lean tensors without torch.
Models it cannot run exactly fall back to `HFRunner` (see `weights.families.lean_support`).
The tests check that it gives the HF reference's greedy tokens and logits within tolerance
over multi-turn conversations with crops.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from chatcli.engine.kv.cache import KVCache
from chatcli.engine.runners.base import ModelRunner
from chatcli.engine.runners.lean_cache import LeanCache
from chatcli.engine.runners.torch_state import logits_out
from chatcli.engine.weights.lean_file import PROJECTIONS, VECTORS, LeanWeights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def mapped(weights: LeanWeights, name: str, device) -> torch.Tensor:
    """A tensor of the lean file: a view of the mapping on the CPU (never written), a copy elsewhere."""
    info = weights.file.tensors[name]
    with warnings.catch_warnings():  # the mapping is read-only; torch warns that it cannot be written
        warnings.simplefilter("ignore")
        tensor = torch.from_numpy(weights.array(name))
    if info.dtype == "BF16":
        tensor = tensor.view(torch.bfloat16)
    return tensor if torch.device(device).type == "cpu" else tensor.to(device)


class Projection:
    """A projection with its weight stored transposed: `x [S, in] @ w_t [in, out]`.

    With `decode`, single-row inputs (decode steps) go to that projection instead (int8
    weights: a quarter of the bytes, and a decode step is bound by the bytes it reads).
    """

    def __init__(self, w_t: torch.Tensor | None, decode=None) -> None:  # w_t: [in, out], contiguous
        self.w_t = w_t
        self.decode = decode

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.decode is not None and (x.shape[0] == 1 or self.w_t is None):
            return self.decode(x)
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
    rope: torch.Tensor | None = None  # [T, 1, hd/2] complex: this layer's table (None: not rotated, SmolLM3)
    window: int = 0  # positions attended at most (0: all)
    qkv_bias: torch.Tensor | None = None  # [(H + 2 KV) hd]
    q_norm: torch.Tensor | None = None  # [hd]
    k_norm: torch.Tensor | None = None  # [hd]
    post_attn_norm: torch.Tensor | None = None  # [D]
    post_ffn_norm: torch.Tensor | None = None  # [D]


class LeanRunner(ModelRunner):
    """A `ModelRunner` over a dense lean file (and, for int8 decode steps, an int8 one), on torch."""

    kernel_off = "the lean runner on torch"  # the loader says why (`load.lean`)

    def __init__(
        self, weights: LeanWeights, device="cpu", kv_dtype: torch.dtype | None = None, int8: LeanWeights | None = None
    ) -> None:
        """`weights`: a `<dtype>-dense` lean file; `kv_dtype`: the cache's dtype (default the weights');
        `int8`: an int8 lean file of the same model, whose weights then run the decode steps."""
        c = weights.config
        if not c.kind.endswith("-dense"):
            raise ValueError(f"the torch lean runner reads a dense lean file, not {c.kind}")
        self.config = c
        self.context_limit = c.positions
        self.device = torch.device(device)
        self.dtype = DTYPES[c.weights]
        self.kv_dtype = kv_dtype or self.dtype  # the cache's dtype; attention runs in it
        self.quantized = int8 is not None
        self.heads, self.kv_heads, self.head_dim, self.hidden = c.heads, c.kv_heads, c.head_dim, c.hidden
        self.eps = c.eps
        self._weights = [w for w in (weights, int8) if w is not None]  # the mappings stay open
        tensor = lambda name: mapped(weights, name, device)  # noqa: E731
        self.embed = tensor("embed")  # [V, D] fp32
        decode = _int8_projections(int8) if int8 is not None else {}
        names = {c.rope_name(i) for i in range(c.layers)} - {None}  # None: a layer that rotates nothing (SmolLM3)
        ropes = {None: None, **{name: torch.view_as_complex(tensor(name))[:, None, :] for name in names}}
        vectors = c.vectors()
        self.layers = []
        for i in range(c.layers):
            projections = [Projection(tensor(f"layers.{i}.{p}"), decode.get(f"layers.{i}.{p}")) for p in PROJECTIONS]
            extras = {}  # in the weights' dtype, as transformers holds them; norms then multiply in fp32
            for name in VECTORS:
                if (key := f"layers.{i}.{name}") in vectors:
                    vector = tensor(key)[: vectors[key]].to(self.dtype)
                    extras[name] = vector if name == "qkv_bias" else vector.float()
            self.layers.append(LeanLayer(*projections, rope=ropes[c.rope_name(i)], window=c.layer_window(i), **extras))
        # [1, D] -> [1, V]: only ever the last position, so a quantized model keeps no dense head
        self.head = Projection(None, decode["head"]) if decode else Projection(tensor("head"))
        self.scale, self.softcap, self.final_softcap = c.scale, c.attn_softcap, c.final_softcap
        self.pre_norms, self.qk_norm_whole = c.pre_norms, c.qk_norm_whole
        self.residual_scale, self.logits_scaling = c.residual_scale, c.logits_scaling
        self.act = F.silu if c.act == "silu" else partial(F.gelu, approximate="tanh")

    def files(self) -> list:
        return [w.file.path for w in self._weights]

    def new_cache(self) -> LeanCache:
        c = self.config
        return LeanCache(
            c.layers, c.kv_heads, c.head_dim, self.context_limit, self.kv_dtype, self.device, c.window, c.sliding
        )

    @property
    def weight_bytes(self) -> int:
        """The weight bytes one decode step reads (the bound on decode speed)."""
        total = 0
        for layer in self.layers:
            total += sum(p.decode_nbytes for p in (layer.qkv, layer.out, layer.gate_up, layer.down))
        return total + self.head.decode_nbytes

    @torch.inference_mode()  # thread-local: entered in whichever thread runs the step
    def forward(self, ids: list[int], cache: KVCache):
        if not ids:
            raise ValueError("forward needs at least one id")
        end = len(cache.ids) + len(ids)
        if end > self.context_limit:
            raise ValueError(f"{end} positions exceed the context limit {self.context_limit}")
        return logits_out(self._run(ids, cache, every=False)[-1])  # [V]

    @torch.inference_mode()
    def verify(self, ids: list[int], cache: KVCache):
        """A few ids -> logits [S, V] of each (a draft to check; see `ModelRunner.verify`)."""
        start, end = len(cache.ids), len(cache.ids) + len(ids)
        if not ids or end > self.context_limit:
            raise ValueError(f"verify needs 1..{self.context_limit - start} ids, got {len(ids)}")
        rows = self._run(ids, cache, every=True)
        return logits_out(rows[0] if len(rows) == 1 else torch.cat(rows))  # [S, V]

    def _run(self, ids: list[int], cache: KVCache, every: bool) -> list[torch.Tensor]:
        """Feed `ids` in pieces (`_pieces`), each written into the cache at its position: per piece, the
        logits `[S, V]` of each of its positions (`every`), else `[V]` of its last."""
        assert isinstance(cache, LeanCache)
        out = []
        for piece in _pieces(ids, cache):
            start = len(cache.ids)
            cache.reserve(start + len(piece))
            tokens = torch.tensor(piece, dtype=torch.long, device=self.device)  # [S]
            if len(piece) == 1:
                logits = self.decode_one_token(tokens, cache, start)  # [V]
                out.append(logits[None] if every else logits)  # [1, V] or [V]
            else:
                out.append(self.prefill(tokens, cache, start, every=every))  # [S, V] or [V]
            cache.ids.extend(piece)
        return out

    def prefill(self, tokens: torch.Tensor, cache: LeanCache, start: int, every: bool = False) -> torch.Tensor:
        """tokens [S] at positions start.. (written into each layer's part of the cache) -> logits [V] of the
        last; `every`: logits [S, V] of each position."""
        x = self._trunk(tokens, cache, start)  # [S, D]
        if every:
            return self._cap(self.head(self._norm(x)).float())  # [S, V]
        return self._cap(self.head(self._norm(x[-1:]))[0].float())  # [V]

    @torch.inference_mode()
    def hidden_states(self, batch: list[list[int]]) -> list:
        """`ModelRunner.hidden_states`: each sequence through the layers on a cache of its own, normalised and
        times the final norm's weight (folded into the head in a dense file: read where it is, `final_norm`)."""
        out = []
        for ids in batch:
            cache, rows = self.new_cache(), []
            for piece in _pieces(ids, cache):
                start = len(cache.ids)
                cache.reserve(start + len(piece))
                x = self._trunk(torch.tensor(piece, dtype=torch.long, device=self.device), cache, start)
                rows.append(self._norm(x.float()) * self.final_norm)
                cache.ids.extend(piece)
            out.append(torch.cat(rows).cpu().numpy())  # [S, D]
        return out

    @functools.cached_property
    def final_norm(self) -> torch.Tensor:
        """The final norm's weight [D] fp32 (ones where neither the file nor its source has it)."""
        from chatcli.engine.weights.final_norm import final_norm

        found = final_norm(self._weights[0])
        return torch.ones(self.hidden) if found is None else torch.from_numpy(found.copy())

    def _trunk(self, tokens: torch.Tensor, cache: LeanCache, start: int) -> torch.Tensor:
        """tokens [S] at positions start.. through every layer (their keys and values into the cache) ->
        the last hidden states [S, D], before the final norm."""
        length = tokens.shape[0]
        end = start + length
        x = self.embed[tokens].to(self.dtype)  # [S, D]
        masks: dict[tuple, torch.Tensor | None] = {}  # by window and first position held: shared by layers
        for i, layer in enumerate(self.layers):
            k_cache, v_cache, base = cache.part(i)
            if (layer.window, base) not in masks:
                masks[layer.window, base] = self._mask(start, end, layer.window, k_cache.dtype, base)
            h = self._attention(layer, self._pre(x), k_cache, v_cache, base, start, masks[layer.window, base])
            x = x + self._post(h, layer.post_attn_norm)  # [S, D]
            x = x + self._post(self._mlp(layer, x), layer.post_ffn_norm)  # [S, D]
        return x

    def _mask(self, start: int, end: int, window: int, dtype, base: int = 0) -> torch.Tensor | None:
        """Rows start..end over columns base..end: causal (None where SDPA's own causal mask is it), and
        within the window; additive, in the cache's dtype (SDPA would convert a bool mask in every layer)."""
        if start == 0 and not window and not self.softcap:
            return None
        cols = torch.arange(base, end, device=self.device)  # [T]
        rows = torch.arange(start, end, device=self.device)[:, None]  # [S, 1]
        allowed = cols[None, :] <= rows  # [S, T]
        if window:
            allowed &= cols[None, :] > rows - window
        return torch.zeros(allowed.shape, dtype=dtype, device=self.device).masked_fill_(~allowed, float("-inf"))

    def decode_one_token(self, token: torch.Tensor, cache: LeanCache, pos: int) -> torch.Tensor:
        """token [1] at position pos -> logits [V]: `prefill` for one row, with no mask, transposes or copies."""
        heads, hd = self.heads, self.head_dim
        x = self.embed[token].to(self.dtype)  # [1, D]
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(self._pre(x))  # [1, (H+2KV) hd]
            rope = None if layer.rope is None else layer.rope[pos : pos + 1]
            q, k, v = self._qkv(layer, qkv, rope)  # [1, H, hd], [1, KV, hd] x2
            k_cache, v_cache, base = cache.part(i)  # [KV, cap, hd] x2 holding positions base..
            k_cache[:, pos - base] = k[0]  # [KV, hd]
            v_cache[:, pos - base] = v[0]  # [KV, hd]
            first = max(0, pos + 1 - layer.window) - base if layer.window else 0
            last = pos + 1 - base
            out = self._attend(
                q.view(1, heads, 1, hd), k_cache[None, :, first:last], v_cache[None, :, first:last]
            ).view(1, heads * hd)  # [1, H hd]
            if out.dtype != x.dtype:
                out = out.to(x.dtype)
            x = x + self._post(layer.out(out), layer.post_attn_norm)  # [1, D]
            x = x + self._post(self._mlp(layer, x), layer.post_ffn_norm)  # [1, D]
        return self._cap(self.head(self._norm(x))[0].float())  # [V]

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm without its weight (folded into the next projection), in fp32 like transformers."""
        xf = x if x.dtype == torch.float32 else x.float()  # [S, D]
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed if normed.dtype == x.dtype else normed.to(x.dtype)

    def _pre(self, x: torch.Tensor) -> torch.Tensor:
        """A block's input: normalised (`_norm`), or as it is where the family norms outputs alone (OLMo 2)."""
        return self._norm(x) if self.pre_norms else x

    def _post(self, h: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        """A block's output, through its sandwich norm where the family has one (Gemma, OLMo 2), times the
        residual scale where it has one (Granite)."""
        h = h if weight is None else _rms_norm_times(h.float(), weight, self.eps).to(h.dtype)
        return h if self.residual_scale == 1.0 else h * self.residual_scale

    def _cap(self, logits: torch.Tensor) -> torch.Tensor:
        """Final logit soft-capping (Gemma 2): cap * tanh(logits / cap); Granite's logits / its scaling."""
        if self.logits_scaling != 1.0:
            logits = logits / self.logits_scaling
        if not self.final_softcap:
            return logits
        return torch.tanh(logits / self.final_softcap) * self.final_softcap

    def _mlp(self, layer: LeanLayer, x: torch.Tensor) -> torch.Tensor:
        gate, up = layer.gate_up(self._pre(x)).chunk(2, -1)  # [S, F] each
        return layer.down(self.act(gate).mul_(up))  # [S, D]

    def _qkv(self, layer: LeanLayer, qkv: torch.Tensor, rope: torch.Tensor):
        """qkv [S, (H+2KV) hd] -> q [S, H, hd], k [S, KV, hd] (bias, q/k norms, rope; in the cache's dtype
        for k), v [S, KV, hd]."""
        length = qkv.shape[0]
        heads, kv_heads, hd = self.heads, self.kv_heads, self.head_dim
        if layer.qkv_bias is not None:
            qkv = qkv + layer.qkv_bias
        n_qk = (heads + kv_heads) * hd
        qk = qkv[:, :n_qk].float().view(length, heads + kv_heads, hd)  # [S, H+KV, hd]
        if layer.q_norm is not None and self.qk_norm_whole:  # OLMo 2: over all of q, and all of k
            q_all = _rms_norm_times(qk[:, :heads].reshape(length, heads * hd), layer.q_norm, self.eps)
            k_all = _rms_norm_times(qk[:, heads:].reshape(length, kv_heads * hd), layer.k_norm, self.eps)
            qk = torch.cat([q_all, k_all], 1).view(length, heads + kv_heads, hd)
        elif layer.q_norm is not None:
            qk = torch.cat(
                [
                    _rms_norm_times(qk[:, :heads], layer.q_norm, self.eps),
                    _rms_norm_times(qk[:, heads:], layer.k_norm, self.eps),
                ],
                1,
            )
        if rope is not None:
            pairs = qk.view(length, heads + kv_heads, hd // 2, 2)
            qk = torch.view_as_real(torch.view_as_complex(pairs) * rope).view(length, heads + kv_heads, hd)
        qk = qk.to(qkv.dtype)
        v = qkv[:, n_qk:].view(length, kv_heads, hd)  # [S, KV, hd]
        return qk[:, :heads], qk[:, heads:], v

    def _attend(self, q, k, v, mask=None, causal=False) -> torch.Tensor:
        """q [1, H, S, hd] over k, v [1, KV, T, hd] -> [1, H, S, hd], in the cache's dtype."""
        if q.dtype != k.dtype:
            q = q.to(k.dtype)
        gqa = self.heads != self.kv_heads
        if not self.softcap:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale, enable_gqa=gqa
            )
        if gqa:  # soft-capped scores: SDPA has no hook for them, so the product is spelled out
            k = k.repeat_interleave(self.heads // self.kv_heads, 1)
            v = v.repeat_interleave(self.heads // self.kv_heads, 1)
        scores = torch.tanh((q @ k.transpose(-1, -2)).float() * (self.scale / self.softcap)) * self.softcap
        if mask is not None:
            scores = scores + mask.float()
        return torch.softmax(scores, -1).to(v.dtype) @ v

    def _attention(self, layer: LeanLayer, h, k_cache, v_cache, base, start, mask):
        """h [S, D] -> [S, D]; writes positions start.. of this layer's k_cache/v_cache [KV, cap, hd], which
        hold positions base.. (0 but for a sliding layer's strip)."""
        length = h.shape[0]
        end = start + length
        heads, hd = self.heads, self.head_dim
        rope = None if layer.rope is None else layer.rope[start:end]
        q, k, v = self._qkv(layer, layer.qkv(h), rope)  # [S, H, hd], [S, KV, hd] x2
        k_cache[:, start - base : end - base] = k.transpose(0, 1)
        v_cache[:, start - base : end - base] = v.transpose(0, 1)
        keys, values = k_cache[None, :, : end - base], v_cache[None, :, : end - base]  # [1, KV, T, hd]
        out = self._attend(q.transpose(0, 1)[None], keys, values, mask, causal=mask is None)  # [1, H, S, hd]
        return layer.out(out[0].transpose(0, 1).reshape(length, heads * hd).to(self.dtype))  # [S, D]


def _pieces(ids: list[int], cache: LeanCache) -> list[list[int]]:
    """ids in the pieces a forward takes: as many as a cache's sliding strip has room for."""
    room = cache.strip.room if cache.strip is not None else len(ids)
    return [ids[i : i + room] for i in range(0, len(ids), room)]


def _rms_norm_times(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of fp32 x times a weight that cannot be folded: each head's q/k norm
    (Qwen3, Gemma 3: x [S, N, hd], weight [hd]), all of q or k (OLMo 2: x [S, N hd]) or a sandwich norm
    (Gemma, OLMo 2: x [S, D], weight [D])."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _int8_projections(int8: LeanWeights) -> dict:
    """Every projection of an int8 lean file as torch's fbgemm int8 linear (`quantize.Int8Dense`)."""
    from chatcli.engine.weights.layouts import unpack_int8
    from chatcli.engine.weights.quantize import Int8Dense

    out = {}
    for name, (k, n) in int8.config.shapes().items():
        packed = torch.from_numpy(int8.array(f"{name}.w").copy())
        scale = torch.from_numpy(int8.array(f"{name}.scale")[:n].copy())
        out[name] = Int8Dense.from_int8(unpack_int8(packed, n, k), scale)
    return out
