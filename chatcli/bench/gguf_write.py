"""A transformers Llama written as a GGUF (`gguf` package), for llama.cpp to run the same weights.

For `chatcli bench --shape` (`bench/shapes.py`), which builds random models of a real model's
shapes and times llama.cpp on them beside chatcli. The tokenizer is the embedded SmolLM2 GGUF's (its 49,152
tokens, padded with unused tokens up to the model's vocabulary, or only its first tokens and their merges where
the vocabulary is smaller); q and k rows are permuted the way llama.cpp's own converter permutes them (its
rope pairs dims (2i, 2i + 1), transformers' (i, i + hd/2)), so the GGUF computes what the transformers model computes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def start_llama_gguf(path: Path, fields: dict, qtype: str, arch: str = "llama"):
    """A GGUFWriter for a Llama (or another `arch` of Llama's keys: qwen3moe) of these config fields
    (hidden_size, num_hidden_layers, …, as a LlamaConfig names them), its metadata and tokenizer written,
    its tensors to add."""
    import gguf

    from chatcli.engine.load.sources import embedded_gguf
    from chatcli.engine.weights.gguf_file import GGUFFile

    heads, kv_heads = fields["num_attention_heads"], fields["num_key_value_heads"]
    hd = fields.get("head_dim") or fields["hidden_size"] // heads
    vocab = fields["vocab_size"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(fields.get("max_position_embeddings", 2048))
    w.add_embedding_length(fields["hidden_size"])
    w.add_block_count(fields["num_hidden_layers"])
    w.add_feed_forward_length(fields["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(float(fields.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(fields.get("rms_norm_eps", 1e-6)))
    w.add_vocab_size(vocab)
    w.add_file_type(getattr(gguf.LlamaFileType, f"MOSTLY_{qtype}") if qtype != "F32" else gguf.LlamaFileType.ALL_F32)
    source = GGUFFile(embedded_gguf())  # its header only, in one pass (gguf's GGUFReader takes ~5 s)
    try:
        fields = source.fields
    finally:
        source.close()
    tokens = [t.encode() for t in fields["tokenizer.ggml.tokens"]]
    merges = [m.encode() for m in fields["tokenizer.ggml.merges"]]
    if vocab < len(tokens):  # a smaller vocabulary (Mixtral's 32,000): only the merges of the tokens kept
        kept = set(tokens[:vocab])
        merges = [m for m in merges if all(part in kept for part in (*m.split(b" ", 1), m.replace(b" ", b"", 1)))]
    types = [int(t) for t in fields["tokenizer.ggml.token_type"]]
    tokens += [f"<unused_{i}>".encode() for i in range(len(tokens), vocab)]
    types += [gguf.TokenType.UNUSED] * (vocab - len(types))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens[:vocab])
    w.add_token_types(types[:vocab])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    template = fields.get("tokenizer.chat_template")
    if template is not None:
        w.add_chat_template(template)
    return w


def finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def finish_streamed(w, arrays) -> None:
    """Write a file whose tensors were declared (`add_tensor_info`), then each one's data from `arrays`, in order."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for array in arrays:
        w.write_tensor_data(array)
    w.close()


def write_random_gguf(fields: dict, path: Path, seed: int = 0) -> Path:
    """A random Llama of these shapes straight to an F16 GGUF (no transformers model, no fp32 copy of
    the whole: each tensor drawn and rounded in turn), its embedding tied, norms 1 — llama.cpp's
    quantizer's input for `chatcli bench --shape --gguf-type`."""
    w = start_llama_gguf(path, fields, "F16")
    rng = np.random.default_rng(seed)
    d, f = fields["hidden_size"], fields["intermediate_size"]
    heads, kv_heads = fields["num_attention_heads"], fields["num_key_value_heads"]
    hd = fields.get("head_dim") or d // heads

    def add(name: str, rows: int, cols: int) -> None:
        w.add_tensor(name, (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16))

    add("token_embd.weight", fields["vocab_size"], d)
    for i in range(fields["num_hidden_layers"]):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, np.float32))
        add(f"blk.{i}.attn_q.weight", heads * hd, d)
        add(f"blk.{i}.attn_k.weight", kv_heads * hd, d)
        add(f"blk.{i}.attn_v.weight", kv_heads * hd, d)
        add(f"blk.{i}.attn_output.weight", d, heads * hd)
        add(f"blk.{i}.ffn_gate.weight", f, d)
        add(f"blk.{i}.ffn_up.weight", f, d)
        add(f"blk.{i}.ffn_down.weight", d, f)
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    finish(w)
    return path


def write_llama_gguf(model, path: Path, qtype: str = "Q4_0") -> Path:
    from chatcli.engine.weights.lean_file import head_rows

    c = model.config
    heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
    fields = {k: getattr(c, k) for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")}
    fields.update(
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=getattr(c, "head_dim", None),
        max_position_embeddings=c.max_position_embeddings,
        rope_theta=float(c.rope_parameters["rope_theta"]),
        rms_norm_eps=float(c.rms_norm_eps),
    )
    w = start_llama_gguf(path, fields, qtype)
    import gguf

    quant = getattr(gguf.GGMLQuantizationType, qtype)

    def add(name: str, tensor, quantized: bool = True):
        array = tensor if isinstance(tensor, np.ndarray) else tensor.detach().float().numpy()
        array = np.ascontiguousarray(array, dtype=np.float32)
        if quantized and array.ndim == 2 and qtype != "F32":
            w.add_tensor(name, gguf.quants.quantize(array, quant), raw_dtype=quant)
        else:
            w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))

    inner = model.model
    add("token_embd.weight", inner.embed_tokens.weight)
    for i, block in enumerate(inner.layers):
        a, m = block.self_attn, block.mlp
        add(f"blk.{i}.attn_norm.weight", block.input_layernorm.weight, False)
        add(f"blk.{i}.ffn_norm.weight", block.post_attention_layernorm.weight, False)
        # llama.cpp's rope pairs (2i, 2i + 1), as the lean files' do: the same row order as `rope_order`
        add(f"blk.{i}.attn_q.weight", a.q_proj.weight[head_rows(a.q_proj.weight.shape[0], heads)])
        add(f"blk.{i}.attn_k.weight", a.k_proj.weight[head_rows(a.k_proj.weight.shape[0], kv_heads)])
        add(f"blk.{i}.attn_v.weight", a.v_proj.weight)
        add(f"blk.{i}.attn_output.weight", a.o_proj.weight)
        add(f"blk.{i}.ffn_gate.weight", m.gate_proj.weight)
        add(f"blk.{i}.ffn_up.weight", m.up_proj.weight)
        add(f"blk.{i}.ffn_down.weight", m.down_proj.weight)
    add("output_norm.weight", inner.norm.weight, False)
    if not c.tie_word_embeddings:
        add("output.weight", model.lm_head.weight)
    finish(w)
    return path
