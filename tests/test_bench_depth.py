"""`chatcli bench --depth … --vs …` on a tiny GGUF, the peers' llama-bench played by a script that
answers as each one's JSON does (llama.cpp's rows carry `n_depth`; ik_llama.cpp's decode at depth is a
`-gp N,n` row). Benchmarks are not tests: nothing here asserts a speed of chatcli's."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from click.testing import CliRunner

from chatcli.bench import bench_command
from tests.gguf_models import tiny, write_gguf

FAKE = """\
    import json, sys
    args = sys.argv[1:]
    def value(flag):
        return args[args.index(flag) + 1] if flag in args else None
    open({log!r}, "a").write(json.dumps(args) + "\\n")
    p, n = int(value("-p")), int(value("-n"))
    if value("-d"):  # llama.cpp's: pp and tg at each depth, each row naming it
        rows = [
            row
            for d in map(int, value("-d").split(","))
            for row in (
                dict(n_prompt=p, n_gen=0, n_depth=d, avg_ts=1000.0 + d),
                dict(n_prompt=0, n_gen=n, n_depth=d, avg_ts=100.0 + d),
            )
        ]
    else:  # ik_llama.cpp's: pp and tg at depth 0, then each -gp N,g (g generated after N), no n_depth
        rows = [dict(n_prompt=p, n_gen=0, avg_ts=1000.0), dict(n_prompt=0, n_gen=n, avg_ts=100.0)]
        for i, a in enumerate(args):
            if a == "-gp":
                N, g = map(int, args[i + 1].split(","))
                rows.append(dict(n_prompt=N, n_gen=g, avg_ts=50.0 + N))
    print(json.dumps(rows))
"""


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    model = tiny("llama", True)
    model.config.max_position_embeddings = 512  # room for the bench's decode prompt after a depth
    return write_gguf(model, tmp_path_factory.mktemp("depth") / "tiny.gguf", "F32")


@pytest.fixture
def peers(tmp_path, monkeypatch):
    log = tmp_path / "argv.jsonl"
    script = tmp_path / "llama-bench"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE).format(log=str(log)))
    script.chmod(0o755)
    monkeypatch.setenv("CHATCLI_LLAMA_BENCH", str(script))
    monkeypatch.setenv("CHATCLI_IK_BENCH", str(script))
    return log


def bench(*args: str):
    return CliRunner().invoke(bench_command, list(args))


def test_rows_by_depth_beside_each_peers_own_llama_bench(tiny_gguf, peers):
    result = bench(
        "-m", str(tiny_gguf), "--depth", "0,80", "--vs", "llama.cpp", "--vs", "ik",
        "--max-tokens", "4", "--prefill-tokens", "16", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert [row["depth"] for row in out["rows"]] == [0, 80]
    shallow, deep = out["rows"]
    assert shallow["context_tokens"] == 0 and abs(deep["context_tokens"] - 80) <= 8  # the depth asked, to a few tokens
    assert all(row["decode_tokens"] == 4 and 16 <= row["prefill_tokens"] <= 24 for row in out["rows"])
    lcpp, ik = out["peers"]["llama.cpp"], out["peers"]["ik"]
    assert lcpp["rows"] == {
        "0": {"prefill_tok_s": 1000.0, "decode_tok_s": 100.0},
        "80": {"prefill_tok_s": 1080.0, "decode_tok_s": 180.0},
    }
    assert ik["rows"] == {"0": {"prefill_tok_s": 1000.0, "decode_tok_s": 100.0}, "80": {"decode_tok_s": 130.0}}
    ran = [json.loads(line) for line in peers.read_text().splitlines()]
    threads = str(out["threads"])
    assert ran[0] == [
        "-m", str(tiny_gguf), "-t", threads, "-r", "1", "-o", "json", "-p", "16", "-n", "4", "-fa", "on", "-d", "0,80"
    ]  # fmt: skip
    assert ran[1][-4:] == ["-fa", "1", "-gp", "80,4"] and ran[1][:4] == ["-m", str(tiny_gguf), "-t", threads]
    table = bench("-m", str(tiny_gguf), "--depth", "80", "--vs", "ik", "--max-tokens", "4", "--prefill-tokens", "16")
    assert table.exit_code == 0 and "130.0" in table.stdout and "depth" in table.stdout


def test_a_missing_or_failing_peer_is_said_and_the_bench_goes_on(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.delenv("CHATCLI_IK_BENCH", raising=False)
    failing = tmp_path / "llama-bench"
    failing.write_text(f"#!{sys.executable}\nimport sys\nsys.exit('error: unknown argument: -d')\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CHATCLI_LLAMA_BENCH", str(failing))
    result = bench(
        "-m", str(tiny_gguf), "--vs", "llama.cpp", "--vs", "ik", "--max-tokens", "4", "--prefill-tokens", "16", "--json"
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert [row["depth"] for row in out["rows"]] == [0]  # --vs alone: depth 0
    assert out["peers"]["ik"] == {"error": "no llama-bench for ik: set $CHATCLI_IK_BENCH"}
    assert out["peers"]["llama.cpp"]["error"] == "exit 1: error: unknown argument: -d"


@pytest.mark.parametrize(
    "args, message, code",
    [
        (["--depth", "4k"], "Invalid value for '--depth': 4k: not a comma-separated list of token counts", 2),
        (["--depth", "-5"], "Invalid value for '--depth': -5: give one or more token counts >= 0", 2),
        (["--vs", "vllm"], "Invalid value for '--vs': 'vllm' is not one of 'llama.cpp', 'ik'", 2),
        (["--depth", "100000"], "--depth 100000 needs about 101192 tokens of context; tiny.gguf's is 512\n", 1),
    ],
)
def test_bad_depths_are_one_line(tiny_gguf, args, message, code):
    result = bench("-m", str(tiny_gguf), *args, "--json")
    assert result.exit_code == code and message in result.output and "Traceback" not in result.output
    assert result.stdout == ""


@pytest.mark.parametrize(
    "kv, extra", [("q8_0", ["-ctk", "q8_0", "-ctv", "q8_0"]), ("bfloat16", []), ("float16", []), ("auto", [])]
)
def test_a_peer_runs_the_kv_cache_chatcli_runs_where_it_has_one(kv, extra):
    from chatcli.bench.peers import command

    for name in ("llama.cpp", "ik"):
        argv = command(name, "llama-bench", "m.gguf", [0, 512], 4, 16, 1, 2, kv)
        flags = [a for i, a in enumerate(argv) if a in ("-ctk", "-ctv") or argv[i - 1] in ("-ctk", "-ctv")]
        assert flags == extra  # bf16 and f16 caches read the same bytes: the peers keep their f16 default
