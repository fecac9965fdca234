"""A random model of a real model's shapes written straight as a GGUF of a type's blocks: no quantizer.

For `chatcli bench --shape NAME --gguf-type TYPE` where llama.cpp's own quantizer cannot make the file: a
mixture of experts (Qwen3-30B-A3B would be a 61 GB F16 file first), or no llama-cpp-python here. Every
tensor's blocks are random codes and sub-block scales with small scales (finite weights of ~1e-2), in
the types llama.cpp's quantizer gives a file of TYPE (`tensor_type`: Q4_K_M's Q6_K for the output and, in
its `use_more_bits` layers, for attn_v and ffn_down / ffn_down_exps, Q4_K elsewhere, and for a model of 8
experts (Mixtral) Q8_0 attn_k / attn_v and Q5_K attn_output; MXFP4_MOE's MXFP4 experts and Q8_0 for every
other matrix; Q8_0 and F16 alike everywhere), the norms, biases, sinks and a mixture's router F32 as
llama.cpp leaves them. The architecture (`gguf_arch`): `llama` (Mixtral where it has experts), `qwen3moe`
(experts and no `gguf_arch`: q/k norms) or `gpt-oss` (biases, sinks, YaRN, every other layer sliding).
The tensors are written one at a time (`add_tensor_info` first, then each one's data in order), so the
peak memory is one tensor's. `fitting_layers` keeps as many layers as this machine's memory holds the file
of (and at most a shape's `max_file_gib`): a model read from disk at each token would time the disk. Speed,
not quality: the model says nothing. `python -m chatcli.bench.gguf_blocks SHAPE TYPE FILE` writes one file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def _f16(value: float) -> bytes:
    return np.float16(value).tobytes()


# ggml type: (values a block, bytes a block, {byte offset of a scale in the block: its bytes})
BLOCKS = {
    "Q4_K": (256, 144, {0: _f16(3e-5), 2: _f16(2e-4)}),  # d, dmin: d sc q - dmin m
    "Q5_K": (256, 176, {0: _f16(1.5e-5), 2: _f16(2e-4)}),  # d, dmin: d sc q - dmin m, q of 5 bits
    "Q6_K": (256, 210, {208: _f16(5e-6)}),  # d: d sc (q - 32)
    "Q8_0": (32, 34, {0: _f16(2e-4)}),  # d: d q
    "MXFP4": (32, 17, {0: bytes([119])}),  # e (E8M0): 2^(e - 127) v, v an E2M1 value (|v| <= 6)
}
FLOATS = {"F32": np.float32, "F16": np.float16}
TYPES = ("Q4_K_M", "Q8_0", "F16", "MXFP4_MOE")  # the --gguf-type values written here
MEMORY_SHARE = 0.4  # of this machine's memory, at most, the file's blocks take (fitting_layers)


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers that get more bits in the _M mixes (llama-quant.cpp)."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def tensor_type(gguf_type: str, name: str, n_layers: int, has_output: bool, experts: int = 0) -> str:
    """The type llama.cpp's quantizer gives a 2-D or 3-D tensor in a file of `gguf_type` (Q4_K_M: roughly)."""
    if gguf_type == "MXFP4_MOE":  # the experts MXFP4, every other matrix (the output's too) Q8_0
        return "MXFP4" if name.endswith("_exps.weight") else "Q8_0"
    if gguf_type != "Q4_K_M":
        return gguf_type
    if name == "output.weight" or (name == "token_embd.weight" and not has_output):
        return "Q6_K"
    parts = name.split(".")
    if parts[0] == "blk" and experts == 8 and parts[2] in ("attn_k", "attn_v", "attn_output"):
        return "Q5_K" if parts[2] == "attn_output" else "Q8_0"  # llama.cpp's choice for 8 experts (Mixtral)
    if parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down", "ffn_down_exps"):
        return "Q6_K" if use_more_bits(int(parts[1]), n_layers) else "Q4_K"
    return "Q4_K"


def gguf_arch(fields: dict) -> str:
    """The GGUF architecture a model of these fields is written as: `gguf_arch`, else qwen3moe with experts."""
    return fields.get("gguf_arch") or ("qwen3moe" if fields.get("num_experts") else "llama")


def shape_types(fields: dict) -> tuple[str, ...]:
    """The TYPES a model of these fields is written as: Q4_K_M where every row is whole super-blocks (not
    gpt-oss's 2,880), MXFP4_MOE where it has experts."""
    whole = all(shape[-1] % 256 == 0 for _name, shape, quantized in tensors(fields) if quantized)
    return tuple(t for t in TYPES if (t != "Q4_K_M" or whole) and (t != "MXFP4_MOE" or fields.get("num_experts")))


