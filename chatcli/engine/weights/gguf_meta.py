"""A GGUF's config and tokenizer from its own metadata, without transformers (`gguf_file`).

What a model folder would hold, written into a GGUF's metadata folder (`gguf_convert.meta_folder`):
`config.json` (transformers' names for llama.cpp's `<arch>.*` keys), `tokenizer.json` (a `tokenizers`
byte-level BPE: the file's tokens and merges, its pre-tokenizer's split by `tokenizer.ggml.pre`,
control tokens special and user-defined ones added whole, as llama.cpp matches them),
`tokenizer_config.json` (special tokens, BOS/EOS flags) and the chat template. `save` returns False
where it does not know the file's tokenizer (SentencePiece vocabularies, an unknown pre-tokenizer) or
its architecture: the caller then asks transformers, whose GGUF converter covers more, and
`mark_controls` corrects what that wrote.

Control tokens are never written as text (`is_control`: special in the tokenizer, so a reply's decode
skips them, as llama.cpp's `token_to_piece` without `special` prints nothing for them; the token
inspector still shows them). A file without a chat template gets none here: the tokenizer then
renders with a built-in one (`text.templates`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from chatcli.engine.text.built import keep_built
from chatcli.engine.text.tokenize import byte_level
from chatcli.engine.weights.gguf_file import GGUFFile
from chatcli.engine.weights.gguf_windows import rope_bases, sliding_layers

# GGUF architecture -> transformers' (model_type, architecture) for the files whose config is written here
FAMILIES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "qwen3moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "gemma2": ("gemma2", "Gemma2ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "smollm3": ("smollm3", "SmolLM3ForCausalLM"),
    "granite": ("granite", "GraniteForCausalLM"),
    "granitemoe": ("granitemoe", "GraniteMoeForCausalLM"),
    "olmo2": ("olmo2", "Olmo2ForCausalLM"),
    "gpt-oss": ("gpt_oss", "GptOssForCausalLM"),
}
GRANITE = ("granite", "granitemoe")  # Granite's multipliers (`embedding_scale`, ...), read alike
NO_ROPE_STEP = {"smollm3": 4}  # llama.cpp's: layer i rotates nothing where (i + 1) % step == 0 (no key says so)

# llama.cpp's splits (llama-vocab.cpp, `llm_tokenizer_bpe`'s regex_exprs). Its contractions are spelled
# `'[sS]`, not `(?i:'s)`: no Unicode case folding there (`'ſ` is no contraction).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# o200k's (gpt-4o, gpt-oss): words by their case runs, each with a contraction (any case), up to three digits
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CASED = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CASED}|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CASED}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` (a file without one: "default", as llama.cpp reads it) -> the regexes llama.cpp splits
# the text with, in order, each within the pieces of the one before, matches and the text between them kept
SPLITS = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt-2": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),  # every digit alone first
    "refact": (r"\p{N}", _GPT2),  # Granite 3.x's files name it so: llama.cpp splits it as smollm
    "llama-bpe": (_LLAMA3,),
    "llama3": (_LLAMA3,),
    "llama-v3": (_LLAMA3,),
    "smaug-bpe": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "deepseek-r1-qwen": (_QWEN2,),
    "gpt-4o": (_GPT4O,),
}
# where llama.cpp sets `ignore_merges`: a piece of the split that is itself a token is that token, merges or not
WHOLE_WORDS = frozenset({"llama-bpe", "llama3", "llama-v3"})
UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 2, 3, 4, 5, 6  # llama.cpp's token types
# user-defined tokens that llama.cpp's converter types CONTROL (`does_token_look_special`), which a file
# another tool wrote may type USER_DEFINED
LOOKS_CONTROL = re.compile(r"<\|.*\|>|<｜.*｜>|<unused[0-9]*>|<pad>|<mask>|<2mass>|\[@BOS@\]", re.DOTALL)
# the image and audio placeholders of multimodal vocabularies (Gemma 3's), which no text reply means:
# llama.cpp's converter types them USER_DEFINED where the model's tokenizer_config does not call them special
MEDIA_MARKERS = frozenset(
    ("<start_of_image>", "<end_of_image>", "<image_soft_token>")
    + ("<start_of_audio>", "<end_of_audio>", "<audio_soft_token>")
)


def is_control(text: str, kind: int) -> bool:
    """A token never written as text: typed CONTROL or UNKNOWN (what llama.cpp's `token_to_piece` prints
    nothing for without `special`) or UNUSED (a vocabulary's padding: nothing even with it), a user-defined
    one llama.cpp's converter would have typed CONTROL (`LOOKS_CONTROL`), or a media placeholder
    (`MEDIA_MARKERS`). The other user-defined tokens are text, as llama.cpp prints them: Qwen's `<think>`
    and `<tool_call>`, Gemma's `<table>` and `<h1>`."""
    if kind in (UNKNOWN, CONTROL, UNUSED):
        return True
    if kind == BYTE:
        return False
    return text in MEDIA_MARKERS or (kind == USER_DEFINED and LOOKS_CONTROL.fullmatch(text) is not None)


def hf_config(f: GGUFFile) -> dict:
    """The transformers config.json fields for a `FAMILIES` file."""
    heads = int(f.hp("attention.head_count"))
    hidden = int(f.hp("embedding_length"))
    tied = "output.weight" not in f.tensors
    model_type, architecture = FAMILIES[f.arch]
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": int(f.hp("feed_forward_length") or f.hp("expert_feed_forward_length")),
        "num_hidden_layers": int(f.hp("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(f.hp("attention.head_count_kv", heads) or heads),
        "head_dim": int(f.hp("attention.key_length", hidden // heads) or hidden // heads),
        "rms_norm_eps": float(f.hp("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": rope_bases(f)[0],
        "max_position_embeddings": int(f.hp("context_length", 2048) or 2048),
        "vocab_size": int(f.tensors["token_embd.weight"].shape[1]),
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
    }
    config.update(experts_config(f))
    config.update(olmo3_config(f))
    layers = config["num_hidden_layers"]
    if f.arch in NO_ROPE_STEP:  # transformers' spelling: 1 where a layer has rope
        config["no_rope_layers"] = [int((i + 1) % NO_ROPE_STEP[f.arch] != 0) for i in range(layers)]
    if f.arch in GRANITE:  # its multipliers (llama.cpp: 0 or absent is none)
        scales = {"embedding_multiplier": "embedding_scale", "residual_multiplier": "residual_scale"}
        scales.update(attention_multiplier="attention.scale", logits_scaling="logit_scale")
        for name, key in scales.items():
            value = float(f.hp(key, 0.0) or 0.0)
            config[name] = value or (config["head_dim"] ** -0.5 if name == "attention_multiplier" else 1.0)
    if f.arch.startswith("gemma"):  # what lean_support reads; the weights' own settings come from the file
        config["hidden_act"] = config["hidden_activation"] = "gelu_pytorch_tanh"
        if f.hp("attention.sliding_window"):
            config["sliding_window"] = int(f.hp("attention.sliding_window"))
    for name in ("bos_token_id", "eos_token_id", "padding_token_id"):
        value = f.fields.get(f"tokenizer.ggml.{name}")
        if value is not None:
            config[name.replace("padding", "pad")] = int(value)
    return config


def olmo3_config(f: GGUFFile) -> dict:
    """An `olmo2` file with sliding layers is OLMo 3 (llama.cpp runs both as olmo2): its config.json fields,
    each layer's type as the file gives it (`gguf_windows.sliding_layers`), the full layers' rope scaling and
    the sliding layers' plain rope. None for any other file."""
    sliding = sliding_layers(f) if f.arch == "olmo2" else ()
    if not sliding:
        return {}
    theta, local_theta = rope_bases(f)
    full = {"rope_type": "default", "rope_theta": theta}
    if f.hp("rope.scaling.type") in ("yarn", "linear"):
        full.update(rope_type=str(f.hp("rope.scaling.type")), factor=float(f.hp("rope.scaling.factor", 1.0) or 1.0))
    if full["rope_type"] == "yarn":
        full["original_max_position_embeddings"] = int(f.hp("rope.scaling.original_context_length", 4096) or 4096)
    local = {"rope_type": "default", "rope_theta": local_theta}
    return {
        "architectures": ["Olmo3ForCausalLM"],
        "model_type": "olmo3",
        "sliding_window": int(f.hp("attention.sliding_window")),
        "layer_types": ["sliding_attention" if flag else "full_attention" for flag in sliding],
        "rope_parameters": {"full_attention": full, "sliding_attention": local},
    }


def experts_config(f: GGUFFile) -> dict:
    """A mixture of experts' config.json fields (none where the file has no experts): Qwen3-MoE's, a
    `llama` file's as Mixtral's (its own model_type), or GraniteMoE's (its experts' width `feed_forward_length`,
    transformers' `intermediate_size`)."""
    experts = int(f.hp("expert_count", 0) or 0)
    if not experts:
        return {}
    used = int(f.hp("expert_used_count", 0) or 0)
    if f.arch == "llama":
        return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": experts,
                "num_experts_per_tok": used}  # fmt: skip
    if f.arch == "granitemoe":
        return {"num_local_experts": experts, "num_experts_per_tok": used}
    width = int(f.hp("expert_feed_forward_length", 0) or f.hp("feed_forward_length"))
    return {"num_experts": experts, "num_experts_per_tok": used, "moe_intermediate_size": width, "norm_topk_prob": True}


def build_tokenizer(f: GGUFFile):
    """The file's byte-level BPE as a `tokenizers.Tokenizer`, or None where it is not one this knows."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    pre = str(f.fields.get("tokenizer.ggml.pre") or "default")
    if f.fields.get("tokenizer.ggml.model") != "gpt2" or pre not in SPLITS or "tokenizer.ggml.merges" not in f.fields:
        return None
    tokens = list(f.fields["tokenizer.ggml.tokens"])
    types = list(f.fields.get("tokenizer.ggml.token_type", [])) or [1] * len(tokens)
    types += [1] * (len(tokens) - len(types))
    spelling = {b: c for c, b in byte_level().items()}  # byte -> its character
    alphabet = set(spelling.values())
    # control, user-defined and unknown tokens are matched in the text as they are written (llama.cpp's
    # `tokenizer_st_partition` with parse_special), never made by merges: their own text is their key
    control = {i for i, t in enumerate(tokens) if is_control(t, types[i])}
    whole = control | {i for i, k in enumerate(types) if k == USER_DEFINED}
    vocab = {
        (t if i in whole or set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
        for i, t in enumerate(tokens)
    }
    pairs = (tuple(m.split(" ", 1)) for m in f.fields["tokenizer.ggml.merges"])
    # a merge of pieces the vocabulary lacks (a cut vocabulary) could never apply: tokenizers refuses it
    merges = [(a, b) for a, b in pairs if a in vocab and b in vocab and a + b in vocab]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=pre in WHOLE_WORDS))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in SPLITS[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [t for i, t in enumerate(tokens) if i in control and vocab.get(t) == i]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    user = [t for i, t in enumerate(tokens) if types[i] == USER_DEFINED and i not in control and vocab.get(t) == i]
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    return tok


def mark_controls(f: GGUFFile, out: Path) -> None:
    """`out`'s tokenizer.json (transformers' GGUF converter wrote it: a vocabulary `build_tokenizer` does
    not build) with the file's `is_control` tokens special: added as such where it did not add them."""
    path = out / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    tokens = list(f.fields.get("tokenizer.ggml.tokens", []))
    types = list(f.fields.get("tokenizer.ggml.token_type", [])) or [1] * len(tokens)
    added = data.setdefault("added_tokens", [])
    listed = {entry["id"]: entry for entry in added}
    for i, (text, kind) in enumerate(zip(tokens, types, strict=False)):
        if not is_control(text, kind):
            continue
        if i in listed:
            listed[i]["special"] = True
        elif data.get("model", {}).get("vocab", {}).get(text) == i:  # where the converter spelled it as the file
            entry = dict(id=i, content=text, single_word=False, lstrip=False, rstrip=False, normalized=False)
            added.append({**entry, "special": True})
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def save(f: GGUFFile, out: Path) -> bool:
    """Write config.json, generation_config.json, tokenizer.json, tokenizer_config.json and the chat
    template into `out`; False (nothing written) where this does not know the file's kind."""
    if f.arch not in FAMILIES or "token_embd.weight" not in f.tensors:
        return False
    tok = build_tokenizer(f)
    if tok is None:
        return False
    config = hf_config(f)
    tokens = f.fields["tokenizer.ggml.tokens"]
    settings: dict = {"model_max_length": config["max_position_embeddings"], "clean_up_tokenization_spaces": False}
    for name, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        index = f.fields.get(f"tokenizer.ggml.{key}")
        if index is not None and 0 <= int(index) < len(tokens):
            settings[name] = tokens[int(index)]
    for flag in ("add_bos_token", "add_eos_token"):
        if f"tokenizer.ggml.{flag}" in f.fields:
            settings[flag] = bool(f.fields[f"tokenizer.ggml.{flag}"])
    tok.save(str(out / "tokenizer.json"))
    keep_built(out / "tokenizer.json", tok)  # the start that follows takes it as it is
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=1))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=1))
    template = f.fields.get("tokenizer.chat_template")
    if template:
        (out / "chat_template.jinja").write_text(str(template))
    return True
