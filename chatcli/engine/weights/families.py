"""The decoder families the lean path runs, and what each needs beyond a Llama block.

Every family here is a decoder with rotary attention and a gated MLP, normed before each block (OLMo 2:
after it); they differ in a few places, each a field of `lean_file.LeanConfig` that the torch runner (`lean`) and the
kernel (`kernels/decode.cpp`) both follow:

| family | beyond Llama |
|---|---|
| llama (Llama 2/3/3.2, SmolLM) | rope scaling linear / llama3 |
| mistral | a sliding window on every layer (where set) |
| qwen2 (Qwen2 / 2.5) | q/k/v biases; sliding layers where `use_sliding_window` |
| qwen3 | RMSNorm on each head of q and k, before rope |
| phi3 (Phi-3 / 3.5 / 4-mini) | fused qkv and gate_up; partial rotary; longrope; a sliding window |
| gemma2 | scaled embedding, (1 + w) norms, sandwich norms, GeGLU, score and logit soft-capping, alternating windows |
| gemma3_text (Gemma 3 1B, the text model) | Gemma 2's, with q/k norms and a second rope base for sliding layers |
| smollm3 (SmolLM3) | no rope on some layers (`no_rope_layers`; in a GGUF every fourth, as llama.cpp has it) |
| granite (Granite 3.x dense) | embedding, score and residual multipliers; logits divided by `logits_scaling` |
| olmo2 (OLMo 2) | RMSNorm on each block's output and none before it; q/k norms over all of q and all of k |
| olmo3 (OLMo 3) | OLMo 2's, with three sliding layers of every four, unscaled rope there and YaRN on the others |
| qwen3_moe, mixtral, gpt_oss (GGUFs, on the kernel only) | every layer's FFN a mixture of experts: its router's top k |
| granitemoe (Granite 3.x MoE; GGUFs, on the kernel only) | Granite's multipliers, every layer a mixture of experts |

A sliding layer's keys and values are kept for its window (and a margin for crops), not the whole
context: `kv.memory.Strip`.

What a family's model does that the lean path does not compute is refused with one line
(`lean_support`), and that model runs on transformers (`HFRunner`). This module reads a
config (config.json as a dict, or a transformers config) and imports neither torch nor numpy.
"""

from __future__ import annotations

LEAN_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "smollm3", "granite", "olmo2")
LEAN_FAMILIES += ("olmo3",)
# mixtures of experts: run from a GGUF's own blocks on the compiled kernel only (kernels/moe.h), every layer's
# router choosing its experts (`gguf_lean`); a model folder of them, or no kernel, is transformers'
MOE_FAMILIES = ("qwen3_moe", "mixtral", "granitemoe", "gpt_oss")
GEMMA = ("gemma2", "gemma3_text")
POST_NORMED = ("olmo2", "olmo3")  # RMSNorm on each block's output, none before it
# static rope tables (computed once for the context); "dynamic" NTK rescales with the length and is not
LEAN_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "su")


def _getter(config):
    if isinstance(config, dict):
        return config.get
    return lambda key, default=None: getattr(config, key, default)


def rope_types(config) -> list[str]:
    """The rope types of a config's rope parameters (one per layer type where they are nested)."""
    get = _getter(config)
    rope = get("rope_parameters", None) or get("rope_scaling", None) or {}
    if not isinstance(rope, dict):
        return ["default"]
    nested = [v for v in rope.values() if isinstance(v, dict)]
    return [r.get("rope_type", r.get("type", "default")) for r in (nested or [rope])]


def lean_support(config, gguf: bool = False) -> str | None:
    """None if the lean runners compute this model exactly, else why not (one line).

    `config`: a model's config.json as a dict, or a transformers config (read by attribute); `gguf`: the
    model is a GGUF's (then a mixture of experts, `MOE_FAMILIES`, runs too: on the kernel, from its blocks)."""
    get = _getter(config)
    kind = get("model_type")
    if kind in MOE_FAMILIES and not gguf:
        return f"a mixture of experts ({kind}) runs on the lean path from a GGUF's own blocks only"
    if kind not in (*LEAN_FAMILIES, *MOE_FAMILIES):
        return f"architecture {kind!r} is not in the lean path ({', '.join(LEAN_FAMILIES)})"
    gemma = kind in GEMMA
    act = (get("hidden_activation", None) or get("hidden_act", None)) if gemma else get("hidden_act", "silu")
    wanted = "gelu_pytorch_tanh" if gemma else "silu"
    checks = {
        "attention biases": kind != "qwen2" and get("attention_bias", False),
        "MLP biases": get("mlp_bias", False),
        f"activation {act!r}": (act or wanted) != wanted,
        "pretraining_tp > 1": (get("pretraining_tp", 1) or 1) > 1,
        "bidirectional attention": get("use_bidirectional_attention", False),
    }
    for what, present in checks.items():
        if present:
            return f"the model uses {what}"
    for rope_type in rope_types(config):
        if rope_type not in LEAN_ROPE_TYPES:
            return f"rope type {rope_type!r} is not in the lean path"
    return None


def sliding_layers(config) -> tuple:
    """Per layer, whether it is a sliding layer: where `layer_types` names them (Qwen2, Gemma), those;
    else every layer where `sliding_window` is set (Mistral, Phi-3); empty where there are none."""
    types = getattr(config, "layer_types", None)
    if types:
        sliding = tuple(t == "sliding_attention" for t in types)
    elif getattr(config, "sliding_window", None):
        sliding = (True,) * config.num_hidden_layers
    else:
        return ()
    return sliding if any(sliding) else ()


def no_rope_layers(config) -> tuple:
    """Per layer, whether q and k go unrotated: SmolLM3's `no_rope_layers` (1 where a layer *has* rope, as
    transformers spells it); empty where every layer rotates."""
    flags = _getter(config)("no_rope_layers", None)
    nope = tuple(not flag for flag in flags) if flags else ()
    return nope if any(nope) else ()


def original_context(config) -> int | None:
    """A longrope model's pretraining context (past it, transformers switches every position to the
    long factors, which a cache made with the short ones cannot follow): the lean context stops there."""
    if not {"longrope", "su"} & set(rope_types(config)):
        return None
    get = _getter(config)
    rope = get("rope_parameters", None) or get("rope_scaling", None) or {}
    return get("original_max_position_embeddings", None) or rope.get("original_max_position_embeddings")


def softcap(config, name: str) -> float:
    return float(getattr(config, name, None) or 0.0)


# The most positions a model's context holds here, whatever its config declares: a lean file's rope
# table has a row for each (32 MiB at a head of 64), and a declared 2^24 would be 4 GiB of it, computed
# and written at conversion. Llama 3.1 / 3.2's 131,072 fit. `--ctx-size` caps it lower (`LoadOptions`).
MAX_CONTEXT = 1 << 17


def context_limit(config, tokenizer) -> int:
    """The model's context: max_position_embeddings (2048 if unset), or the tokenizer's smaller limit
    (or a longrope model's pretraining context: see `families.original_context`); at most `MAX_CONTEXT`."""
    limit = getattr(config, "max_position_embeddings", None) or 2048
    limit = min(limit, original_context(config) or limit, MAX_CONTEXT)
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < limit:
        limit = tok_max
    return int(limit)
