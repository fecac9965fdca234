"""`chatcli bench --shape`: a random model of a real model's shapes, beside llama.cpp on the same weights.

The real shapes (1B parameters) are for the benchmark; these tests run the same path on a tiny
config: the q4/q8 lean file takes the GGUF's blocks as they are (the same weights llama.cpp
reads), the children report speed and memory, and bad combinations get one line.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from chatcli.bench import bench_command
from chatcli.bench import shapes as sh
from chatcli.engine.runners import kernels

TINY = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    vocab_size=1000,
    rope_theta=10000.0,
)


@pytest.mark.parametrize("quantize", [None, "int8", "q4", "q8"])
def test_a_shape_runs_each_kind(kernel, quantize):
    result = sh.run_shape(TINY, quantize, context=20, new_tokens=6, prefill_tokens=48, llama_python=None)
    ours = result["chatcli"]
    assert ours["kind"] == sh.KINDS[quantize] and result["llama_cpp"] is None
    assert ours["decode_tok_s"] > 0 and ours["prefill_tok_s"] > 0 and ours["peak_rss_kib"] > 1000
    assert ours["kernel"] == kernels.build_name() and ours["kernel"] in kernels.BUILDS  # the build the child ran
    if quantize in ("q4", "q8"):  # every projection part (7 a layer) and the head: the GGUF's own blocks
        assert ours["blocks"].startswith(f"Took {7 * TINY['num_hidden_layers'] + 1} weights")


def test_the_lean_file_holds_the_gguf_blocks(kernel, tmp_path):
    gguf = pytest.importorskip("gguf")
    from chatcli.bench.gguf_write import write_llama_gguf
    from chatcli.engine.runners.native import NativeRunner
    from chatcli.engine.weights.lean_convert import convert_lean
    from chatcli.engine.weights.lean_file import LeanWeights

    model = sh.build(TINY)
    sh.round_to(model, "Q4_0")
    path = write_llama_gguf(model, tmp_path / "m.gguf", "Q4_0")
    lean = tmp_path / "q4.safetensors"
    convert_lean(tmp_path, lean, "q4", "t", model_loader=lambda: (model, sh.RandomIds(1000)), gguf_file=path)
    runner = NativeRunner(LeanWeights(lean, "q4", "t"))
    assert "layers.0.qkv.m" not in runner.weights.file.tensors  # Q4_0: no mins, 4.5 bits a weight
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    t = tensors["blk.1.ffn_down.weight"]
    want = gguf.quants.dequantize(t.data, t.tensor_type)
    assert np.array_equal(want, model.model.layers[1].mlp.down_proj.weight.detach().numpy())  # rounded in place
    # the q4 model computes with exactly those weights: against fp32 on the rounded model, only the
    # activations' int8 rounding is left
    fp32 = tmp_path / "f.safetensors"
    convert_lean(tmp_path, fp32, "float32-panels", "t", model_loader=lambda: (model, sh.RandomIds(1000)))
    ref = NativeRunner(LeanWeights(fp32, "float32-panels", "t"))
    ids = list(range(5, 40))
    a, b = ref.forward(ids, ref.new_cache()), runner.forward(ids, runner.new_cache())
    assert float(np.linalg.norm(a - b) / np.linalg.norm(a)) < 0.05


def test_shape_refusals_are_one_line(tiny_model_dir):
    result = CliRunner().invoke(bench_command, ["--shape", "llama-3.2-1b", "--model", str(tiny_model_dir)])
    assert result.exit_code == 1 and "leave out --model" in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = CliRunner().invoke(bench_command, ["--shape", "qwen2.5-0.5b", "--quantize", "q5"])
    assert result.exit_code == 2 and "'--quantize': 'q5' is not one of" in result.output  # refused as parsed
    result = CliRunner().invoke(bench_command, ["--shape", "gpt-9"])
    assert result.exit_code == 2 and "gpt-9" in result.output


def test_the_table_names_both_sides(kernel):
    from rich.console import Console

    from chatcli.bench.report import render_shape

    result = sh.run_shape(TINY, "q4", context=20, new_tokens=4, prefill_tokens=32, llama_python=None)
    console = Console(record=True, width=120)
    render_shape({"cpu": "test cpu", **result}, console)
    text = console.export_text()
    assert "chatcli q4" in text and "decode tok/s" in text and "peak RSS MiB" in text
    assert f"threads · kernel {kernels.build_name()}" in " ".join(text.split())  # the title may wrap
    assert "llama.cpp: not installed" in text
    failed = {**result, "cpu": "c", "llama_cpp": {"quant": "Q4_0", "file_mib": 1.0, "error": "RuntimeError: exit -11"}}
    console = Console(record=True, width=120)
    render_shape(failed, console)
    assert "llama.cpp: RuntimeError: exit -11" in console.export_text()


def test_gguf_type_asks_for_llama_cpps_quantizer(monkeypatch):
    """Without llama-cpp-python a file is written as random blocks of Q4_K_M, Q8_0 or F16 (gguf_blocks);
    any other type needs llama.cpp's quantizer."""
    from chatcli.bench import baseline

    monkeypatch.setattr(baseline, "llama_python", lambda: None)
    result = CliRunner().invoke(bench_command, ["--shape", "llama-3.2-1b", "--gguf-type", "Q5_K_M"])
    assert result.exit_code == 1 and "llama.cpp's own quantizer" in result.output
    result = CliRunner().invoke(bench_command, ["--shape", "qwen3-30b-a3b", "--gguf-type", "Q5_K_M"])
    assert "--shape qwen3-30b-a3b is written as Q4_K_M, Q8_0, F16, MXFP4_MOE" in " ".join(result.output.split())
    result = CliRunner().invoke(bench_command, ["--shape", "qwen3-30b-a3b"])
    assert result.exit_code == 1 and "is a mixture of experts: add --gguf-type" in " ".join(result.output.split())
    result = CliRunner().invoke(bench_command, ["--gguf-type", "Q4_K_M"])
    assert result.exit_code == 1 and "takes --shape" in result.output


