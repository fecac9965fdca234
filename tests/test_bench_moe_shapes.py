"""`chatcli bench --shape gpt-oss-20b --gguf-type MXFP4_MOE` and `--shape mixtral-8x7b --gguf-type Q4_K_M`.

The real shapes are 7 to 9 GiB files; these tests write tiny stand-ins of the same kinds with the same writer
(`gguf_blocks.write_random_blocks`), read them back with chatcli's GGUF reader (types, shapes, keys) and run
them on the kernel; the real shapes are checked by their byte counts only (`file_bytes`, no file).
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from chatcli.bench import bench_command
from chatcli.bench import gguf_blocks as gb
from chatcli.bench import shapes as sh

TINY_OAI = dict(  # gpt-oss-20b's kind: rows of 6 x 32 (not whole K-quant blocks, as 2,880), q heads wider than D
    gguf_arch="gpt-oss",
    hidden_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=192,
    num_experts=8,
    num_experts_per_tok=4,
    sliding_window=4,
    vocab_size=1000,
    rope_theta=150000.0,
    rope_factor=32.0,
    original_max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    max_position_embeddings=64,
)
TINY_MIXTRAL = dict(  # Mixtral's kind: a llama of 8 experts, 2 a token, a vocabulary smaller than SmolLM2's
    gguf_arch="llama",
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=512,
    num_experts=8,
    num_experts_per_tok=2,
    vocab_size=1000,
    rope_theta=1000000.0,
    tie_word_embeddings=False,
    max_position_embeddings=64,
)


def _finite_logits(path) -> object:
    from chatcli.engine.load.build import load_engine
    from tests.gguf_runs import IDS

    runner = load_engine(str(path)).runner
    assert np.isfinite(runner.verify(IDS, runner.new_cache())).all()
    return runner


def test_a_gpt_oss_shape_is_mxfp4_experts_q8_0_elsewhere_and_runs(kernel, tmp_path):
    """MXFP4_MOE as llama.cpp's quantizer makes it: the experts MXFP4, every other matrix Q8_0 (the output's
    too), biases, sinks, norms and the router F32; gpt-oss's keys (window, YaRN); chatcli runs it."""
    from chatcli.engine.weights.gguf_file import GGUFFile

    assert gb.shape_types(TINY_OAI) == ("Q8_0", "F16", "MXFP4_MOE")  # 192 is no whole K-quant super-block
    path = gb.write_random_blocks(TINY_OAI, tmp_path / "oai.gguf", "MXFP4_MOE")
    header = GGUFFile(path)
    types = {name: t.type_name for name, t in header.tensors.items()}
    assert header.arch == "gpt-oss" and header.hp("attention.sliding_window") == 4
    assert header.hp("rope.scaling.type") == "yarn" and header.hp("rope.scaling.factor") == 32.0
    assert header.hp("expert_feed_forward_length") == 192 and header.hp("expert_used_count") == 4
    assert types["blk.1.ffn_gate_exps.weight"] == types["blk.0.ffn_down_exps.weight"] == "MXFP4"
    assert types["output.weight"] == types["token_embd.weight"] == types["blk.1.attn_q.weight"] == "Q8_0"
    f32 = ("attn_sinks.weight", "attn_q.bias", "attn_output.bias", "ffn_gate_inp.weight", "ffn_gate_inp.bias")
    assert {types[f"blk.1.{name}"] for name in (*f32, "ffn_down_exps.bias", "post_attention_norm.weight")} == {"F32"}
    assert "blk.0.ffn_norm.weight" not in header.tensors and "blk.0.attn_q_norm.weight" not in header.tensors
    assert header.tensors["blk.0.attn_q.weight"].shape == (192, 256)  # GGUF's [k, rows]: 4 heads of 64 from 192
    assert header.tensors["blk.0.ffn_up_exps.bias"].shape == (192, 8)
    assert sum(t.n_bytes for t in header.tensors.values()) == gb.file_bytes(TINY_OAI, "MXFP4_MOE")
    header.close()
    runner = _finite_logits(path)
    assert runner.config.experts == 8 and runner.active_bytes < runner.weight_bytes


def test_a_mixtral_shape_is_llamas_8_expert_mix_and_runs(kernel, tmp_path):
    """A llama with experts (no q/k norms, no expert_feed_forward_length), Q4_K_M as llama.cpp gives 8 experts:
    Q8_0 attn_k / attn_v, Q5_K attn_output; its 1,000 tokens the SmolLM2 tokenizer's first, with their merges."""
    from chatcli.engine.weights.gguf_file import GGUFFile

    path = gb.write_random_blocks(TINY_MIXTRAL, tmp_path / "mixtral.gguf", "Q4_K_M")
    header = GGUFFile(path)
    types = {name: t.type_name for name, t in header.tensors.items()}
    assert header.arch == "llama" and header.hp("expert_count") == 8 and header.hp("expert_used_count") == 2
    assert header.hp("expert_feed_forward_length") is None and "blk.0.attn_q_norm.weight" not in header.tensors
    assert types["blk.2.attn_k.weight"] == types["blk.2.attn_v.weight"] == "Q8_0"
    assert types["blk.2.attn_output.weight"] == "Q5_K" and types["blk.2.attn_q.weight"] == "Q4_K"
    assert types["output.weight"] == types["blk.2.ffn_down_exps.weight"] == "Q6_K"  # use_more_bits' layer
    assert types["blk.1.ffn_down_exps.weight"] == types["blk.1.ffn_gate_exps.weight"] == "Q4_K"
    assert header.tensors["blk.1.ffn_gate_exps.weight"].shape == (256, 512, 8)
    assert sum(t.n_bytes for t in header.tensors.values()) == gb.file_bytes(TINY_MIXTRAL, "Q4_K_M")
    tokens, merges = header.fields["tokenizer.ggml.tokens"], header.fields["tokenizer.ggml.merges"]
    kept = set(tokens)
    assert len(tokens) == 1000 and merges and all(m.replace(" ", "", 1) in kept for m in merges)
    header.close()
    runner = _finite_logits(path)
    assert runner.config.experts == 8


