"""The lean-native model file: the exact tensors the lean runners read, converted once, memory-mapped.

A decoder of one of the lean families (`families.LEAN_FAMILIES`: Llama, Mistral, Qwen2/3,
Phi-3, Gemma 2/3, SmolLM3, Granite, OLMo 2) is converted once (`lean_convert`, with torch and transformers) into one
safetensors file per *kind* in the user cache: the projections fused (q/k/v, gate/up),
transposed, with the RMSNorm weights folded in and q/k rows ordered for rope, in the layout
and dtype their reader wants:

- `float32-panels`: fp32, each projection in panels of 64 outputs `[ceil(n/64), k, 64]`, for
  the compiled kernel (`native.NativeRunner`);
- `q4` / `q8`: group-wise 4- or 8-bit codes with fp16 scales (and mins), GGUF's Q4_0/Q4_1/Q8_0
  blocks, packed for the kernel (`quant_blocks`): a GGUF's own blocks where it has them, the
  RMSNorm weights kept apart (`attn_norm`, `mlp_norm`, `final_norm`) since a block cannot take them;
  in `q4` the layers are 4-bit and the head 8-bit unless the GGUF's head is 4-bit;
- `gguf`: a GGUF's tensors each in the type the file holds it (Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0,
  Q5_1, Q8_0), repacked for the kernel without changing a value (`kquant_blocks`); a fused projection
  whose tensors have several types is stored as parts (`<name>.<i>.w`, …, their types and sizes in the
  config's `parts`); written from the GGUF alone, with neither torch nor transformers (`gguf_lean`);
- `int8`: int8 weights packed for the kernel's dot products (VNNI's layout) `[ceil(n/16), kp/4, 16, 4]`
  with a scale and a row sum per output, SmoothQuant folded into gate/up and down;
- `<dtype>-dense`: `w_t [k, n]` in that dtype for the torch lean runner (`lean.LeanRunner`).

Every start then maps the file (`tensorfile.MappedTensors`): no transformers model, no
transposes, no second copy, and processes reading the same model share its pages. The
embedding `[V, D]` is stored as it is (only the rows of ids seen are ever read), beside a rope table `[T,
hd/2, 2]` (a second one, `rope_sliding`, where sliding layers rotate by another base, as Gemma 3's do) and,
where the family has them, fp32 vectors per layer: `qkv_bias`, `q_norm`/`k_norm` (Qwen3, Gemma 3; OLMo 2's
over all of q and k) and `post_attn_norm`/`post_ffn_norm` (Gemma's sandwich norms, OLMo 2's output norms),
each padded to a multiple of 16. The file's metadata holds the architecture and a fingerprint (format version,
kind, the source's identity); a sidecar JSON records the file's size, mtime and BLAKE3. A file that does not
match, cannot be parsed, is truncated or changed is not read
(`LeanFileError`): the loader converts again (`load.lean.lean_weights`). The trust rule at each
start (`unchanged`) is the size and the mtime: the hash is computed only where the mtime changed
(hashing a 600 MB file at each start would cost seconds), so bytes changed in place with the
mtime put back are only found by `check`, which always rehashes (`chatcli pull --verify`). This module only
describes and opens the files; it imports neither torch nor numpy and starts no conversion.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chatcli.engine.weights import sidecar

FORMAT = 2  # 2: the families' fields and vectors
PANEL = 64  # fp32 panel width (decode.cpp's kPanel)
PROJECTIONS = ("qkv", "out", "gate_up", "down")
# a mixture of experts' layer (gguf only): the router [experts, D], every expert's gate_up stacked (all gates, then
# all ups: parts), every expert's down stacked; in place of gate_up and down
EXPERT_PROJECTIONS = ("router", "experts_gate_up", "experts_down")
INT8 = "int8"
GROUPED = ("q4", "q8")  # group-wise kinds (quant_blocks)
GGUF = "gguf"  # a GGUF's own types, per tensor (kquant_blocks)
BLOCKS = (*GROUPED, GGUF)  # the kinds whose RMSNorm weights are kept apart and whose embedding is blocks
GROUP = 32
VECTORS = ("qkv_bias", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")  # per layer, where a family has them
# gpt-oss's per layer, after the experts in the kernel's Layer: attention's output bias, the router's, the experts'
# (every one's gate_up bias, then every one's down bias), each head's attention sink
OAI_VECTORS = ("out_bias", "router_bias", "experts_bias", "sinks")
SOURCE_FILE = "source.txt"  # in each lean folder of the cache: the model folder it was converted from


class LeanFileError(ValueError):
    """A lean file that cannot be used as it is; the loader converts again."""


@dataclass(frozen=True)
class LeanConfig:
    """The architecture a lean file holds, and how it is stored."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int  # outputs of the head
    embed_rows: int  # rows of the embedding (ids below this are valid)
    eps: float
    positions: int  # rows of the rope table: the context limit
    kind: str  # "float32-panels", "int8", "q4", "q8", "<dtype>-dense"
    source: str  # the source model's identity (see source_key)
    format: int = FORMAT
    family: str = "llama"  # the source's model_type
    qkv_bias: bool = False  # layers.i.qkv_bias, added before rope (Qwen2)
    qk_norm: bool = False  # layers.i.q_norm / k_norm: RMSNorm of each head of q and k before rope (Qwen3, Gemma 3)
    post_norms: bool = False  # layers.i.post_attn_norm / post_ffn_norm on each block's output (Gemma)
    act: str = "silu"  # the gated MLP's activation: silu (SwiGLU), gelu_tanh (GeGLU) or swiglu_oai (gpt-oss's)
    attn_scale: float = 0.0  # the attention scores' scale (0: 1/sqrt(head_dim))
    attn_softcap: float = 0.0  # scores -> cap * tanh(scores / cap) (Gemma 2; 0: none)
    final_softcap: float = 0.0  # the same on the logits
    window: int = 0  # a sliding layer's window: each position sees itself and the window - 1 before it
    sliding: tuple = ()  # per layer: True where the window applies (empty: none)
    sliding_rope: bool = False  # sliding layers read `rope_sliding` (Gemma 3's local base)
    tied: bool = False  # q4 / q8: the embedding is read from the head's blocks (no embed tensor)
    embed_scale: float = 1.0  # q4 / q8: what each embedding row is multiplied by (Gemma: sqrt(D))
    parts: dict = field(default_factory=dict)  # gguf: per projection, its parts' [type, outputs] in order
    types: str = ""  # gguf: the file's tensor types, as llama.cpp names them ("Q4_K+Q6_K")
    experts: int = 0  # gguf: every layer a mixture of this many experts, `ffn` wide each (Qwen3-MoE, Mixtral; 0: none)
    experts_used: int = 0  # the experts a row takes
    norm_topk: bool = True  # their weights divided by their sum
    nope: tuple = ()  # per layer: True where q and k are not rotated (SmolLM3's every fourth layer; empty: none)
    pre_norms: bool = True  # RMSNorm before attention and the MLP (OLMo 2: none, its norms on the outputs)
    qk_norm_whole: bool = False  # q_norm / k_norm span all of q and all of k (OLMo 2), not each head
    residual_scale: float = 1.0  # each block's output times this as it joins the residual (Granite)
    logits_scaling: float = 1.0  # the logits divided by this (Granite)
    biases: bool = False  # gpt-oss: layers.i.out_bias, router_bias, experts_bias (`OAI_VECTORS`)
    sinks: bool = False  # gpt-oss: layers.i.sinks, a logit per head more in each softmax's denominator
    # gguf: the experts' projections left in the GGUF, read from its pages as it holds them (gguf_map, the kernel's
    # WEIGHT_RAW_* kinds): lean name -> its GGUF tensors, in its parts' order; no arrays of theirs in this file
    raw_experts: dict = field(default_factory=dict)

    def layer_window(self, i: int) -> int:
        """The positions layer i attends to at most (0: all of them)."""
        return self.window if self.sliding and self.sliding[i] else 0

    def rope_name(self, i: int) -> str | None:
        """The rope table layer i reads (None: it rotates nothing)."""
        if self.nope and self.nope[i]:
            return None
        return "rope_sliding" if self.sliding_rope and self.sliding[i] else "rope"

    @property
    def scale(self) -> float:
        return self.attn_scale or self.head_dim**-0.5

    def vectors(self) -> dict[str, int]:
        """The per-layer fp32 vectors this family has, by tensor name, with their length."""
        per = {}
        if self.qkv_bias:
            per["qkv_bias"] = self.qkv
        if self.qk_norm:
            per["q_norm"] = self.heads * self.head_dim if self.qk_norm_whole else self.head_dim
            per["k_norm"] = self.kv_heads * self.head_dim if self.qk_norm_whole else self.head_dim
        if self.post_norms:
            per["post_attn_norm"] = per["post_ffn_norm"] = self.hidden
        if self.biases:
            per["out_bias"], per["router_bias"] = self.hidden, self.experts
            per["experts_bias"] = self.experts * (2 * self.ffn + self.hidden)
        if self.sinks:
            per["sinks"] = self.heads
        return {f"layers.{i}.{name}": n for i in range(self.layers) for name, n in per.items()}

    @property
    def weights(self) -> str:
        """The projections' dtype: float32, bfloat16, float16, int8, q4 or q8."""
        return self.kind.split("-")[0]

    def norms(self) -> dict[str, int]:
        """The RMSNorm weights a grouped kind keeps apart (length each), by name: none for the others."""
        if self.kind not in BLOCKS:
            return {}
        names = ("attn_norm", "mlp_norm") if self.pre_norms else ()
        out = {f"layers.{i}.{n}": self.hidden for i in range(self.layers) for n in names}
        return {**out, "final_norm": self.hidden}

    @property
    def qkv(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def shapes(self) -> dict[str, tuple[int, int]]:
        """Every projection's (k inputs, n outputs), by tensor name prefix."""
        d, f, e = self.hidden, self.ffn, self.experts
        per = {"qkv": (d, self.qkv), "out": (self.heads * self.head_dim, d), "gate_up": (d, 2 * f), "down": (f, d)}
        if e:
            del per["gate_up"], per["down"]
            per.update(router=(d, e), experts_gate_up=(d, 2 * e * f), experts_down=(f, e * d))
        out = {f"layers.{i}.{p}": shape for i in range(self.layers) for p, shape in per.items()}
        out["head"] = (d, self.vocab)
        return out

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LeanConfig:
        try:
            fields = json.loads(text)
            return cls(**{**fields, "sliding": tuple(fields.get("sliding", ())), "nope": tuple(fields.get("nope", ()))})
        except (TypeError, ValueError, AttributeError) as exc:
            raise LeanFileError(f"the lean file's config does not parse: {exc}") from None


def norm_before(projection: str) -> str | None:
    """The RMSNorm weight a grouped kind keeps apart for a projection (`layers.3.qkv` → `layers.3.attn_norm`)."""
    if projection == "head":
        return "final_norm"
    layer, _, part = projection.rpartition(".")
    norm = {"qkv": "attn_norm", "gate_up": "mlp_norm", "router": "mlp_norm"}.get(part)
    return f"{layer}.{norm}" if norm else None


def scales_length(n: int, k: int) -> int:
    """The stored length of a q4 / q8 projection's fp16 scales (or mins): `[ceil(n/16), ceil(k/32), 16]`
    flat, rounded up to 64 bytes."""
    return -(-(-(-n // 16) * -(-k // GROUP) * 16) // 32) * 32


def block_arrays(kind: str, n: int, k: int) -> dict[str, tuple[str, tuple]]:
    """The arrays (dtype, shape) of one projection `[n, k]` of a block type: q4 / q8 (`quant_blocks.pack`;
    the mins `m` only where the type has them is left out here), a K-quant or IQ4 (`kquant_blocks.pack_k`) or a
    float one (`kquant_blocks.pack_float`: `[ceil(n/16), k, 16]` elements flat, padded to 64 bytes)."""
    blocks, groups = -(-n // 16), -(-k // GROUP)
    floats = {"f16": ("F16", 2), "bf16": ("BF16", 2), "f32": ("F32", 4)}  # a GGUF's float tensors' kinds
    if kind in floats:
        code, size = floats[kind]
        return {"w": (code, (-(-blocks * k * 16 * size // 64) * 64 // size,))}
    if kind in (*GROUPED, "iq4nl", "mxfp4"):  # IQ4_NL, MXFP4: indices as q4's codes (MXFP4's d as bf16)
        d = ("BF16" if kind == "mxfp4" else "F16", (scales_length(n, k),))
        return {"w": ("U8", (blocks, groups, 8 if kind == "q8" else 4, 64)), "d": d}
    if kind not in ("q2k", "q3k", "q4k", "q5k", "q6k", "iq4xs"):
        raise LeanFileError(f"unknown block type {kind!r}")
    supers = -(-k // 256)
    per_super = (-(-blocks * supers * 16 // 32) * 32,)  # fp16, padded to 64 bytes
    if kind == "iq4xs":  # indices as q4's codes, d per super-block, an int8 scale per output and group
        return {"w": ("U8", (blocks, groups, 4, 64)), "d": ("F16", per_super), "sc": ("U8", (blocks * groups * 16,))}
    if kind in ("q2k", "q3k"):  # 2-bit planes; Q3_K's third bits in hi; a byte per output and 16 inputs
        out = {"w": ("U8", (blocks, groups, 2, 64)), "d": ("F16", per_super), "sc": ("U8", (blocks * groups * 32,))}
        return {**out, "hi": ("U8", (blocks, groups, 64))} if kind == "q3k" else {**out, "m": ("F16", per_super)}
    out = {"w": ("U8", (blocks, groups, 4, 64)), "d": ("F16", per_super)}
    if kind == "q6k":
        return {**out, "hi": ("U8", (blocks, groups, 2, 64)), "sc": ("U8", (blocks * groups * 32,))}
    out.update({"m": ("F16", per_super), "sc": ("U8", (blocks * groups * 16,)), "sm": ("U8", (blocks * groups * 16,))})
    return {**out, "hi": ("U8", (blocks, groups, 64))} if kind == "q5k" else out


def block_strides(kind: str, k: int) -> dict[str, int]:
    """The bytes a block of 16 outputs takes in each array of a block type (`block_arrays`; `m` as `d`, as a
    type with mins stores it): in a stack of experts' rows, each a multiple of 16, an expert's arrays start at
    its first block times these (64 blocks' arrays need no padding)."""
    sizes = {"U8": 1, "F16": 2, "BF16": 2, "F32": 4}
    out = {}
    for key, (code, shape) in block_arrays(kind, 16 * 64, k).items():
        count = 1
        for d in shape:
            count *= d
        out[key] = count * sizes[code] // 64
    return {"m": out["d"], **out} if "d" in out else out


def rope_order(head_dim: int, rotary: int | None = None) -> list[int]:
    """Within a head, the dims in the lean order: the rotated dims' rotate-half pairs (i, i + r/2) as
    adjacent pairs (2i, 2i + 1), then the dims rope leaves alone (partial rotary) as they are."""
    r = rotary or head_dim
    return [d for i in range(r // 2) for d in (i, i + r // 2)] + list(range(r, head_dim))


def head_rows(n: int, heads: int, rotary: int | None = None) -> list[int]:
    """The row index that puts each of `heads` heads of n rows in `rope_order` (a list: numpy and
    torch index with it alike)."""
    hd = n // heads
    order = rope_order(hd, rotary)
    return [h * hd + d for h in range(heads) for d in order]


def padded16(n: int) -> int:
    """A stored vector's length: n rounded up to 16 floats (64 bytes, the file's alignment)."""
    return -(-n // 16) * 16


def source_key(folder: Path) -> str:
    """The identity of a model folder's weights and config: names, sizes and mtimes (stat only)."""
    h = hashlib.sha256(f"{FORMAT}".encode())
    for p in sorted(folder.iterdir()):
        if p.suffix in (".safetensors", ".bin", ".json", ".jinja", ".model") and p.is_file():
            st = p.stat()
            h.update(f"{p.name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def lean_path(folder: Path, kind: str) -> Path:
    """Where the lean file of `kind` for the model in `folder` lives: the user cache's
    `lean/<folder name>-<hash of its path>/<kind>-<source key>.safetensors`."""
    from chatcli.paths import cache_dir

    where = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:8]
    return cache_dir() / "lean" / f"{folder.name}-{where}" / f"{kind}-{source_key(folder)}.safetensors"


class LeanWeights:
    """An opened lean file: its config and the tensors' addresses (see `tensorfile.MappedTensors`)."""

    def __init__(self, path: Path, expect_kind: str | None = None, expect_source: str | None = None) -> None:
        from chatcli.engine.weights.tensorfile import MappedTensors, TensorFileError

        try:
            self.file = MappedTensors(path)
        except (OSError, TensorFileError) as exc:
            raise LeanFileError(str(exc)) from None
        self.config = LeanConfig.from_json(self.file.metadata.get("chatcli", "null"))
        c = self.config
        if (
            c.format != FORMAT
            or (expect_kind and c.kind != expect_kind)
            or (expect_source and c.source != expect_source)
        ):
            raise LeanFileError(f"{path.name} was made for {c.kind} of {c.source} (format {c.format})")
        self._check()

    def _check(self) -> None:
        """Every tensor the runners read is there with the shape the config implies."""
        c = self.config
        table = ("F32", (c.positions, c.head_dim // 2, 2))
        want = {"rope": table}
        matrices = dict(c.shapes())
        if c.kind not in BLOCKS:
            want["embed"] = ("F32", (c.embed_rows, c.hidden))
        elif not c.tied:  # q4 / q8: the embedding as blocks of its own where it is not the head
            matrices["embed"] = (c.hidden, c.embed_rows)
        if c.sliding_rope:
            want["rope_sliding"] = table
        for name, n in {**c.vectors(), **c.norms()}.items():
            want[name] = ("F32", (padded16(n),))
        code = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}.get(c.weights)
        for name, (k, n) in matrices.items():
            if c.kind == GGUF and name in c.raw_experts:
                continue  # in the GGUF (`raw_experts`)
            if c.kind == GGUF:
                parts = c.parts.get(name) or []
                if sum(size for _, size in parts) != n:
                    raise LeanFileError(f"{self.file.path.name}: {name}'s parts do not make its {n} outputs")
                for i, (kind, size) in enumerate(parts):
                    want.update({f"{name}.{i}.{key}": spec for key, spec in block_arrays(kind, size, k).items()})
            elif c.kind in GROUPED:
                blocks, groups = -(-n // 16), -(-k // GROUP)
                w = self.file.tensors.get(f"{name}.w")
                quads = w.shape[2] if w is not None and len(w.shape) == 4 and w.shape[2] in (4, 8) else 4
                want[f"{name}.w"] = ("U8", (blocks, groups, quads, 64))
                scales = ("F16", (scales_length(n, k),))
                want[f"{name}.d"] = scales
                if f"{name}.m" in self.file.tensors:
                    want[f"{name}.m"] = scales
            elif c.weights == INT8:
                kp, blocks = -(-k // 4) * 4, -(-n // 16)
                want[f"{name}.w"] = ("I8", (blocks, kp // 4, 16, 4))
                want[f"{name}.scale"] = ("F32", (blocks * 16,))
                want[f"{name}.wsum"] = ("I32", (blocks * 16,))
            elif c.kind.endswith("-panels"):
                want[name] = (code, (-(-n // PANEL), k, PANEL))
            else:
                want[name] = (code, (k, n))
        for name, (dtype, shape) in want.items():
            info = self.file.tensors.get(name)
            if info is None or info.dtype != dtype or info.shape != shape:
                got = f"{info.dtype} {list(info.shape)}" if info else "missing"
                raise LeanFileError(f"{self.file.path.name}: {name} is {got}, expected {dtype} {list(shape)}")

    def address(self, name: str) -> int:
        return self.file.address(name)

    def array(self, name: str):
        return self.file.array(name)


def prune(keep: Path, kind: str) -> None:
    """Remove this kind's files made from earlier versions of the model's files, and the lean
    folders of models whose folder is gone (`sweep`)."""
    for other in keep.parent.glob(f"{kind}-*.safetensors"):
        if other != keep and not other.name.startswith(f"{keep.stem}."):  # its experts' files (gguf_experts) stay
            sidecar.remove(other)
    sweep(keep.parent.parent)


def sweep(root: Path | None = None) -> list[Path]:
    """Remove the lean folders (under `root`, the cache's `lean/` by default) of models whose folder is
    gone (each names its model's in SOURCE_FILE), and the temporaries killed writers left in the others
    (`paths.sweep_temps`); the folders removed."""
    import shutil

    from chatcli.paths import cache_dir, sweep_temps

    root = root or cache_dir() / "lean"
    removed = []
    try:
        folders = [p for p in root.iterdir() if p.is_dir()]
    except OSError:
        return removed
    for folder in folders:
        try:
            source = Path((folder / SOURCE_FILE).read_text())
        except FileNotFoundError:
            source = None
        except OSError:
            continue
        if source is not None and not source.exists():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            continue
        sweep_temps(folder)
    return removed
