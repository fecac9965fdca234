"""A random model of a real model's shapes written straight as a GGUF of a type's blocks: no quantizer.

For `chatcli bench --shape NAME --gguf-type TYPE` where llama.cpp's own quantizer cannot make the file: a
mixture of experts (Qwen3-30B-A3B would be a 61 GB F16 file first), or no llama-cpp-python here. Every
tensor's blocks are random codes and sub-block scales with small fp16 scales (finite weights of ~1e-2), in
the types llama.cpp's quantizer gives a file of TYPE (`tensor_type`: Q4_K_M's Q6_K for the output and, in
its `use_more_bits` layers, for attn_v and ffn_down / ffn_down_exps, Q4_K elsewhere; Q8_0 and F16 alike
everywhere), the norms and a mixture's router F32 as llama.cpp leaves them. The tensors are written one at
a time (`add_tensor_info` first, then each one's data in order), so the peak memory is one tensor's.
`fitting_layers` keeps as many layers as this machine's memory holds the file of: a model read from disk at
each token would time the disk. Speed, not quality: the model says nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

# ggml type: (values a block, bytes a block, {byte offset of an fp16 scale in the block: its value})
BLOCKS = {
    "Q4_K": (256, 144, {0: 3e-5, 2: 2e-4}),  # d, dmin: d sc q - dmin m
    "Q6_K": (256, 210, {208: 5e-6}),  # d: d sc (q - 32)
    "Q8_0": (32, 34, {0: 2e-4}),  # d: d q
}
FLOATS = {"F32": np.float32, "F16": np.float16}
TYPES = ("Q4_K_M", "Q8_0", "F16")  # the --gguf-type values written here
MEMORY_SHARE = 0.4  # of this machine's memory, at most, the file's blocks take (fitting_layers)


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers that get more bits in the _M mixes (llama-quant.cpp)."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def tensor_type(gguf_type: str, name: str, n_layers: int, has_output: bool) -> str:
    """The type llama.cpp's quantizer gives a 2-D or 3-D tensor in a file of `gguf_type` (Q4_K_M: roughly)."""
    if gguf_type != "Q4_K_M":
        return gguf_type
    if name == "output.weight" or (name == "token_embd.weight" and not has_output):
        return "Q6_K"
    parts = name.split(".")
    if parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down", "ffn_down_exps"):
        return "Q6_K" if use_more_bits(int(parts[1]), n_layers) else "Q4_K"
    return "Q4_K"


def tensors(fields: dict) -> list[tuple[str, tuple, bool]]:
    """(GGUF name, numpy shape [..., rows, k], quantized) of every tensor of a model of these config fields."""
    d, layers = fields["hidden_size"], fields["num_hidden_layers"]
    heads, kv = fields["num_attention_heads"], fields["num_key_value_heads"]
    hd = fields.get("head_dim") or d // heads
    experts = fields.get("num_experts", 0)
    out = [("token_embd.weight", (fields["vocab_size"], d), True)]
    for i in range(layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (d,), False), (b + "ffn_norm.weight", (d,), False)]
        out += [(b + "attn_q.weight", (heads * hd, d), True), (b + "attn_k.weight", (kv * hd, d), True)]
        out += [(b + "attn_v.weight", (kv * hd, d), True), (b + "attn_output.weight", (d, heads * hd), True)]
        if experts:  # Qwen3-MoE: q/k norms, the router, the experts stacked
            f = fields["moe_intermediate_size"]
            out += [(b + "attn_q_norm.weight", (hd,), False), (b + "attn_k_norm.weight", (hd,), False)]
            out += [(b + "ffn_gate_inp.weight", (experts, d), False)]
            out += [(b + f"ffn_{x}_exps.weight", (experts, f, d), True) for x in ("gate", "up")]
            out += [(b + "ffn_down_exps.weight", (experts, d, f), True)]
        else:
            f = fields["intermediate_size"]
            out += [(b + "ffn_gate.weight", (f, d), True), (b + "ffn_up.weight", (f, d), True)]
            out += [(b + "ffn_down.weight", (d, f), True)]
    out.append(("output_norm.weight", (d,), False))
    if not fields.get("tie_word_embeddings", True):
        out.append(("output.weight", (fields["vocab_size"], d), True))
    return out


