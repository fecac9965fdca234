"""Transformers causal LMs written as GGUF files, as llama.cpp's own converter would write them, with any tensor types.

`write_gguf(model, path, types)` covers the families "llama" (tied or untied embeddings, q/k/v
biases if the model has them), "qwen2" (q/k/v biases), "qwen3" (q/k norms), "gemma2" and
"gemma3_text" (GGUF's `gemma3`: its norms written as 1 + w, as llama.cpp's converter writes
Gemma's, the sandwich norms as `post_attention_norm` / `post_ffw_norm`, the soft-capping and the
sliding window as metadata, Gemma 3's sliding base as `rope.freq_base_swa`), "smollm3", "granite" and
"granitemoe" (llama's q/k permutation; Granite's multipliers as `embedding_scale`, `residual_scale`,
`attention.scale` and `logit_scale`; GraniteMoE's experts as Mixtral's, its fused `input_linear`, transformers'
`gate_up_proj`, split into gate and up as llama.cpp's converter splits it), "olmo2" (no attn_norm / ffn_norm,
its output norms as `post_attention_norm` / `post_ffw_norm`, its q/k norms over all of q and of k), "olmo3"
(GGUF's `olmo2` with `attention.sliding_window` and each layer's flag in `attention.sliding_window_pattern`,
YaRN on its full layers as `rope.scaling.*`) and "phi3" (its fused
`attn_qkv` and `ffn_up`, `rope.dimension_count` its rotated dims; LongRoPE's factors as
`rope_factors_short` / `_long` with `rope.scaling.attn_factor`, as llama.cpp's converter writes them). Like
convert_hf_to_gguf.py it writes the architecture's metadata keys (`{arch}.context_length`, ...;
`attention.key_length` / `value_length` only where the config has a `head_dim`, as real Llama and
Qwen3 configs do and Qwen2 configs do not; `rope.dimension_count` for llama only), llama.cpp's
tensor names, norms and biases as F32, and for llama q and k rows permuted as its `LlamaModel.permute`
does (llama.cpp's NORM rope pairs dims (2i, 2i + 1), transformers' (i, i + hd/2)); qwen2 / qwen3
are not permuted (llama.cpp runs them with NEOX rope, transformers' pairing).

The 2-D weights get the type `types(name, shape)` names (`shape` the numpy shape `[out, in]`), with
llama.cpp's fallbacks where a K-quant does not fit the width (`llama_tensor_get_type`: Q4_K -> Q5_0,
Q5_K -> Q5_1, Q6_K -> Q8_0; Q2_K / Q3_K -> Q4_0 here, llama.cpp takes IQ4_NL, which `gguf` cannot
quantize) and the converter's F16 where even that does not fit. K-quants are made by
`tests.kquants` (a simple scheme, not llama.cpp's rounding search), the rest by `gguf`.

The tokenizer is the embedded SmolLM2 GGUF's, as in chatcli/bench/gguf_write.py: its tokens, types
and merges, padded with unused tokens up to the model's vocabulary or cut down to it (then only the
merges whose parts and result survive are kept), its special ids that fit, and its chat template.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch

from chatcli.bench.gguf_blocks import use_more_bits
from tests import kquants

FAMILIES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "qwen3_moe", "mixtral", "smollm3", "granite")
FAMILIES += ("olmo2", "olmo3", "granitemoe")
LLAMA_LIKE = ("llama", "mixtral", "smollm3", "granite", "granitemoe")  # llama.cpp's converter permutes q/k (NORM rope)
# transformers' model_type -> GGUF's architecture, where they differ (Mixtral is a llama with experts)
# (OLMo 3 is an olmo2 with windows)
GGUF_ARCH = {"gemma3_text": "gemma3", "qwen3_moe": "qwen3moe", "mixtral": "llama", "olmo3": "olmo2"}
MOE = ("qwen3_moe", "mixtral", "granitemoe")
GRANITE = ("granite", "granitemoe")  # their multipliers

# llama.cpp's replacement for a K-quant when a row is not a multiple of 256 wide
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0"}

TypeChooser = Callable[..., str]


def Q4_K_M(name: str, shape: tuple[int, ...], *, n_layers: int | None = None, has_output: bool = True) -> str:
    """Roughly llama.cpp's Q4_K_M mix (`llama_tensor_get_type`): Q6_K for output.weight (token_embd when
    the embeddings are tied, `has_output` False), Q6_K for attn_v and ffn_down in llama.cpp's
    `use_more_bits` layers (the first and last eighth and every third between; needs `n_layers`,
    which `write_gguf` passes, else those stay Q4_K), Q4_K elsewhere. An approximation: llama.cpp's
    special cases (70B, MoE, Falcon, fused qkv, ...) are left out."""
    del shape
    if name == "output.weight" or (name == "token_embd.weight" and not has_output):
        return "Q6_K"
    match = re.match(r"blk\.(\d+)\.(attn_v|ffn_down|ffn_down_exps)\.weight$", name)
    if match and n_layers is not None and use_more_bits(int(match.group(1)), n_layers):
        return "Q6_K"
    return "Q4_K"


Q4_K_M.file_type = "MOSTLY_Q4_K_M"


def uniform(type_name: str) -> TypeChooser:
    """Every 2-D weight of `type_name` (fallbacks aside)."""

    def choose(name: str, shape: tuple[int, ...]) -> str:
        return type_name

    choose.file_type = _file_type_of(type_name)
    return choose


def tensor_type(types: TypeChooser | str, name: str, shape: tuple[int, ...], n_layers: int, has_output: bool) -> str:
    """The type `name` is written with: 1-D always F32; else what `types` asks (given `n_layers` /
    `has_output` if it takes them), falling back as llama.cpp does where the width does not fit."""
    import gguf

    if len(shape) < 2 or ".ffn_gate_inp." in name:  # llama.cpp's quantizer leaves the router F32
        return "F32"
    chooser = uniform(types) if isinstance(types, str) else types
    wants = inspect.signature(chooser).parameters
    extra = {key: value for key, value in (("n_layers", n_layers), ("has_output", has_output)) if key in wants}
    chosen = chooser(name, tuple(shape), **extra)
    width = shape[-1]
    if chosen in FALLBACK and width % kquants.QK_K:
        chosen = FALLBACK[chosen]
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[chosen]][0]
    if width % block:
        chosen = "F16"  # the converter's own fallback (a QuantError there)
    return chosen


def write_gguf(
    model,
    path: Path | str,
    types: TypeChooser | str = "F32",
    *,
    file_type: str | None = None,
    split_max_tensors: int = 0,
) -> Path:
    """`model` (a transformers causal LM of `FAMILIES`) as a GGUF file at `path`, its 2-D weights of the
    types `types` chooses (a callable `(name, shape) -> type name`, or one type name for all).
    `split_max_tensors`: split into parts of at most that many tensors, as `llama-gguf-split --split-max-tensors`
    does (gguf's writer: `PATH_STEM-00001-of-0000N.gguf` …, the metadata in the first); the first part's path.

    `general.file_type` is `file_type` (a `gguf.LlamaFileType` name), else the chooser's `file_type`
    attribute (`Q4_K_M`'s, `uniform`'s), else the type that holds most of the weights."""
    import gguf

    config = model.config
    arch = config.model_type
    if arch not in FAMILIES:
        raise ValueError(f"write_gguf writes {', '.join(FAMILIES)}, not {arch}")
    rope = getattr(config, "rope_parameters", None) or {}
    sliding_rope = rope.get("sliding_attention", {})  # Gemma 3: a rope per layer type
    rope = rope.get("full_attention", rope)
    longrope = rope if rope.get("rope_type") == "longrope" else None
    yarn = rope if rope.get("rope_type") == "yarn" else None
    if rope.get("rope_type", "default") not in ("default", "longrope", "yarn"):
        raise ValueError(f"write_gguf writes the default rope only, not {rope.get('rope_type')}")
    rope_theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // heads
    n_layers = config.num_hidden_layers
    vocab = config.vocab_size
    has_output = not config.tie_word_embeddings

    tensors = list(_tensors(model, arch, heads, kv_heads))
    chosen = {name: tensor_type(types, name, array.shape, n_layers, has_output) for name, array in tensors}

    path = Path(path)
    gguf_arch = GGUF_ARCH.get(arch, arch)
    w = gguf.GGUFWriter(str(path), gguf_arch, split_max_tensors=split_max_tensors)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("chatcli-test")
    w.add_block_count(n_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    if arch in MOE:  # as llama.cpp's converter: the experts' count, those a token takes, (Qwen3-MoE) their width
        w.add_expert_count(getattr(config, "num_experts", None) or config.num_local_experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        if arch == "qwen3_moe":
            w.add_expert_feed_forward_length(config.moe_intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(float(rope_theta))
    w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    if "head_dim" in config.to_dict():
        w.add_key_length(hd)
        w.add_value_length(hd)
    if gguf_arch in LLAMA_LIKE:
        w.add_vocab_size(vocab)
        w.add_rope_dimension_count(hd)
    if arch in GRANITE:  # as llama.cpp's converter writes Granite's multipliers
        w.add_embedding_scale(config.embedding_multiplier)
        w.add_residual_scale(config.residual_multiplier)
        w.add_attention_scale(config.attention_multiplier)
        w.add_logit_scale(config.logits_scaling)
    if arch.startswith("gemma"):
        w.add_sliding_window(config.sliding_window)
    if arch == "olmo3":  # as llama.cpp's converter writes OLMo 3's windows: the window and each layer's flag
        w.add_sliding_window(config.sliding_window)
        w.add_sliding_window_pattern([kind == "sliding_attention" for kind in config.layer_types])
    if yarn:  # the full layers' YaRN (OLMo 3's; its sliding layers rotate unscaled)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(yarn["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(yarn["original_max_position_embeddings"]))
    if arch == "gemma2":
        w.add_attn_logit_softcapping(config.attn_logit_softcapping)
        w.add_final_logit_softcapping(config.final_logit_softcapping)
    if sliding_rope:
        w.add_rope_freq_base_swa(float(sliding_rope["rope_theta"]))
    if arch == "phi3":
        rotary = int(hd * getattr(config, "partial_rotary_factor", 1.0))
        w.add_rope_dimension_count(rotary)
    if longrope:  # llama.cpp's converter: the factors as tensors, the attention factor, no scaling type
        original = longrope["original_max_position_embeddings"]
        scale = config.max_position_embeddings / original
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        w.add_rope_scaling_orig_ctx_len(original)
        for name, key in (("rope_factors_long.weight", "long_factor"), ("rope_factors_short.weight", "short_factor")):
            tensors.append((name, np.asarray(longrope[key], np.float32)))
            chosen[name] = "F32"
    w.add_file_type(_file_type(file_type, types, tensors, chosen))
    add_tokenizer(w, vocab)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    for name, array in tensors:
        kind = chosen[name]
        data = kquants.quantize(array, kind) if array.ndim >= 2 else array
        w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return w.format_shard_names(path)[0]


def rewrite_gguf(source: Path, path: Path, fields: dict | None = None, tensors: dict | None = None) -> Path:
    """An F32 GGUF (`write_gguf(model, source)`) written again at `path` with some of it changed: `fields`
    {key: (value, gguf.GGUFValueType), or None to drop the key}, `tensors` {name: a float32 array in
    numpy's order, or None to drop it}: what a damaged or crafted file holds."""
    import gguf

    from chatcli.engine.weights.gguf_file import GGUFFile

    fields, tensors = fields or {}, tensors or {}
    metadata = read_metadata(source)
    w = gguf.GGUFWriter(str(path), metadata["general.architecture"][0])
    for key, (value, vtype, sub) in metadata.items():
        if key not in fields:
            w.add_key_value(key, value, vtype, sub_type=sub)
    for key, change in fields.items():
        if change is not None:
            w.add_key_value(key, *change)  # general.architecture: overwritten in place
    header = GGUFFile(source)
    assert {t.type_name for t in header.tensors.values()} == {"F32"}, "rewrite_gguf reads F32 files"
    arrays = {
        name: np.fromfile(source, np.float32, count=math.prod(t.shape), offset=t.offset).reshape(t.shape[::-1])
        for name, t in header.tensors.items()
    }
    header.close()
    for name, array in {**arrays, **tensors}.items():
        if array is not None:
            w.add_tensor(name, np.ascontiguousarray(array, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add_tokenizer(writer, vocab: int) -> None:
    """The embedded SmolLM2 GGUF's tokenizer fields, its vocabulary padded or cut to `vocab` tokens."""
    import gguf

    tokens, kinds, merges, others = embedded_tokenizer()
    if vocab < len(tokens):
        tokens, kinds = tokens[:vocab], kinds[:vocab]
        kept = set(tokens)

        def fits(merge: bytes) -> bool:  # both parts and their result still tokens
            left, right = merge.split(b" ", 1)
            return left in kept and right in kept and left + right in kept

        merges = [m for m in merges if fits(m)]
    else:  # as the converter pads a vocabulary larger than the tokenizer's
        tokens = tokens + [f"[PAD{i}]".encode() for i in range(len(tokens), vocab)]
        kinds = kinds + [int(gguf.TokenType.UNUSED)] * (vocab - len(kinds))
    writer.add_tokenizer_model(others["tokenizer.ggml.model"][0])
    writer.add_tokenizer_pre(others["tokenizer.ggml.pre"][0])
    writer.add_token_list(tokens)
    writer.add_token_types(kinds)
    writer.add_token_merges(merges)
    for key, (value, vtype, sub_type) in others.items():
        if key in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
            continue
        if key.endswith("_token_id") and value >= vocab:
            continue
        writer.add_key_value(key, value, vtype, sub_type=sub_type)


@functools.cache
def embedded_tokenizer() -> tuple[list[bytes], list[int], list[bytes], dict]:
    """The embedded SmolLM2 GGUF's (tokens, token types, merges, {other tokenizer.* key: (value, type,
    sub type)}, the chat template among them), read once per process."""
    from chatcli.engine.load.sources import embedded_gguf

    metadata = read_metadata(embedded_gguf())
    lists = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")
    others = {key: value for key, value in metadata.items() if key.startswith("tokenizer.") and key not in lists}
    tokens, kinds, merges = (metadata[key][0] for key in lists)
    return tokens, kinds, merges, others


# GGUF's scalar value types (gguf.GGUFValueType) as struct formats
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_metadata(path) -> dict[str, tuple]:
    """A GGUF file's key-value pairs, {key: (value, type, sub type or None)}, strings in arrays as
    bytes, others as str. A direct parse of the header: `gguf.GGUFReader` takes seconds on a file
    with 49,152 tokens and as many merges (a numpy view per string)."""
    import mmap
    import struct

    import gguf

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        magic, version, _tensors, count = struct.unpack_from("<4sIQQ", buf, 0)
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{path}: not a GGUF file of version 2 or later")
        pos = 24

        def take(fmt: str, n: int = 1):
            nonlocal pos
            values = struct.unpack_from(f"<{n}{fmt}", buf, pos)
            pos += struct.calcsize(f"<{n}{fmt}")
            return values

        def string() -> bytes:
            nonlocal pos
            (n,) = take("Q")
            pos += n
            return bytes(buf[pos - n : pos])

        metadata = {}
        for _ in range(count):
            key = string().decode()
            (vtype,) = take("I")
            sub = None
            if vtype == gguf.GGUFValueType.ARRAY:
                sub, n = take("I")[0], take("Q")[0]
                value = (
                    [string() for _ in range(n)] if sub == gguf.GGUFValueType.STRING else list(take(SCALARS[sub], n))
                )
                sub = gguf.GGUFValueType(sub)
            elif vtype == gguf.GGUFValueType.STRING:
                value = string().decode()
            else:
                (value,) = take(SCALARS[vtype])
            metadata[key] = (value, gguf.GGUFValueType(vtype), sub)
    return metadata


def _tensors(model, arch: str, heads: int, kv_heads: int):
    """(gguf name, float32 array) for each of the model's tensors, q/k rope-permuted for llama."""
    from chatcli.engine.weights.lean_file import head_rows

    def f32(tensor) -> np.ndarray:
        return np.ascontiguousarray(tensor.detach().float().cpu().numpy(), dtype=np.float32)

    def permuted(tensor, n_heads: int) -> np.ndarray:
        if arch not in LLAMA_LIKE:  # NEOX rope: transformers' own pairing
            return f32(tensor)
        return f32(tensor[head_rows(tensor.shape[0], n_heads)])  # LlamaModel.permute's row order

    gemma = arch.startswith("gemma")

    def norm(module) -> np.ndarray:  # llama.cpp's converter writes Gemma's norms as 1 + w
        return f32(module.weight) + (1.0 if gemma else 0.0)

    inner = model.model
    yield "token_embd.weight", f32(inner.embed_tokens.weight)
    for i, block in enumerate(inner.layers):
        a, m = block.self_attn, getattr(block, "mlp", None) or block.block_sparse_moe  # GraniteMoE's
        if hasattr(block, "input_layernorm"):  # OLMo 2: no norm before a block
            yield f"blk.{i}.attn_norm.weight", norm(block.input_layernorm)
        if hasattr(a, "qkv_proj"):  # Phi-3's fused q/k/v
            yield f"blk.{i}.attn_qkv.weight", f32(a.qkv_proj.weight)
        for short, proj, n_heads in (("q", "q_proj", heads), ("k", "k_proj", kv_heads), ("v", "v_proj", None)):
            if not hasattr(a, proj):
                continue
            proj = getattr(a, proj)
            rows = (lambda t, n=n_heads: permuted(t, n)) if n_heads else f32
            yield f"blk.{i}.attn_{short}.weight", rows(proj.weight)
            if proj.bias is not None:
                yield f"blk.{i}.attn_{short}.bias", rows(proj.bias)
        if hasattr(a, "q_norm"):
            yield f"blk.{i}.attn_q_norm.weight", norm(a.q_norm)
            yield f"blk.{i}.attn_k_norm.weight", norm(a.k_norm)
        yield f"blk.{i}.attn_output.weight", f32(a.o_proj.weight)
        if a.o_proj.bias is not None:
            yield f"blk.{i}.attn_output.bias", f32(a.o_proj.bias)
        if arch in ("olmo2", "olmo3"):  # its norms on the blocks' outputs alone
            yield f"blk.{i}.post_attention_norm.weight", norm(block.post_attention_layernorm)
            yield f"blk.{i}.post_ffw_norm.weight", norm(block.post_feedforward_layernorm)
        elif gemma:
            yield f"blk.{i}.post_attention_norm.weight", norm(block.post_attention_layernorm)
            yield f"blk.{i}.ffn_norm.weight", norm(block.pre_feedforward_layernorm)
            yield f"blk.{i}.post_ffw_norm.weight", norm(block.post_feedforward_layernorm)
        else:
            yield f"blk.{i}.ffn_norm.weight", norm(block.post_attention_layernorm)
        if hasattr(m, "experts"):  # a mixture of experts: the router, each expert's gate, up and down stacked
            width = m.experts.down_proj.shape[2]
            yield f"blk.{i}.ffn_gate_inp.weight", f32((m.router if hasattr(m, "router") else m.gate).weight)
            yield f"blk.{i}.ffn_gate_exps.weight", f32(m.experts.gate_up_proj[:, :width])
            yield f"blk.{i}.ffn_up_exps.weight", f32(m.experts.gate_up_proj[:, width:])
            yield f"blk.{i}.ffn_down_exps.weight", f32(m.experts.down_proj)
            continue
        if hasattr(m, "gate_up_proj"):  # Phi-3: gate and up in one, gate first
            yield f"blk.{i}.ffn_up.weight", f32(m.gate_up_proj.weight)
        else:
            yield f"blk.{i}.ffn_gate.weight", f32(m.gate_proj.weight)
            yield f"blk.{i}.ffn_up.weight", f32(m.up_proj.weight)
        yield f"blk.{i}.ffn_down.weight", f32(m.down_proj.weight)
    yield "output_norm.weight", norm(inner.norm)
    if not model.config.tie_word_embeddings:
        yield "output.weight", f32(model.lm_head.weight)


def _file_type_of(type_name: str) -> str:
    """The `gguf.LlamaFileType` name of a file mostly of `type_name`."""
    special = {"F32": "ALL_F32", "Q4_K": "MOSTLY_Q4_K_M", "Q5_K": "MOSTLY_Q5_K_M", "Q3_K": "MOSTLY_Q3_K_M"}
    return special.get(type_name, f"MOSTLY_{type_name}")


def _file_type(explicit: str | None, types, tensors, chosen: dict[str, str]):
    import gguf

    name = explicit or getattr(types, "file_type", None)
    if name is None and isinstance(types, str):
        name = _file_type_of(types)
    if name is None:
        counts: dict[str, int] = {}
        for tensor_name, array in tensors:
            if array.ndim >= 2:
                counts[chosen[tensor_name]] = counts.get(chosen[tensor_name], 0) + array.size
        name = _file_type_of(max(counts, key=counts.get))
    return gguf.LlamaFileType[name]


VOCAB = 512


def tiny(family: str, tied: bool, seed: int = 0, longrope: bool = False):
    """A random model of `family` whose widths are multiples of 256, so that K-quants fit; weights
    scaled as `tests.tiny.build_family` scales them (its configs are 64 wide)."""
    import transformers as t

    config = dict(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=tied,
    )
    if family == "qwen3":
        # wider heads than hidden / heads; 128 because transformers' GGUF loader ignores
        # qwen3.attention.key_length and takes Qwen3Config's default head_dim
        config["head_dim"] = 128
    gemma = family.startswith("gemma")
    if gemma:  # heads of 64, scaled as llama.cpp scales a Gemma that is not the 27B; a short window
        config.update(head_dim=64, query_pre_attn_scalar=64, sliding_window=4, tie_word_embeddings=True)
    if family == "gemma3_text":  # six layers: llama.cpp's pattern slides five, the sixth attends to all
        config.update(
            num_hidden_layers=6,
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        )
    rotated = 0.5
    if family == "phi4-mini":  # Phi-4-mini's shape: three quarters of each head rotated, tied, longrope
        family, rotated, longrope = "phi3", 0.75, True
        config.update(tie_word_embeddings=True)
    if family == "phi3":  # half the head rotated, no window
        config.update(partial_rotary_factor=rotated, sliding_window=None)
    if family == "smollm3":  # four layers: llama.cpp's fixed step leaves the fourth unrotated
        config.update(num_hidden_layers=4)
    if family in GRANITE:  # multipliers none of which is 1 (Granite 3.x's are 12, 1/128, 0.22, 8)
        config.update(embedding_multiplier=3.0, attention_multiplier=0.05, residual_multiplier=0.4, logits_scaling=2.5)
    if family in ("olmo2", "olmo3"):  # llama.cpp's olmo2 wants its output.weight
        config.update(tie_word_embeddings=False)
    if family == "olmo3":  # four layers, three of them sliding (a window of 4); YaRN on the full one alone
        config.update(
            num_hidden_layers=4,
            sliding_window=4,
            rope_parameters={
                "full_attention": {"rope_type": "yarn", "rope_theta": 10_000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 32},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        )  # fmt: skip
    if longrope:
        half = int(config["hidden_size"] // config["num_attention_heads"] * rotated) // 2  # rotated pairs
        config.update(
            max_position_embeddings=256,
            original_max_position_embeddings=64,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.1 * i for i in range(half)],
                "long_factor": [2.0 + 0.5 * i for i in range(half)],
                "original_max_position_embeddings": 64,
            },
        )
    if family in MOE:  # eight experts of 256 (K-quants fit their down), two a token, every layer sparse
        experts = "num_experts" if family == "qwen3_moe" else "num_local_experts"
        config.update({experts: 8, "num_experts_per_tok": 2, "head_dim": 64})
        if family == "qwen3_moe":
            config.update(moe_intermediate_size=256, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        elif family == "mixtral":
            config.update(intermediate_size=256, sliding_window=None)
        else:  # GraniteMoE: no head_dim in its config (hidden / heads: 64)
            config.update(intermediate_size=256)
            del config["head_dim"]
    kind = {
        "qwen3_moe": t.Qwen3MoeConfig,
        "mixtral": t.MixtralConfig,
        "llama": t.LlamaConfig,
        "qwen2": t.Qwen2Config,
        "qwen3": t.Qwen3Config,
        "gemma2": t.Gemma2Config,
        "gemma3_text": t.Gemma3TextConfig,
        "phi3": t.Phi3Config,
        "smollm3": t.SmolLM3Config,
        "granite": t.GraniteConfig,
        "granitemoe": t.GraniteMoeConfig,
        "olmo2": t.Olmo2Config,
        "olmo3": t.Olmo3Config,
    }[family]
    torch.manual_seed(seed)
    model = t.AutoModelForCausalLM.from_config(kind(**config), attn_implementation="eager")
    qk = 3.0 if family == "smollm3" else 0.5  # SmolLM3: sharp enough that a layer's rope (or none) counts
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(
                ("mlp.gate.weight", "block_sparse_moe.router.weight")
            ):  # the router: random whatever its init (ties choose at random),
                p.copy_(2.0 / math.sqrt(p.shape[1]) * torch.randn_like(p))  # its logits ~2 (a real router's size)
            elif p.dim() > 1:
                p.mul_(qk if any(f"{x}_proj" in name for x in ("q", "k")) else 4.0)
            elif "norm" in name:  # Gemma's norms multiply by 1 + w
                p.copy_((0.0 if gemma else 1.0) + 0.3 * torch.randn_like(p))
            else:  # biases
                p.copy_(0.5 * torch.randn_like(p))
    return model.eval()


GGUF_NAMES = [
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight", r"blk.\1.attn_q.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight", r"blk.\1.attn_k.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight", r"blk.\1.attn_v.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"blk.\1.attn_output.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.qkv_proj\.weight", r"blk.\1.attn_qkv.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_up_proj\.weight", r"blk.\1.ffn_up.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", r"blk.\1.ffn_gate.weight"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", r"blk.\1.ffn_up.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"blk.\1.ffn_down.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate\.weight", r"blk.\1.ffn_gate_inp.weight"),
    (r"model\.layers\.(\d+)\.block_sparse_moe\.router\.weight", r"blk.\1.ffn_gate_inp.weight"),
]


def gguf_name(name: str) -> str:
    for pattern, replacement in GGUF_NAMES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, replacement, name)
    raise KeyError(name)


def fake_quantized(model, types) -> dict[str, str]:
    """Each 2-D weight of `model` replaced, in place, by what its GGUF type makes of it; {gguf name: type}."""
    chosen = {}
    has_output = not model.config.tie_word_embeddings

    def rounded(target: str, values: torch.Tensor) -> torch.Tensor:
        kind = tensor_type(types, target, tuple(values.shape), model.config.num_hidden_layers, has_output)
        chosen[target] = kind
        raw = kquants.quantize(values.numpy(), kind)
        raw = raw if raw.dtype == np.uint8 else raw.view(np.uint8)
        return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(values.shape))

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                continue
            experts = re.fullmatch(
                r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(gate_up_proj|down_proj)", name
            )
            if experts and experts.group(2) == "gate_up_proj":  # [E, 2 I, D]: the gates, then the ups
                width = p.shape[1] // 2
                b = f"blk.{experts.group(1)}."
                p.copy_(torch.cat([rounded(b + "ffn_gate_exps.weight", p[:, :width]),
                                   rounded(b + "ffn_up_exps.weight", p[:, width:])], dim=1))  # fmt: skip
            elif experts:
                p.copy_(rounded(f"blk.{experts.group(1)}.ffn_down_exps.weight", p))
            else:
                p.copy_(rounded(gguf_name(name), p))
    return chosen


def base_model_gguf(family: str, path: Path, tokens: dict[int, tuple[str, int]] | None = None) -> Path:
    """A tiny F32 GGUF of `family` as a base model's file is: no `tokenizer.chat_template` (`tokens`:
    {id: (text, llama.cpp token type)} written over the vocabulary's, the merges that made the old ones
    dropped)."""
    source = write_gguf(tiny(family, True), path.with_name(path.stem + "-with-template.gguf"), "F32")
    fields: dict = {"tokenizer.chat_template": None}
    if tokens:
        metadata = read_metadata(source)
        texts, kinds = list(metadata["tokenizer.ggml.tokens"][0]), list(metadata["tokenizer.ggml.token_type"][0])
        old = {texts[i] for i in tokens}
        for i, (text, kind) in tokens.items():
            texts[i], kinds[i] = text.encode(), kind
        merges = [m for m in metadata["tokenizer.ggml.merges"][0] if not ({m.replace(b" ", b""), *m.split(b" ")} & old)]
        array, string, int32 = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING, gguf.GGUFValueType.INT32
        fields["tokenizer.ggml.tokens"] = (texts, array, string)
        fields["tokenizer.ggml.token_type"] = (kinds, array, int32)
        fields["tokenizer.ggml.merges"] = (merges, array, string)
    return rewrite_gguf(source, path, fields)