def test_the_real_shapes_file_sizes_and_kept_layers():
    """gpt-oss-20b whole as MXFP4_MOE is ggml-org's gpt-oss-20b-mxfp4.gguf's 12.1 GB; on 24 GiB fewer of its
    24 layers. Mixtral-8x7B whole is ~28 GB as Q4_K_M; its file here is held to 7 GiB (8 of 32 layers)."""
    oai, mixtral = sh.SHAPES["gpt-oss-20b"], sh.SHAPES["mixtral-8x7b"]
    assert 12.0e9 < gb.file_bytes(oai, "MXFP4_MOE") < 12.2e9
    assert "Q4_K_M" not in gb.shape_types(oai)
    layers = gb.fitting_layers(oai, "MXFP4_MOE", memory=24 * 2**30)
    assert 12 <= layers < 24
    assert gb.file_bytes({**oai, "num_hidden_layers": layers}, "MXFP4_MOE") <= gb.MEMORY_SHARE * 24 * 2**30
    assert 27e9 < gb.file_bytes(mixtral, "Q4_K_M") < 30e9
    layers = gb.fitting_layers(mixtral, "Q4_K_M", memory=64 * 2**30)  # memory enough: the 7 GiB cap decides
    assert layers == 8
    assert gb.file_bytes({**mixtral, "num_hidden_layers": 8}, "Q4_K_M") <= 7 * 2**30
    assert gb.file_bytes({**mixtral, "num_hidden_layers": 9}, "Q4_K_M") > 7 * 2**30


def test_the_new_shapes_refusals_are_one_line(monkeypatch):
    from chatcli.bench import baseline

    monkeypatch.setattr(baseline, "llama_python", lambda: None)
    result = CliRunner().invoke(bench_command, ["--shape", "gpt-oss-20b"])
    assert result.exit_code == 1 and "add --gguf-type MXFP4_MOE" in " ".join(result.output.split())
    result = CliRunner().invoke(bench_command, ["--shape", "gpt-oss-20b", "--gguf-type", "Q4_K_M"])
    assert result.exit_code == 1
    assert "--shape gpt-oss-20b is written as Q8_0, F16, MXFP4_MOE, not Q4_K_M" in " ".join(result.output.split())
    result = CliRunner().invoke(bench_command, ["--shape", "mixtral-8x7b"])
    assert result.exit_code == 1 and "add --gguf-type Q4_K_M" in " ".join(result.output.split())


def test_the_file_is_written_alone_with_its_layers_said(tmp_path, monkeypatch, capsys):
    """`python -m chatcli.bench.gguf_blocks SHAPE TYPE FILE`: the file a `--shape` bench runs on, kept, its layers
    said; a type the shape is not written as, one line."""
    monkeypatch.setitem(sh.SHAPES, "tiny-oai", TINY_OAI)
    one = gb.file_bytes({**TINY_OAI, "num_hidden_layers": 1}, "MXFP4_MOE")
    monkeypatch.setattr(gb, "memory_bytes", lambda: int(one / gb.MEMORY_SHARE) + 1)
    assert gb.main(["tiny-oai", "MXFP4_MOE", str(tmp_path / "t.gguf")]) == 0
    assert "a random tiny-oai, 1 of its 2 layers" in capsys.readouterr().out
    assert (tmp_path / "t.gguf").stat().st_size > one
    assert gb.main(["tiny-oai", "Q4_K_M", str(tmp_path / "u.gguf")]) == 1
    assert capsys.readouterr().out.strip() == "--shape tiny-oai is written as Q8_0, F16, MXFP4_MOE, not Q4_K_M"
    assert not (tmp_path / "u.gguf").exists()
    assert gb.main(["gpt-9"]) == 2


@pytest.mark.parametrize("kind", ["MXFP4", "Q5_K"])
def test_random_blocks_of_the_new_types_are_small_finite_weights(kind):
    import gguf

    raw = gb.random_data(np.random.default_rng(0), kind, (4, 256))
    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
    assert values.shape == (4, 256) and np.isfinite(values).all() and 1e-3 < np.abs(values).mean() < 5e-2


def test_the_table_says_a_shapes_file_cap():
    """Mixtral's 8 of 32 layers are its 7 GiB cap's doing, not the memory's alone: the table says so."""
    from rich.console import Console

    from chatcli.bench.report import render_gguf_type

    ours = {"decode_tok_s": 1.0, "prefill_tok_s": 2.0, "weights": "gguf Q4_K", "active_mib": 1.0, "weights_mib": 4.0}
    result = {"shape": "mixtral-8x7b", "gguf_type": "Q4_K_M", "layers": 8, "layers_of": 32, "max_file_gib": 7.0}
    result |= {"file_mib": 6913.0, "cpu": "a CPU", "threads": 2, "chatcli": ours, "llama_cpp": {"error": "not run"}}
    console = Console(record=True, width=200)
    render_gguf_type(result, console)
    text = " ".join(console.export_text().split())
    assert (
        "mixtral-8x7b (8 of its 32 layers)" in text
        and "8 layers: the file the memory of this machine holds, at most 7 GiB" in text
    )
