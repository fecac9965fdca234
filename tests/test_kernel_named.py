"""Which build of the compiled kernel runs a forward, as `chatcli bench` and the TUI's header say it
(`ModelRunner.kernel`): the native runner's build (avx512, avx2, neon), else "off (why)" on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from chatcli.bench.gguf_types import _copy_kernel
from chatcli.bench.shapes import CHATCLI_CHILD
from chatcli.engine.load.hf import build_engine
from chatcli.engine.runners import kernels


def test_each_runner_names_the_kernel(kernel, tiny_loaded, tiny_model_dir):
    from chatcli.engine.load.hf import LoadOptions, load

    assert build_engine(tiny_loaded, runner="lean", kv_dtype="float32").runner.kernel == kernels.build_name()
    assert kernels.build_name() in kernels.BUILDS
    torch_lean = build_engine(tiny_loaded, runner="lean", kv_dtype="float32", kernel=False).runner
    assert torch_lean.kernel == "off (the torch lean runner, asked)"
    bf16_weights = build_engine(load(str(tiny_model_dir), LoadOptions(device="cpu", dtype="bfloat16")), runner="lean")
    assert bf16_weights.runner.kernel == (
        "off (it takes float32 weights and a float32, bfloat16, float16 or q8_0 KV cache)"
    )
    assert build_engine(tiny_loaded, runner="hf", kv_dtype="float32").runner.kernel == "off (the transformers runner)"


def test_off_the_cpu_there_is_no_kernel_to_name(tiny_loaded):
    runner = build_engine(tiny_loaded, runner="hf", kv_dtype="float32").runner
    runner.device = "cuda"
    assert runner.kernel is None


def child(model, env_kernel: str | None, tmp_path) -> dict:
    """The `--gguf-type` child (`shapes.CHATCLI_CHILD` on `-m MODEL`) in a cache of its own that holds
    the compiled kernel, with CHATCLI_KERNEL as given."""
    cache = tmp_path / f"cache-{env_kernel}"
    _copy_kernel(cache)
    for name in kernels.runnable():  # the builds this session has, so that the child builds none
        built = kernels.library_path(kernels.compiler(), name)
        for part in built.parent.glob(f"{built.stem}.*"):
            (cache / "kernels" / part.name).write_bytes(part.read_bytes())
    env = {**os.environ, "CHATCLI_CACHE_DIR": str(cache), "CHATCLI_DATA_DIR": str(tmp_path / "data")}
    env.pop(kernels.ENV, None)
    if env_kernel:
        env[kernels.ENV] = env_kernel
    ids = list(range(5, 25))
    args = {"model": str(model), "prefill": ids, "decode": ids[:8], "new_tokens": 3, "threads": 1}
    done = subprocess.run(
        [sys.executable, "-c", CHATCLI_CHILD, json.dumps(args)], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("env_kernel", [None, "off", "avx2"])
def test_the_gguf_type_child_says_which_build_ran(kernel, tiny_model_dir, tmp_path, env_kernel):
    if env_kernel == "avx2" and "avx2" not in kernels.runnable():
        pytest.skip("the CPU cannot run the avx2 build")
    got = child(tiny_model_dir, env_kernel, tmp_path)["kernel"]
    want = {None: kernels.build_name(), "off": "off (CHATCLI_KERNEL=off)", "avx2": "avx2"}[env_kernel]
    assert got == want


def test_the_gguf_type_table_names_the_build():
    from rich.console import Console

    from chatcli.bench.report import render_gguf_type

    ours = {"weights": "gguf Q4_K", "decode_tok_s": 50.0, "prefill_tok_s": 300.0, "kernel": "avx2"}
    result = {"shape": "llama-3.2-1b", "gguf_type": "Q4_K_M", "file_mib": 800.0, "cpu": "c", "threads": 2}
    console = Console(record=True, width=160)
    render_gguf_type({**result, "chatcli": ours, "llama_cpp": None}, console)
    assert "2 threads · kernel avx2" in " ".join(console.export_text().split())  # the title wraps
    console = Console(record=True, width=160)
    render_gguf_type({**result, "chatcli": {**ours, "kernel": "off (CHATCLI_KERNEL=off)"}}, console)
    assert "kernel off (CHATCLI_KERNEL=off)" in " ".join(console.export_text().split())
