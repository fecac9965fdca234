"""A GGUF header's model fields checked before any weight is read (`check_header`).

A crafted or damaged file otherwise fails deep in a load (a zero head count divides by zero, a
block count of 10^6 walks a million missing blocks) or loads and answers garbage (a NaN RMS epsilon,
a negative rope base). Run right after the header is parsed, on every path that loads a GGUF as a
model (`gguf_convert.save_metadata` for the config both runners read, `gguf_lean.write_lean_file`
for the kernel's file), this refuses such a file with one line naming the field and its value
(`bad GGUF: llama.block_count is 1000000 but the file has tensors for 2 blocks`):

- `general.architecture` a name; `general.alignment` a power of two, every tensor's data at a
  multiple of it (the parse has checked that it lies within the file);
- the hyperparameters llama.cpp names `<arch>.*`, where present: counts and lengths whole numbers
  above 0 (a per-layer array: each at least 0), epsilons, rope bases and scaling factors finite and
  above 0, soft-caps finite and at least 0;
- `block_count` the blocks the tensors are named for (`blk.0.` .. `blk.{n-1}.`, each present);
- every tensor's dimensions above 0 and whole blocks of its type;
- for the architectures whose config is read here (`gguf_meta.FAMILIES`): their dims present,
  the heads dividing the width and the query heads a multiple of the key/value heads, the rotated
  dims even and within a head, a mixture's `expert_used_count` within its `expert_count`, each
  tensor the shape the dims give it (the experts' [experts, rows, k] too), and a vocabulary no
  longer than the embedding.
"""

from __future__ import annotations

import math
import re

import numpy as np

from chatcli.engine.weights.gguf_file import TYPES, GGUFError, GGUFFile
from chatcli.engine.weights.gguf_meta import FAMILIES

# `<arch>.<key>`: a count or a length (whole, above 0)
COUNTS = (
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "rope.dimension_count",
    "rope.scaling.original_context_length",
    "vocab_size",
    "expert_used_count",
    "expert_feed_forward_length",
)
PER_LAYER = ("feed_forward_length", "attention.head_count", "attention.head_count_kv")  # or an array: each >= 0
ZERO_NONE = ("attention.sliding_window", "expert_count")  # whole, at least 0 (0: none)
POSITIVE = (  # finite, above 0
    "attention.layer_norm_rms_epsilon",
    "attention.layer_norm_epsilon",
    "rope.freq_base",
    "rope.freq_base_swa",
    "rope.scaling.factor",
    "rope.scaling.attn_factor",
)
CAPS = ("attn_logit_softcapping", "final_logit_softcapping")  # finite, at least 0 (0: none)
NEEDED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")  # a FAMILIES file's
BLOCK = re.compile(r"blk\.(\d+)\.")
VALUES_A_BLOCK = {name: per for name, per, _size in TYPES.values()}


def check_header(f: GGUFFile) -> None:
    """Raise GGUFError (`bad GGUF: ...`, one line) where the header's model fields or tensors do not make a model."""
    problem = _problem(f)
    if problem:
        raise GGUFError(f"bad GGUF: {problem}")


def _problem(f: GGUFFile) -> str | None:
    arch = f.fields.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        return f"general.architecture is {_shown(arch)}, not an architecture's name"
    return _layout(f) or _fields(f) or _blocks(f) or _tensors(f) or _family(f)


def _shown(value) -> str:
    if value is None:
        return "missing"
    if isinstance(value, np.ndarray):
        return f"an array of {len(value)}"
    if isinstance(value, (list, tuple)) or (hasattr(value, "__len__") and not isinstance(value, (str, bytes))):
        return f"a list of {len(value)}"
    return repr(value)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _layout(f: GGUFFile) -> str | None:
    align = f.fields.get("general.alignment", 32)
    if not _whole(align) or align <= 0 or align & (align - 1):
        return f"general.alignment is {_shown(align)}, not a power of two"
    for t in f.tensors.values():
        if t.offset % align:
            return f"{t.name}'s data starts at byte {t.offset}, not a multiple of general.alignment {align}"
    return None