def nbytes(type_name: str, shape: tuple) -> int:
    count = int(np.prod(shape))
    if type_name in FLOATS:
        return count * np.dtype(FLOATS[type_name]).itemsize
    per, size, _ = BLOCKS[type_name]
    return count // per * size


def file_bytes(fields: dict, gguf_type: str) -> int:
    """The tensors' bytes of such a file."""
    has_output = not fields.get("tie_word_embeddings", True)
    layers = fields["num_hidden_layers"]
    return sum(
        nbytes(tensor_type(gguf_type, name, layers, has_output) if quantized else "F32", shape)
        for name, shape, quantized in tensors(fields)
    )


def memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fitting_layers(fields: dict, gguf_type: str, memory: int | None = None) -> int:
    """The most layers (at most the model's) whose file takes at most MEMORY_SHARE of `memory` (this machine's)."""
    budget = MEMORY_SHARE * (memory or memory_bytes())
    layers = fields["num_hidden_layers"]
    while layers > 1 and file_bytes({**fields, "num_hidden_layers": layers}, gguf_type) > budget:
        layers -= 1
    return layers


def random_data(rng: np.random.Generator, type_name: str, shape: tuple) -> np.ndarray:
    """Random weights of `shape` as `type_name`: floats of ~1e-2, or valid blocks (random codes and sub-block
    scales, the fp16 scales BLOCKS gives) as bytes [..., rows, row bytes]."""
    if type_name in FLOATS:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(FLOATS[type_name])
    per, size, scales = BLOCKS[type_name]
    *lead, k = shape
    blocks = int(np.prod(lead)) * (k // per)
    raw = np.frombuffer(rng.bytes(blocks * size), np.uint8).reshape(blocks, size).copy()
    for at, value in scales.items():
        raw[:, at : at + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return raw.reshape(*lead, k // per * size)


def write_random_blocks(fields: dict, path: Path, gguf_type: str, seed: int = 0) -> Path:
    """A random model of these config fields (a llama's, or with `num_experts` a Qwen3-MoE's) as a GGUF of
    `gguf_type` (`TYPES`) at `path`, its norms 1, a tensor at a time."""
    import gguf

    from chatcli.bench.gguf_write import finish_streamed, start_llama_gguf

    arch = "qwen3moe" if fields.get("num_experts") else "llama"
    w = start_llama_gguf(path, fields, gguf_type, arch=arch)
    if arch == "qwen3moe":
        w.add_expert_count(fields["num_experts"])
        w.add_expert_used_count(fields["num_experts_per_tok"])
        w.add_expert_feed_forward_length(fields["moe_intermediate_size"])
    rng = np.random.default_rng(seed)
    has_output = not fields.get("tie_word_embeddings", True)
    layers = fields["num_hidden_layers"]
    chosen = []
    for name, shape, quantized in tensors(fields):
        kind = tensor_type(gguf_type, name, layers, has_output) if quantized else "F32"
        chosen.append((name, shape, kind))
        raw = None if kind in FLOATS else gguf.GGMLQuantizationType[kind]
        dtype = np.dtype(FLOATS.get(kind, np.uint8))
        byte_shape = shape if raw is None else (*shape[:-1], shape[-1] // BLOCKS[kind][0] * BLOCKS[kind][1])
        w.add_tensor_info(name, byte_shape, dtype, nbytes(kind, shape), raw_dtype=raw)

    def data(name: str, shape: tuple, kind: str) -> np.ndarray:
        if name.endswith("norm.weight"):
            return np.ones(shape, np.float32)
        return random_data(rng, kind, shape)

    finish_streamed(w, (data(*entry) for entry in chosen))
    return path
