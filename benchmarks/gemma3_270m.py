"""A random model of Gemma 3 270M's shapes, written as an F16 GGUF for llama.cpp's quantizer (issue 49's
vocab-heavy file: a tied 262,144-row embedding beside 18 narrow layers, 15 of them with a 512-position window).

    python benchmarks/gemma3_270m.py F16.gguf
    llama-quantize F16.gguf Q4_K_M.gguf Q4_K_M    # as GGUF-my-repo makes google/gemma-3-270m's (rows of 640: Q5_0
                                                  # and Q8_0 where a K-quant does not fit), 235 MiB
    chatcli bench -m Q4_K_M.gguf --depth 0,4096,10800 --vs llama.cpp --vs ik

google/gemma-3-270m's config (hidden 640, 18 layers, 4 query heads and 1 KV head of 256, intermediate 2,048,
rope 1M global / 10K local, context 32,768), transformers' random initialisation (seed 0), the embedded SmolLM2's
tokenizer padded to the vocabulary with unused tokens (`tests/gguf_models.py`). Speed, not quality.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' GGUF writer


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python benchmarks/gemma3_270m.py OUT.gguf")
    import torch
    import transformers

    from tests.gguf_models import write_gguf

    config = transformers.Gemma3TextConfig(
        vocab_size=262_144,
        hidden_size=640,
        intermediate_size=2048,
        num_hidden_layers=18,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=512,
        max_position_embeddings=32_768,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    print(write_gguf(transformers.Gemma3ForCausalLM(config), sys.argv[1], "F16"))


if __name__ == "__main__":
    main()