def _fields(f: GGUFFile) -> str | None:
    for key in (*COUNTS, *ZERO_NONE, *POSITIVE, *CAPS):
        name = f"{f.arch}.{key}"
        if name not in f.fields:
            continue
        value = f.fields[name]
        if key in PER_LAYER and isinstance(value, np.ndarray) and value.dtype.kind in "iu" and value.size:
            if (value < 0).any():  # per layer, as llama.cpp reads some: a FAMILIES file's are refused below
                return f"{name} holds {int(value.min())}, not a count"
        elif key in COUNTS or key in ZERO_NONE:
            least = 1 if key in COUNTS else 0
            if not _whole(value) or value < least:
                return f"{name} is {_shown(value)}, not a whole number {'above 0' if least else 'of 0 or more'}"
        else:
            above = key in POSITIVE
            number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
            if not (math.isfinite(number) and (number > 0 if above else number >= 0)):
                return f"{name} is {_shown(value)}, not a finite number {'above 0' if above else 'of 0 or more'}"
    return None


def _blocks(f: GGUFFile) -> str | None:
    name = f"{f.arch}.block_count"
    count = f.fields.get(name)
    found = {int(m.group(1)) for t in f.tensors if (m := BLOCK.match(t))}
    if count is None:
        return f"{name} is missing but the file has tensors for {len(found)} blocks" if found else None
    if len(found) != count:
        return f"{name} is {count} but the file has tensors for {len(found)} blocks"
    missing = set(range(count)) - found  # as many blocks as named: one is missing where one is past the count
    return f"{name} is {count} but the file has no tensors for block {min(missing)}" if missing else None


def _tensors(f: GGUFFile) -> str | None:
    for t in f.tensors.values():
        if not t.shape or any(d <= 0 for d in t.shape):
            return f"{t.name} has dimensions {list(t.shape)}: each must be above 0"
        per = VALUES_A_BLOCK.get(t.type_name, 1)
        if t.shape[0] % per:
            return f"{t.name}'s rows of {t.shape[0]} values are not whole {t.type_name} blocks of {per}"
    return None


