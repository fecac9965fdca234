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
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
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
    model = LlamaForCausalLM(config)
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
    from chatcli.engine.lean_convert import convert_lean
    from chatcli.engine.lean_weights import LeanWeights

    path = folder / f"{kind}.safetensors"
    convert_lean(folder, path, kind, "test", model_loader=lambda: (model, tokenizer))
    return LeanWeights(path, kind, "test")
