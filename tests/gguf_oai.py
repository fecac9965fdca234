"""A tiny random gpt-oss (transformers' `GptOssForCausalLM`) and its GGUF as llama.cpp's converter writes one.

`tiny_gptoss(seed)`: 2 layers (the first sliding, window 4, the second attending to all), 4 heads of 64, 2 KV
heads, 8 experts of 256 of which a token takes 4, every bias and sink random, YaRN rope (factor 32 from 4096,
`truncate` True: llama.cpp floors and ceils the correction dims), gate/up weights large enough that the SwiGLU's
clamp at 7 bites. `write_gptoss(model, path, experts)`: the `gpt-oss` GGUF, the experts' gate, up and down
de-interleaved (transformers' gate_up holds gate and up alternately) and stacked as [experts, rows, k], in
`experts` ("F32" or "MXFP4"), everything else F32, the embedded SmolLM2 tokenizer (`gguf_models.add_tokenizer`).
`use_file_experts(model)` puts MXFP4's values into the model, so that transformers computes the file's weights.
`write_gptoss(..., harmony=True)`: the tokenizer's last ids are Harmony's control tokens and its chat template
`HARMONY_TEMPLATE`, gpt-oss's own in miniature (written after the structure of openai/gpt-oss-20b's template: the
tools as a TypeScript-like namespace in the developer message, an assistant's `tool_calls` as a commentary
message to `functions.NAME` after its `thinking` on the analysis channel, a past final answer without its
reasoning, a tool result as a message from `functions.NAME`).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from tests.gguf_models import VOCAB, add_tokenizer, embedded_tokenizer

HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
HARMONY_TEMPLATE = (
    "{%- if tools %}<|start|>developer<|message|># Tools\n\nnamespace functions {\n"
    "{%- for t in tools %}\n// {{ t.function.description }}\ntype {{ t.function.name }} = (_: "
    "{{ t.function.parameters | tojson }}) => any;\n{%- endfor %}\n} // namespace functions<|end|>{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or message.role == 'system' %}"
    "<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{%- set call = message.tool_calls[0].function %}"
    "{%- if message.content and message.thinking %}{{ raise_exception('content and thinking beside a call') }}"
    "{%- elif message.content or message.thinking %}"
    "<|start|>assistant<|channel|>analysis<|message|>{{ message.content or message.thinking }}<|end|>{%- endif %}"
    "<|start|>assistant to=functions.{{ call.name }}<|channel|>commentary json<|message|>"
    "{{ call.arguments | tojson }}<|call|>"
    "{%- elif message.role == 'assistant' %}"
    "<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>"
    "{%- elif message.role == 'tool' %}"
    "<|start|>functions.{{ message.name or 'tool' }} to=assistant<|channel|>commentary<|message|>"
    "{{ message.content | tojson }}<|end|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}"
)


def add_harmony_tokenizer(writer, vocab: int) -> None:
    """The embedded tokenizer cut to `vocab` ids, its last ones Harmony's control tokens, gpt-oss's template."""
    import gguf

    tokens, kinds, merges, others = embedded_tokenizer()
    keep = vocab - len(HARMONY_TOKENS)
    kept = set(tokens[:keep])

    def fits(merge: bytes) -> bool:
        left, right = merge.split(b" ", 1)
        return left in kept and right in kept and left + right in kept

    writer.add_tokenizer_model(others["tokenizer.ggml.model"][0])
    writer.add_tokenizer_pre(others["tokenizer.ggml.pre"][0])
    writer.add_token_list(tokens[:keep] + [t.encode() for t in HARMONY_TOKENS])
    writer.add_token_types(kinds[:keep] + [int(gguf.TokenType.CONTROL)] * len(HARMONY_TOKENS))
    writer.add_token_merges([m for m in merges if fits(m)])
    for key, (value, vtype, sub_type) in others.items():
        if key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
            continue
        if not (key.endswith("_token_id") and value >= keep):
            writer.add_key_value(key, value, vtype, sub_type=sub_type)
    writer.add_chat_template(HARMONY_TEMPLATE)


ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0}
ROPE |= {"original_max_position_embeddings": 4096, "truncate": True}


def tiny_gptoss(seed: int = 0):
    import transformers as t

    config = t.GptOssConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_local_experts=8,
        num_experts_per_tok=4,
        sliding_window=4,
        max_position_embeddings=128,
        rope_parameters=dict(ROPE),
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = t.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("router.weight"):  # logits ~5: gaps between the 4th and 5th wide enough
                p.copy_(5.0 / 16.0 * torch.randn_like(p))
            elif name.endswith("gate_up_proj"):  # outputs ~5: the clamp at 7 bites now and then
                p.copy_(0.3 * torch.randn_like(p))
            elif name.endswith("down_proj"):
                p.copy_(0.08 * torch.randn_like(p))
            elif name.endswith("sinks"):
                p.copy_(1.0 + torch.randn_like(p))
            elif p.dim() > 1:
                p.copy_(0.08 * torch.randn_like(p))
            else:  # biases
                p.copy_(0.5 * torch.randn_like(p))
    return model.eval()


def _f32(tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().float().cpu().numpy(), dtype=np.float32)


def expert_tensors(experts) -> dict[str, np.ndarray]:
    """transformers' experts as llama.cpp's converter writes them: gate, up and down [E, rows, k] and their biases
    [E, rows] (gate_up [E, D, 2F] holds gate and up alternately, transposed)."""
    gate_up, bias = experts.gate_up_proj, experts.gate_up_proj_bias
    return {
        "ffn_gate_exps.weight": _f32(gate_up[:, :, ::2].transpose(1, 2)),
        "ffn_up_exps.weight": _f32(gate_up[:, :, 1::2].transpose(1, 2)),
        "ffn_down_exps.weight": _f32(experts.down_proj.transpose(1, 2)),
        "ffn_gate_exps.bias": _f32(bias[:, ::2]),
        "ffn_up_exps.bias": _f32(bias[:, 1::2]),
        "ffn_down_exps.bias": _f32(experts.down_proj_bias),
    }


def tensors(model) -> dict[str, np.ndarray]:
    inner = model.model
    out = {"token_embd.weight": _f32(inner.embed_tokens.weight)}
    for i, block in enumerate(inner.layers):
        a, b = block.self_attn, f"blk.{i}."
        out[b + "attn_norm.weight"] = _f32(block.input_layernorm.weight)
        for short, proj in (("q", a.q_proj), ("k", a.k_proj), ("v", a.v_proj), ("output", a.o_proj)):
            out[f"{b}attn_{short}.weight"], out[f"{b}attn_{short}.bias"] = _f32(proj.weight), _f32(proj.bias)
        out[b + "attn_sinks.weight"] = _f32(a.sinks)
        out[b + "post_attention_norm.weight"] = _f32(block.post_attention_layernorm.weight)
        out[b + "ffn_gate_inp.weight"] = _f32(block.mlp.router.weight)
        out[b + "ffn_gate_inp.bias"] = _f32(block.mlp.router.bias)
        out.update({b + name: array for name, array in expert_tensors(block.mlp.experts).items()})
    out["output_norm.weight"] = _f32(inner.norm.weight)
    out["output.weight"] = _f32(model.lm_head.weight)
    return out


def quantized(array: np.ndarray, kind: str) -> np.ndarray:
    return gguf.quants.quantize(array, gguf.GGMLQuantizationType[kind])


def write_gptoss(model, path: Path, experts: str = "F32", harmony: bool = False, context: int = 0) -> Path:
    c = model.config
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("chatcli-test")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(context or c.max_position_embeddings)  # more: room for a tools prompt
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_expert_feed_forward_length(c.intermediate_size)
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(float(ROPE["rope_theta"]))
    w.add_layer_norm_rms_eps(float(c.rms_norm_eps))
    w.add_sliding_window(c.sliding_window)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(ROPE["factor"])
    w.add_rope_scaling_orig_ctx_len(ROPE["original_max_position_embeddings"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE if experts == "MXFP4" else gguf.LlamaFileType.ALL_F32)
    (add_harmony_tokenizer if harmony else add_tokenizer)(w, c.vocab_size)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for name, array in tensors(model).items():
        kind = experts if name.endswith("_exps.weight") else "F32"
        data = quantized(array, kind) if kind != "F32" else array
        w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def use_file_experts(model, kind: str = "MXFP4") -> None:
    """Each expert weight of `model` replaced, in place, by what `kind` makes of it (the file's values)."""

    def rounded(values: torch.Tensor) -> torch.Tensor:  # [E, rows, k] as the file holds it
        array = _f32(values)
        raw = quantized(array, kind)
        back = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(array.shape)
        return torch.from_numpy(np.ascontiguousarray(back))

    with torch.no_grad():
        for block in model.model.layers:
            e = block.mlp.experts
            e.gate_up_proj[:, :, ::2] = rounded(e.gate_up_proj[:, :, ::2].transpose(1, 2)).transpose(1, 2)
            e.gate_up_proj[:, :, 1::2] = rounded(e.gate_up_proj[:, :, 1::2].transpose(1, 2)).transpose(1, 2)
            e.down_proj.copy_(rounded(e.down_proj.transpose(1, 2)).transpose(1, 2))