def _family(f: GGUFFile) -> str | None:
    """The dims a FAMILIES file needs, consistent with each other and with its tensors' shapes."""
    if f.arch not in FAMILIES:
        return None
    arch = f.arch
    for key in NEEDED:
        if f"{arch}.{key}" not in f.fields:
            return f"{arch}.{key} is missing"
    for key in ("feed_forward_length", "attention.head_count", "attention.head_count_kv"):
        value = f.fields.get(f"{arch}.{key}")
        if value is not None and not _whole(value):
            return f"{arch}.{key} is {_shown(value)}, not one whole number (per-layer values are not read here)"
    hidden, heads = f.hp("embedding_length"), f.hp("attention.head_count")
    kv_heads = f.hp("attention.head_count_kv", heads)
    if heads % kv_heads:
        return f"{arch}.attention.head_count {heads} is not a multiple of {arch}.attention.head_count_kv {kv_heads}"
    if f.hp("attention.key_length") is None and hidden % heads:
        return f"{arch}.embedding_length {hidden} is not a multiple of {arch}.attention.head_count {heads}"
    hd = f.hp("attention.key_length", hidden // heads)
    hd_v = f.hp("attention.value_length", hd)
    rotary = f.hp("rope.dimension_count", hd)
    if hd % 2 or rotary % 2 or rotary > hd:
        return f"{arch}.rope.dimension_count is {rotary}: rope turns pairs of a head's {hd} dims"
    experts, used = f.hp("expert_count", 0), f.hp("expert_used_count")
    if experts and (used is None or used > experts):
        return f"{arch}.expert_used_count is {_shown(used)}: a token takes 1 to {arch}.expert_count {experts} experts"
    return _shapes(f, hidden, heads, kv_heads, hd, hd_v, rotary)


def _experts(f: GGUFFile, hidden: int) -> dict:
    """A mixture of experts' tensors' shapes (none without experts): the router, each expert's gate, up, down."""
    arch, experts = f.arch, f.hp("expert_count", 0)
    if not experts:
        return {}
    width = f.hp("expert_feed_forward_length", f.hp("feed_forward_length"))
    n = f"{arch}.expert_count {experts}"
    ff = f"{arch}.embedding_length {hidden}, {arch}.expert_feed_forward_length {width} and {n}"
    return {
        "ffn_gate_inp.weight": ((hidden, experts), f"{arch}.embedding_length {hidden} and {n}"),
        "ffn_gate_exps.weight": ((hidden, width, experts), ff),
        "ffn_up_exps.weight": ((hidden, width, experts), ff),
        "ffn_down_exps.weight": ((width, hidden, experts), ff),
    }


def _shapes(f: GGUFFile, hidden: int, heads: int, kv_heads: int, hd: int, hd_v: int, rotary: int) -> str | None:
    arch = f.arch
    ffn = f.hp("feed_forward_length")
    width = f"{arch}.embedding_length {hidden}"
    q = f"{arch}.attention.head_count {heads} x head dim {hd}"
    kv = f"{arch}.attention.head_count_kv {kv_heads} x head dim"
    ff = f"{arch}.feed_forward_length {ffn}"
    gated = any(name.endswith(".ffn_gate.weight") for name in f.tensors)
    whole = arch == "olmo2"  # its q/k norms span all of q and of k
    # ggml's order: a weight's rows' length (its inputs) first, then its outputs; {suffix: (shape, what gives it)}
    want = {
        "attn_norm.weight": ((hidden,), width),
        "ffn_norm.weight": ((hidden,), width),
        "post_attention_norm.weight": ((hidden,), width),
        "post_ffw_norm.weight": ((hidden,), width),
        "attn_q.weight": ((hidden, heads * hd), f"{width} and {q}"),
        "attn_k.weight": ((hidden, kv_heads * hd), f"{width} and {kv} {hd}"),
        "attn_v.weight": ((hidden, kv_heads * hd_v), f"{width} and {kv} {hd_v}"),
        "attn_qkv.weight": ((hidden, heads * hd + 2 * kv_heads * hd), f"{width}, {q} and {kv} {hd}"),
        "attn_output.weight": ((heads * hd_v, hidden), f"{width} and {arch}.attention.head_count {heads} x {hd_v}"),
        "attn_q.bias": ((heads * hd,), q),
        "attn_k.bias": ((kv_heads * hd,), f"{kv} {hd}"),
        "attn_v.bias": ((kv_heads * hd_v,), f"{kv} {hd_v}"),
        "attn_q_norm.weight": ((heads * hd,), q) if whole else ((hd,), f"head dim {hd}"),
        "attn_k_norm.weight": ((kv_heads * hd,), f"{kv} {hd}") if whole else ((hd,), f"head dim {hd}"),
        "ffn_gate.weight": ((hidden, ffn), f"{width} and {ff}"),
        "ffn_up.weight": ((hidden, ffn if gated else 2 * ffn), f"{width} and {ff}{'' if gated else ' (gate and up)'}"),
        "ffn_down.weight": ((ffn, hidden), f"{width} and {ff}"),
        **_experts(f, hidden),
    }
    whole = {
        "output_norm.weight": ((hidden,), width),
        "rope_freqs.weight": ((rotary // 2,), f"{arch}.rope.dimension_count {rotary} / 2"),
        "rope_factors_short.weight": ((rotary // 2,), f"{arch}.rope.dimension_count {rotary} / 2"),
        "rope_factors_long.weight": ((rotary // 2,), f"{arch}.rope.dimension_count {rotary} / 2"),
    }
    for name, t in f.tensors.items():
        block = BLOCK.match(name)
        expected = want.get(name[block.end() :]) if block else whole.get(name)
        if expected is not None and t.shape != expected[0]:
            return f"{name} is {list(t.shape)} but {expected[1]} make it {list(expected[0])}"
    embed = f.tensors.get("token_embd.weight")
    if embed is None:
        return None  # gguf_lean.direct_reason says so; transformers' converter may know another name
    for name in ("token_embd.weight", "output.weight"):
        t = f.tensors.get(name)
        if t is not None and (len(t.shape) != 2 or t.shape[0] != hidden):
            return f"{name} is {list(t.shape)} but {width} makes it [{hidden}, vocabulary]"
    tokens = f.fields.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) > embed.shape[1]:
        return f"tokenizer.ggml.tokens holds {len(tokens)} tokens but token_embd.weight has {embed.shape[1]} rows"
    return None