def test_the_random_f16_gguf_is_what_the_quantizer_takes(tmp_path):
    """`write_random_gguf`: the shape's tensors in F16 (norms F32), tied, with a tokenizer and chat
    template that chatcli reads from the file itself."""
    from chatcli.bench.gguf_write import write_random_gguf
    from chatcli.engine.weights import gguf_meta
    from chatcli.engine.weights.gguf_file import GGUFFile

    fields = {**TINY, "hidden_size": 256, "intermediate_size": 512, "max_position_embeddings": 64}
    header = GGUFFile(write_random_gguf(fields, tmp_path / "r.gguf"))
    assert header.tensors["blk.1.ffn_down.weight"].shape == (512, 256)
    assert header.tensors["blk.0.attn_k.weight"].type_name == "F16" and "output.weight" not in header.tensors
    assert header.tensors["output_norm.weight"].type_name == "F32"
    assert gguf_meta.save(header, tmp_path) and (tmp_path / "chat_template.jinja").is_file()


TINY_MOE = dict(  # Qwen3-30B-A3B's kind of shape, tiny: 16 experts of 256 (not 8: Mixtral's mix), two a token
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=512,
    moe_intermediate_size=256,
    num_experts=16,
    num_experts_per_tok=2,
    vocab_size=1000,
    rope_theta=1000000.0,
    tie_word_embeddings=False,
)


