"""A tiny random Llama with a small trained BPE tokenizer and a ChatML template.

Built from a config in a few seconds, offline: the unit tests' model.
"""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "Hello, how are you today? I am fine, thank you!",
    "Ünïcödé, accents: café, naïve, résumé. Ça va?",
    "中文测试：你好，世界。日本語のテキスト。한국어 텍스트.",
    "Emoji: 🙂 🚀 🎉 👍🏽 and symbols ∑ ∫ √ ≠.",
    "def main():\n    print('hello world')\n    return 0\n",
    "  leading spaces and\ttabs\nnew lines\n\n",
] * 20

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHATML
    return fast


def build_model(vocab_size: int, max_positions: int = 256, seed: int = 0):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(family_config("llama", vocab_size, max_positions))
    with torch.no_grad():  # random weights with a little more contrast than the init, so argmax is stable
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    return model.eval()


def build_tiny_model_dir(folder: Path, max_positions: int = 256) -> Path:
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), max_positions)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def lean_weights(model, kind: str, folder: Path, tokenizer=None):
    """`model` converted into a lean file of `kind` in `folder` (no cache involved), opened."""
    from chatcli.engine.weights.lean_convert import convert_lean
    from chatcli.engine.weights.lean_file import LeanWeights

    path = folder / f"{kind}.safetensors"
    convert_lean(folder, path, kind, "test", model_loader=lambda: (model, tokenizer))
    return LeanWeights(path, kind, "test")


WINDOW = 8  # the tiny families' sliding window: short enough that the tests' sequences pass it


def family_config(family: str, vocab_size: int, max_positions: int = 128):
    """A tiny config of a lean family with each of its extras switched on (see chatcli.engine.weights.families)."""
    import transformers as t

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    if family == "llama":
        return t.LlamaConfig(**common)
    if family == "mistral":
        return t.MistralConfig(**common, sliding_window=WINDOW)
    if family == "qwen2":  # q/k/v biases; the second layer slides
        return t.Qwen2Config(**common, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    if family == "qwen3":  # q/k norms, heads wider than hidden / heads
        return t.Qwen3Config(**common, head_dim=32)
    if family == "phi3":  # fused projections, partial rotary, a window on every layer
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        return t.Phi3Config(**common, rope_parameters=rope, sliding_window=WINDOW)
    if family == "phi3-longrope":  # the long-context rope: the lean context stops at the original one
        half = 8  # head_dim 16 -> 8 rotary pairs
        rope = {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.1 * i for i in range(half)],
            "long_factor": [2.0 + 0.5 * i for i in range(half)],
            "original_max_position_embeddings": max_positions // 2,
        }
        return t.Phi3Config(**common, rope_parameters=rope, original_max_position_embeddings=max_positions // 2)
    if family == "phi4-mini":  # Phi-4-mini's shape: three quarters of each head rotated, tied, longrope
        pairs = 6  # head_dim 16 x 0.75 -> 12 rotated dims
        rope = {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.75,
            "short_factor": [1.0 + 0.1 * i for i in range(pairs)],
            "long_factor": [2.0 + 0.5 * i for i in range(pairs)],
            "original_max_position_embeddings": max_positions // 2,
        }
        return t.Phi3Config(**common, rope_parameters=rope, original_max_position_embeddings=max_positions // 2)
    if family == "smollm3":  # four layers: the fourth rotates nothing (no_rope_layer_interval 4)
        return t.SmolLM3Config(**{**common, "num_hidden_layers": 4})
    if family == "granite":  # its four multipliers, none of them 1 (Granite 3.x's are 12, 1/128, 0.22, 8)
        return t.GraniteConfig(
            **common, embedding_multiplier=3.0, attention_multiplier=0.1, residual_multiplier=0.4, logits_scaling=2.5
        )
    if family == "olmo2":  # norms on the blocks' outputs, q/k norms over all of q and k; untied, as OLMo 2 is
        return t.Olmo2Config(**{**common, "tie_word_embeddings": False})
    if family == "olmo3":  # OLMo 2's, a sliding layer on plain rope and a full one on YaRN
        rope = {
            "full_attention": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                               "original_max_position_embeddings": max_positions // 4},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        }  # fmt: skip
        return t.Olmo3Config(
            **{**common, "tie_word_embeddings": False},
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters=rope,
        )
    if family == "gemma2":  # alternating windows, soft-capped scores and logits, its own query scale
        return t.Gemma2Config(
            **common,
            head_dim=16,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
            query_pre_attn_scalar=24,
        )
    if family == "gemma3_text":  # q/k norms and a second rope base for the sliding layers
        return t.Gemma3TextConfig(
            **common,
            head_dim=16,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=16,
        )
    raise ValueError(family)


def build_family(family: str, vocab_size: int, max_positions: int = 128, seed: int = 0, **overrides):
    """A tiny random model of a lean family; norms and biases random too, so that each one counts, and
    q/k small enough that attention spreads over many positions (so that a window changes it).
    `overrides`: config fields set over the family's (head_dim=32: heads a q8_0 KV cache takes)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = family_config(family, vocab_size, max_positions)
    for name, value in overrides.items():
        setattr(config, name, value)
    model = AutoModelForCausalLM.from_config(config)
    qk = 6.0 if family == "smollm3" else 0.5  # SmolLM3: sharp enough that a layer's rope (or none) counts
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.mul_(qk if any(f"{x}_proj" in name for x in ("q", "k", "qkv")) else 4.0)
            elif "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p) if "gemma" not in family else 0.3 * torch.randn_like(p))
            else:  # biases
                p.copy_(0.5 * torch.randn_like(p))
    return model.eval()
