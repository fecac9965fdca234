"""Memory follows the conversation, not the declared context; `--ctx-size` caps the context.

A model whose GGUF declares a context of 2^24 positions loads and answers in the memory a small one
takes (its lean file's rope table stops at `families.MAX_CONTEXT` rows, written a chunk at a time;
the KV cache holds what was written), checked in a process whose address space is bounded. A KV
cache past its up-front size doubles (`kv.memory.grown`) and gives the logits of a cache reserved
whole, to the bit. `--ctx-size` (a `LoadOptions` field: the flag of every loading command, the
config file's `ctx_size`) caps the engine's `context_limit`: the stats', the overflow error's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from chatcli.engine import ContextOverflow, LoadError, LoadOptions, SamplingParams
from chatcli.engine.events import Finished
from chatcli.engine.kv import memory as kv_memory
from chatcli.engine.load.build import load_engine
from chatcli.engine.weights.families import MAX_CONTEXT
from tests.gguf_models import tiny, write_gguf

DECLARED = 1 << 24
GREEDY = SamplingParams(temperature=0, max_tokens=4)


@pytest.fixture(scope="module")
def long_gguf(tmp_path_factory):
    """A tiny llama whose GGUF declares a context of 2^24 positions."""
    model = tiny("llama", False)
    model.config.max_position_embeddings = DECLARED
    return write_gguf(model, tmp_path_factory.mktemp("long") / "long.gguf", "Q8_0")


def one_shot(*args, tmp_path, config: str | None = None, limit_bytes: int | None = None):
    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "config.toml"), "CHATCLI_DATA_DIR": str(tmp_path / "data")}
    if config is not None:
        (tmp_path / "config.toml").write_text(config)

    def bound():  # in the child, before exec: its address space at most limit_bytes
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    argv = [sys.executable, "-m", "chatcli", *args]
    return subprocess.run(argv, capture_output=True, env=env, timeout=120, preexec_fn=bound if limit_bytes else None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS bounds a process's address space on Linux")
def test_a_declared_context_of_2_24_answers_within_3_gib_of_address_space(long_gguf, tmp_path):
    # before: the rope table for 2^24 positions, 4 GiB of float32 beside 4 GiB of float64 angles
    result = one_shot(
        "-m", str(long_gguf), "-p", "hi", "--max-tokens", "4", "--json", tmp_path=tmp_path, limit_bytes=3 << 30
    )
    assert result.returncode == 0, result.stderr.decode()
    stats = json.loads(result.stdout)["stats"]
    assert stats["context_limit"] == MAX_CONTEXT < DECLARED
    per_position = 2 * 2 * 2 * 64 * 4  # k and v, 2 layers, 2 kv heads of 64, at most fp32
    assert 0 < stats["kv_cache_bytes"] <= stats["context_tokens"] * per_position


def test_the_cache_is_far_below_the_declared_context(long_gguf):
    engine = load_engine(str(long_gguf))
    runner = engine.runner
    assert engine.context_limit == MAX_CONTEXT
    (lean,) = runner.files()
    assert lean.stat().st_size < 64 << 20  # the rope table for 2^24 positions alone would be 4 GiB
    cache = runner.new_cache()
    runner.forward([1, 5, 17, 200], cache)
    assert cache.capacity <= MAX_CONTEXT <= DECLARED // 128
    four = cache.nbytes
    runner.forward([3, 9, 11, 2], cache)
    assert 0 < four < 1 << 20 and cache.nbytes == 2 * four  # the positions written, not the context
    events = list(engine.generate([{"role": "user", "content": "hi"}], engine.new_session(), GREEDY))
    assert isinstance(events[-1], Finished) and events[-1].stats.completion_tokens == 4


def test_the_cache_doubles_past_its_first_size_with_the_logits_of_a_whole_one(kernel, tmp_path, monkeypatch):
    from tests.gguf_runs import direct_runner

    model = tiny("llama", False)
    model.config.max_position_embeddings = 512
    runner = direct_runner(model, "Q8_0", tmp_path, limit=512)
    whole = runner.new_cache()  # reserved for the whole context up front
    monkeypatch.setattr(kv_memory, "CACHE_BLOCK", 16)
    monkeypatch.setattr(kv_memory, "RESERVE_BYTES", 1)  # too little to reserve: start at a block and grow
    growing = runner.new_cache()
    assert whole.capacity == 0 == growing.capacity  # nothing before the first forward
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(3, 500, 40)]
    assert np.array_equal(runner.forward(prompt, growing), runner.forward(prompt, whole))
    capacities = [growing.capacity]
    for step in range(200):
        token = int(rng.integers(3, 500))
        assert np.array_equal(runner.forward([token], growing), runner.forward([token], whole)), step
        capacities.append(growing.capacity)
    assert whole.capacity == 512
    assert sorted(set(capacities)) == [48, 96, 192, 384]  # whole blocks for the prompt, then twice as many
    assert growing.nbytes == whole.nbytes


def test_ctx_size_caps_the_context(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), LoadOptions(device="cpu", ctx_size=40))
    assert engine.context_limit == 40
    assert engine.runner.new_cache().limit == 40
    with pytest.raises(ContextOverflow, match="the model's context is 40"):
        list(engine.generate([{"role": "user", "content": "word " * 60}], engine.new_session(), GREEDY))
    own = load_engine(str(tiny_model_dir), LoadOptions(device="cpu")).context_limit
    assert load_engine(str(tiny_model_dir), LoadOptions(device="cpu", ctx_size=10**9)).context_limit == own


@pytest.mark.parametrize("bad", [0, -5, True, "many"])
def test_a_bad_ctx_size_is_one_line(tiny_model_dir, bad):
    with pytest.raises(LoadError, match=r"^--ctx-size must be a whole number of tokens, 1 or more, got "):
        load_engine(str(tiny_model_dir), LoadOptions(device="cpu", ctx_size=bad))


def test_the_one_shot_takes_ctx_size_from_the_flag_or_the_config(tiny_model_dir, tmp_path):
    model = ("-m", str(tiny_model_dir), "--device", "cpu", "-p", "hi", "--max-tokens", "2", "--json")
    flag = one_shot(*model, "--ctx-size", "48", tmp_path=tmp_path)
    assert flag.returncode == 0, flag.stderr.decode()
    assert json.loads(flag.stdout)["stats"]["context_limit"] == 48
    configured = one_shot(*model, tmp_path=tmp_path, config="ctx_size = 56\n")
    assert json.loads(configured.stdout)["stats"]["context_limit"] == 56
    both = one_shot(*model, "--ctx-size", "48", tmp_path=tmp_path, config="ctx_size = 56\n")
    assert json.loads(both.stdout)["stats"]["context_limit"] == 48  # the flag wins
    small = one_shot(*model[:-3], "--ctx-size", "8", tmp_path=tmp_path)
    assert small.returncode != 0
    assert small.stderr.decode().strip().endswith("the model's context is 8")


@pytest.mark.parametrize(
    ("args", "config", "line"),
    [
        (("--ctx-size", "0"), None, "chatcli: error: Invalid value for '--ctx-size': 0 is not in the range x>=1."),
        (
            ("--ctx-size", "abc"),
            None,
            "chatcli: error: Invalid value for '--ctx-size': 'abc' is not a valid integer range.",
        ),
        ((), 'ctx_size = "big"\n', "ctx_size must be a whole number of tokens, 1 or more, got 'big'"),
    ],
)
def test_a_bad_ctx_size_is_refused_in_one_line(tiny_model_dir, tmp_path, args, config, line):
    result = one_shot("-m", str(tiny_model_dir), "-p", "hi", *args, tmp_path=tmp_path, config=config)
    err = result.stderr.decode()
    assert result.returncode == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert line in err
    assert result.stdout == b""


def test_every_loading_command_takes_ctx_size():
    from chatcli.bench import bench_command
    from chatcli.cli import app
    from chatcli.server.cli import serve_command

    for command in (app, serve_command, bench_command, app.get_command(None, "pull")):
        (option,) = [p for p in command.params if p.name == "ctx_size"]
        assert option.opts == ["--ctx-size"] and option.type.name == "integer range", command.name


def test_bench_runs_at_the_ctx_size(tiny_model_dir):
    from click.testing import CliRunner

    from chatcli.bench import bench_command

    fast = ["--no-baseline", "--no-ceiling", "--no-startup", "--no-llama-cpp", "--no-quality", "--lookup", "0"]
    small = ["--turns", "0", "--max-tokens", "4", "--prefill-tokens", "16"]
    args = ["--model", str(tiny_model_dir), "--device", "cpu", "--ctx-size", "200", *fast, *small, "--json"]
    result = CliRunner().invoke(bench_command, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["context_limit"] == 200


def test_serve_loads_at_the_ctx_size_of_the_flag_or_the_config(tiny_model_dir, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from chatcli.server import cli as server_cli

    limits = []
    monkeypatch.setattr(server_cli, "serve", lambda load, **_kw: limits.append(load().context_limit))
    (tmp_path / "config.toml").write_text("ctx_size = 72\n")
    monkeypatch.setenv("CHATCLI_CONFIG", str(tmp_path / "config.toml"))
    model = ["--model", str(tiny_model_dir), "--device", "cpu"]
    for args in ([], ["--ctx-size", "64"]):
        result = CliRunner().invoke(server_cli.serve_command, [*model, *args])
        assert result.exit_code == 0, result.output
    assert limits == [72, 64]  # /v1/models gives it as max_model_len, the overflow error names it
