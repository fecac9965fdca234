"""The one-shot and a saved KV cache, in a subprocess on the tiny model: a damaged file is said in
the --stats line and --json, a cache that cannot be written is one warning line and exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.test_persist_checksum import flip, middle_of_the_arrays

DAMAGED = "saved KV cache was damaged, prefilled again"


@pytest.fixture
def cli(tiny_model_dir, tmp_path):
    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "config.toml"), "CHATCLI_DATA_DIR": str(tmp_path / "data")}

    def run(*args, script=None):
        head = [str(script)] if script else ["-m", "chatcli"]
        argv = [sys.executable, *head, *args, "--model", str(tiny_model_dir), "--device", "cpu"]
        return subprocess.run(argv, input=b"", capture_output=True, env=env, timeout=120)

    run.kv = tmp_path / "data" / "kv"
    return run


def kv_file(cli):
    files = list(cli.kv.glob("*.safetensors"))
    assert len(files) == 1, files
    return files[0]


def stats_line(result) -> str:
    assert result.returncode == 0, result.stderr
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_damaged_cache_is_said_in_the_stats_line_and_json(cli):
    common = ("--temperature", "0", "--max-tokens", "5")
    assert cli("-p", "Hi", *common).returncode == 0
    line = stats_line(cli("-c", "-p", "And?", *common, "--stats"))
    assert "cached 0/" not in line and DAMAGED not in line

    flip(kv_file(cli), middle_of_the_arrays(kv_file(cli)))
    result = cli("-c", "-p", "Again?", *common, "--stats")
    line = stats_line(result)
    assert "cached 0/" in line and line.endswith(f" · {DAMAGED}")
    assert result.stdout.decode().strip()  # a reply all the same

    flip(kv_file(cli), middle_of_the_arrays(kv_file(cli)))
    record = json.loads(cli("-c", "-p", "Once more?", *common, "--json").stdout)
    assert record["stats"]["note"] == DAMAGED and record["stats"]["cached_tokens"] == 0
    record = json.loads(cli("-c", "-p", "Last?", *common, "--json").stdout)
    assert record["stats"]["note"] == "" and record["stats"]["cached_tokens"] > 0


@pytest.mark.parametrize(
    "failure",
    [
        'safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")',
        'OSError(errno.ENOSPC, "No space left on device")',
    ],
)
def test_a_full_disk_while_saving_the_cache_is_one_warning_line(cli, tmp_path, failure):
    from chatcli.chat.store import Store

    script = tmp_path / "full.py"
    script.write_text(
        "import errno, sys\n"
        "import safetensors\n"
        "def serialize_file(specs, filename, metadata=None):\n"
        "    open(filename, 'wb').write(b'partial')\n"
        f"    raise {failure}\n"
        "safetensors.serialize_file = serialize_file\n"
        "from chatcli.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    result = cli("-p", "Hello", "--temperature", "0", "--max-tokens", "5", script=script)
    assert result.returncode == 0, result.stderr
    err = result.stderr.decode()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    said = "the KV cache was not saved ([Errno 28] No space left on device); the next -c prefills again"
    assert err == f"chatcli: warning: {said}\n"
    reply = result.stdout.decode()
    assert reply.strip() and reply.endswith("\n")
    assert not list(cli.kv.iterdir())  # no partial file
    store = Store()
    try:
        assert store.load(store.latest_id()).messages[-1].content == reply.rstrip("\n")  # the reply is kept
    finally:
        store.close()