def test_random_blocks_are_a_file_of_llama_cpps_mix_that_chatcli_runs(kernel, tmp_path):
    """`gguf_blocks.write_random_blocks`: Q4_K_M's types (Q6_K for the output and the use_more_bits layers'
    attn_v and ffn_down_exps, the router F32), the bytes `file_bytes` counts, a model whose logits are finite."""
    from chatcli.bench.gguf_blocks import file_bytes, write_random_blocks
    from chatcli.engine.weights.gguf_file import GGUFFile
    from tests.gguf_runs import IDS

    path = write_random_blocks({**TINY_MOE, "max_position_embeddings": 64}, tmp_path / "moe.gguf", "Q4_K_M")
    header = GGUFFile(path)
    types = {name: t.type_name for name, t in header.tensors.items()}
    assert types["output.weight"] == types["blk.2.ffn_down_exps.weight"] == types["blk.3.attn_v.weight"] == "Q6_K"
    assert types["blk.0.ffn_down_exps.weight"] == types["blk.2.ffn_up_exps.weight"] == "Q4_K"
    assert types["blk.1.ffn_gate_inp.weight"] == types["blk.1.attn_q_norm.weight"] == "F32"
    assert header.tensors["blk.1.ffn_gate_exps.weight"].shape == (256, 256, 16)
    assert sum(t.n_bytes for t in header.tensors.values()) == file_bytes(TINY_MOE, "Q4_K_M")
    from chatcli.engine.load.build import load_engine

    runner = load_engine(str(path)).runner
    assert runner.config.experts == 16 and runner.active_bytes < runner.weight_bytes
    assert np.isfinite(runner.verify(IDS, runner.new_cache())).all()


def test_the_layers_kept_fit_the_memory():
    from chatcli.bench.gguf_blocks import MEMORY_SHARE, file_bytes, fitting_layers

    qwen3 = sh.SHAPES["qwen3-30b-a3b"]
    whole = file_bytes(qwen3, "Q4_K_M")
    assert 17.0 < whole / 2**30 < 17.6  # Qwen3-30B-A3B-Q4_K_M.gguf is 17.3 GiB
    assert fitting_layers(qwen3, "Q4_K_M", memory=2 * whole / MEMORY_SHARE) == 48
    layers = fitting_layers(qwen3, "Q4_K_M", memory=24 * 2**30)
    assert 20 <= layers < 48
    kept = file_bytes({**qwen3, "num_hidden_layers": layers}, "Q4_K_M")
    more = file_bytes({**qwen3, "num_hidden_layers": layers + 1}, "Q4_K_M")
    assert kept <= MEMORY_SHARE * 24 * 2**30 < more


def test_a_mixture_of_experts_shape_runs_without_llama_cpp(kernel, monkeypatch):
    """`--shape --gguf-type` on a mixture of experts: random blocks, fewer layers where the memory says so,
    chatcli's first start, one-shots, decode and prefill; llama.cpp said not to have run; the table says all."""
    from rich.console import Console

    from chatcli.bench import gguf_blocks
    from chatcli.bench.gguf_types import run_gguf_type
    from chatcli.bench.report import render_gguf_type

    monkeypatch.setitem(sh.SHAPES, "tiny-moe", TINY_MOE)
    three = gguf_blocks.file_bytes({**TINY_MOE, "num_hidden_layers": 3}, "Q4_K_M")
    monkeypatch.setattr(gguf_blocks, "memory_bytes", lambda: int(three / gguf_blocks.MEMORY_SHARE) + 1)
    result = run_gguf_type("tiny-moe", "Q4_K_M", context=20, new_tokens=6, prefill_tokens=48, runs=1)
    ours = result["chatcli"]
    assert result["layers"] == 3 and result["layers_of"] == 4 and result["blocks"] == "random, written here"
    assert ours["decode_tok_s"] > 0 and ours["prefill_tok_s"] > 0 and ours["first_start_exit"] == 0
    assert 0 < ours["active_mib"] < ours["weights_mib"]
    assert "not run" in result["llama_cpp"]["error"]
    console = Console(record=True, width=160)
    render_gguf_type({**result, "cpu": "a CPU"}, console)
    text = console.export_text()
    assert "tiny-moe (3 of its 4 layers)" in text and "weights a token reads MiB" in text
    assert "llama.cpp: not run" in text


def test_the_8b_shape_is_the_size_of_the_file_users_download():
    """Llama-3.1-8B at Q4_K_M is a 4.9 GB download: its output head apart from the embedding (Q6_K, 0.43 GB)."""
    from chatcli.bench.gguf_blocks import file_bytes

    assert 4.85e9 < file_bytes(sh.SHAPES["llama-3.1-8b"], "Q4_K_M") < 4.95e9


def test_a_shape_with_an_output_head_of_its_own_builds_one():
    model = sh.build({**TINY, "tie_word_embeddings": False})
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    tied = sh.build(TINY)
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
