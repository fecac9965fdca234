"""GGUF files with Q3_K and Q2_K tensors read directly (gguf_lean, kquant_blocks' `q3k` / `q2k`).

As tests/test_gguf_direct.py does for the other types: tiny random models written as GGUF files in
llama.cpp-like Q3_K_M and Q2_K mixes (Q3_K or Q2_K beside Q4_K, Q5_K, Q6_K) and in Q3_K or Q2_K alone;
the native runner over the file's own blocks gives the logits of transformers over the same weights
(each put through its type's quantization) within the int8 activations' rounding, over a prefill and
decode steps; a draft's logits are bit-equal to single steps' in each kernel build; and the lean file
stays within 1.1x of the GGUF's bytes.
"""

from __future__ import annotations

import re

import pytest

from tests.gguf_models import tiny, uniform
from tests.gguf_runs import (
    assert_close,
    assert_drafts_are_single_steps,
    assert_near_the_files_size,
    computed,
    direct_runner,
)


def _layer(name: str) -> int:
    match = re.match(r"blk\.(\d+)\.", name)
    return int(match.group(1)) if match else -1


def Q3_K_M(name: str, shape: tuple[int, ...], *, n_layers: int | None = None, has_output: bool = True) -> str:
    """Roughly llama.cpp's Q3_K_M mix: Q6_K for the output (the embedding where tied), attn_v Q5_K in
    the first two layers and Q4_K after, attn_output Q4_K, ffn_down Q5_K in the first sixteenth of
    the layers and Q4_K after, Q3_K elsewhere."""
    del shape
    if name == "output.weight" or (name == "token_embd.weight" and not has_output):
        return "Q6_K"
    if name.endswith("attn_v.weight"):
        return "Q5_K" if _layer(name) < 2 else "Q4_K"
    if name.endswith("ffn_down.weight"):
        return "Q5_K" if _layer(name) < max(1, (n_layers or 16) // 16) else "Q4_K"
    return "Q4_K" if name.endswith("attn_output.weight") else "Q3_K"


Q3_K_M.file_type = "MOSTLY_Q3_K_M"


def Q2_K_MIX(name: str, shape: tuple[int, ...], *, has_output: bool = True) -> str:
    """Roughly llama.cpp's Q2_K mix: Q6_K for the output, attn_v Q4_K, ffn_down and attn_output Q3_K,
    Q2_K elsewhere."""
    del shape
    if name == "output.weight" or (name == "token_embd.weight" and not has_output):
        return "Q6_K"
    if name.endswith("attn_v.weight"):
        return "Q4_K"
    return "Q3_K" if name.endswith(("ffn_down.weight", "attn_output.weight")) else "Q2_K"


Q2_K_MIX.file_type = "MOSTLY_Q2_K"

CASES = [
    ("llama", True, Q3_K_M),
    ("llama", False, Q3_K_M),
    ("qwen2", False, Q3_K_M),
    ("qwen3", True, Q2_K_MIX),
    ("llama", False, Q2_K_MIX),
    ("llama", True, uniform("Q3_K")),
    ("qwen2", True, uniform("Q2_K")),
]
ids = lambda c: getattr(c, "__name__", str(c))  # noqa: E731


@pytest.mark.parametrize(("family", "tied", "types"), CASES, ids=ids)
def test_a_low_bit_gguf_read_directly_computes_its_own_weights(kernel, tmp_path, family, tied, types):
    model = tiny(family, tied)
    runner = direct_runner(model, types, tmp_path)
    c = computed(model, types, runner)
    assert {"Q3_K", "Q2_K"} & c.types and set(runner.config.types.split("+")) == c.types
    assert_close(c)


@pytest.mark.parametrize(("family", "tied", "types"), [CASES[0], CASES[3]], ids=ids)
def test_a_low_bit_draft_gives_the_bits_of_single_steps(build, tmp_path, family, tied, types):
    assert_drafts_are_single_steps(direct_runner(tiny(family, tied), types, tmp_path))


@pytest.mark.parametrize(
    ("types", "kinds", "bound"),
    [
        (Q3_K_M, {"Q3_K", "Q4_K", "Q5_K", "Q6_K"}, 1.1),
        (uniform("Q3_K"), {"Q3_K"}, 1.04),
        (uniform("Q2_K"), {"Q2_K"}, 1.0),
    ],
    ids=ids,
)
def test_the_lean_file_stays_near_the_ggufs_size(kernel, tmp_path, types, kinds, bound):
    assert_near_the_files_size(tmp_path, types, kinds, bound)
