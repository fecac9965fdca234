"""The text stage: chat messages → token ids (`tokenize`: the chat template and the BPE tokenizer)
and sampled ids → text (`detokenize`: incremental, with stop strings held back)."""
