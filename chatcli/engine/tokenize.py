"""Ingress: chat messages → token ids through the model's chat template and BPE tokenizer.

Also knows which ids end a reply: every end-of-sequence id the model config, the
generation config and the tokenizer define, plus the end-of-turn markers of common
chat templates when the vocabulary has them.
"""

from __future__ import annotations

from typing import Iterable, Sequence

# End-of-turn markers of widespread chat templates (ChatML, Llama 3, Gemma, Phi).
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end_of_turn|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")


class ChatTokenizer:
    def __init__(self, tokenizer, model_config=None, generation_config=None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.stop_ids = frozenset(self._stop_ids(tokenizer, model_config, generation_config))

    @staticmethod
    def _stop_ids(tokenizer, model_config, generation_config) -> set[int]:
        ids: set[int] = set()
        for source in (model_config, generation_config, tokenizer):
            ids.update(_as_ids(getattr(source, "eos_token_id", None)))
        vocab = tokenizer.get_vocab()
        ids.update(vocab[m] for m in END_OF_TURN_MARKERS if m in vocab)
        return ids

    def encode_chat(self, messages: Sequence[dict]) -> list[int]:
        """The whole conversation, templated with the assistant's turn opened."""
        ids = self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return [int(i) for i in ids]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _as_ids(value) -> Iterable[int]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