def tensors(fields: dict) -> list[tuple[str, tuple, bool]]:
    """(GGUF name, numpy shape [..., rows, k], quantized) of every tensor of a model of these config fields."""
    d, layers = fields["hidden_size"], fields["num_hidden_layers"]
    heads, kv = fields["num_attention_heads"], fields["num_key_value_heads"]
    hd = fields.get("head_dim") or d // heads
    experts, arch = fields.get("num_experts", 0), gguf_arch(fields)
    oai = arch == "gpt-oss"  # biases on attention, the router and the experts; sinks; its FFN norm's name
    out = [("token_embd.weight", (fields["vocab_size"], d), True)]
    for i in range(layers):
        b = f"blk.{i}."
        ffn_norm = "post_attention_norm" if oai else "ffn_norm"
        out += [(b + "attn_norm.weight", (d,), False), (b + ffn_norm + ".weight", (d,), False)]
        out += [(b + "attn_q.weight", (heads * hd, d), True), (b + "attn_k.weight", (kv * hd, d), True)]
        out += [(b + "attn_v.weight", (kv * hd, d), True), (b + "attn_output.weight", (d, heads * hd), True)]
        if oai:
            widths = (("q", heads * hd), ("k", kv * hd), ("v", kv * hd))
            out += [(b + f"attn_{x}.bias", (rows,), False) for x, rows in widths]
            out += [(b + "attn_output.bias", (d,), False), (b + "attn_sinks.weight", (heads,), False)]
        if experts:  # the router, the experts stacked [experts, rows, k]
            f = fields.get("moe_intermediate_size") or fields["intermediate_size"]
            if arch == "qwen3moe":
                out += [(b + "attn_q_norm.weight", (hd,), False), (b + "attn_k_norm.weight", (hd,), False)]
            out += [(b + "ffn_gate_inp.weight", (experts, d), False)]
            out += [(b + f"ffn_{x}_exps.weight", (experts, f, d), True) for x in ("gate", "up")]
            out += [(b + "ffn_down_exps.weight", (experts, d, f), True)]
            if oai:
                out += [(b + "ffn_gate_inp.bias", (experts,), False)]
                widths = (("gate", f), ("up", f), ("down", d))
                out += [(b + f"ffn_{x}_exps.bias", (experts, rows), False) for x, rows in widths]
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
    has_output, experts = not fields.get("tie_word_embeddings", True), fields.get("num_experts", 0)
    layers = fields["num_hidden_layers"]
    return sum(
        nbytes(tensor_type(gguf_type, name, layers, has_output, experts) if quantized else "F32", shape)
        for name, shape, quantized in tensors(fields)
    )


def memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fitting_layers(fields: dict, gguf_type: str, memory: int | None = None) -> int:
    """The most layers (at most the model's) whose file takes at most MEMORY_SHARE of `memory` (this machine's)
    and at most the shape's `max_file_gib`."""
    budget = min(MEMORY_SHARE * (memory or memory_bytes()), fields.get("max_file_gib", float("inf")) * 2**30)
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
        raw[:, at : at + len(value)] = np.frombuffer(value, np.uint8)
    return raw.reshape(*lead, k // per * size)


def write_random_blocks(fields: dict, path: Path, gguf_type: str, seed: int = 0) -> Path:
    """A random model of these config fields (`gguf_arch`: a llama's, a Mixtral's, a Qwen3-MoE's or a gpt-oss's)
    as a GGUF of `gguf_type` (`shape_types`) at `path`, its norms 1, a tensor at a time."""
    import gguf

    from chatcli.bench.gguf_write import finish_streamed, start_llama_gguf

    arch, experts = gguf_arch(fields), fields.get("num_experts", 0)
    w = start_llama_gguf(path, fields, gguf_type, arch=arch)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(fields["num_experts_per_tok"])
        if arch != "llama":  # Mixtral's experts are feed_forward_length wide
            w.add_expert_feed_forward_length(fields.get("moe_intermediate_size") or fields["intermediate_size"])
    if arch == "gpt-oss":  # every other layer sliding (llama.cpp's pattern for it), YaRN
        w.add_sliding_window(fields["sliding_window"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(fields["rope_factor"])
        w.add_rope_scaling_orig_ctx_len(fields["original_max_position_embeddings"])
    rng = np.random.default_rng(seed)
    has_output = not fields.get("tie_word_embeddings", True)
    layers = fields["num_hidden_layers"]
    chosen = []
    for name, shape, quantized in tensors(fields):
        kind = tensor_type(gguf_type, name, layers, has_output, experts) if quantized else "F32"
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


def main(argv: list[str]) -> int:
    """`python -m chatcli.bench.gguf_blocks SHAPE TYPE FILE`: the file `--shape SHAPE --gguf-type TYPE` runs on,
    kept (for `chatcli bench -m FILE --vs llama.cpp`), with the layers this machine's memory holds."""
    from chatcli.bench.shapes import CONTEXT, SHAPES

    if len(argv) != 3 or argv[0] not in SHAPES:
        print(f"usage: python -m chatcli.bench.gguf_blocks SHAPE TYPE FILE (SHAPE: {', '.join(SHAPES)})")
        return 2
    fields = {**SHAPES[argv[0]], "max_position_embeddings": CONTEXT}
    if argv[1] not in shape_types(fields):
        print(f"--shape {argv[0]} is written as {', '.join(shape_types(fields))}, not {argv[1]}")
        return 1
    layers = fields["num_hidden_layers"]
    fields["num_hidden_layers"] = fitting_layers(fields, argv[1])
    write_random_blocks(fields, Path(argv[2]), argv[1])
    size = Path(argv[2]).stat().st_size / 2**20
    print(f"{argv[2]}: a random {argv[0]}, {fields['num_hidden_layers']} of its {layers} layers, {size:,.0f} MiB")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
