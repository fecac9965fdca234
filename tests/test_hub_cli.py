"""Models by name from the command line, in a subprocess (huggingface_hub configured by the environment,
as a user's is): `chatcli pull NAME` from the fake hub, the model then answering `-m NAME` offline,
`chatcli models` (and --json, --catalogue) and `chatcli rm NAME`; a name not on disk offline is one line,
at once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.hub_fake import FakeHub, serve_fake_hub
from tests.test_oneshot import one_error_line


@pytest.fixture
def cli(tmp_path):
    """Run chatcli with the test's data dir and config, the session's cache, huggingface_hub's cache in
    tmp_path/hf, its endpoint `endpoint` (default: a port nobody listens on), online."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "config.toml"), "CHATCLI_DATA_DIR": str(tmp_path / "data")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_CACHE=str(tmp_path / "hf"), HF_HUB_OFFLINE="0")
    env.pop("HF_TOKEN", None)

    def run(*args, endpoint: str | None = None, **extra):
        return subprocess.run(
            [sys.executable, "-m", "chatcli", *args], capture_output=True, timeout=600, stdin=subprocess.DEVNULL,
            env={**env, "HF_ENDPOINT": endpoint or dead, **extra},
        )  # fmt: skip

    return run


def test_pull_by_name_then_run_it_offline_list_it_and_remove_it(cli, tmp_path):
    from tests.gguf_models import tiny, write_gguf

    fake = FakeHub()
    server = serve_fake_hub(fake)
    written = write_gguf(tiny("llama", True), tmp_path / "written.gguf", "Q8_0")
    fake.add("someone/Tiny-GGUF", {"Tiny-Q8_0.gguf": written.read_bytes(), "Tiny-F16.gguf": b"GGUF" + b"\0" * 64})
    try:
        pulled = cli("pull", "hf.co/someone/Tiny-GGUF:Q8_0", endpoint=fake.url)
    finally:
        server.shutdown()
        server.server_close()
    assert pulled.returncode == 0, pulled.stderr.decode()
    assert pulled.stdout.decode().startswith("ready: hf.co/someone/Tiny-GGUF:Q8_0 (")
    answered = cli("-m", "hf.co/someone/Tiny-GGUF:Q8_0", "-p", "hi", "--max-tokens", "3", "--json")  # hub gone
    assert answered.returncode == 0, answered.stderr.decode()
    assert json.loads(answered.stdout)["model"] == "hf.co/someone/Tiny-GGUF:Q8_0"

    listed = cli("models", "--json")
    entries = {e["name"]: e for e in json.loads(listed.stdout)}
    entry = entries["hf.co/someone/Tiny-GGUF:Q8_0"]
    assert (entry["file"], entry["quant"], entry["architecture"], entry["size"]) == (
        "Tiny-Q8_0.gguf", "Q8_0", "llama", written.stat().st_size)  # fmt: skip
    assert entry["context"] == 128 and entry["last_used"] > time.time() - 600
    table = cli("models").stdout.decode()
    assert "hf.co/someone/Tiny-GGUF:Q8_0" in table and "LAST USED" in table and "default" in table
    assert "qwen3:4b" in cli("models", "--catalogue").stdout.decode()

    removed = cli("rm", "hf.co/someone/Tiny-GGUF:Q8_0")
    assert removed.returncode == 0, removed.stderr.decode()
    assert removed.stdout.decode().startswith("removed hf.co/someone/Tiny-GGUF:Q8_0: Tiny-Q8_0.gguf (")
    assert "of its converted cache" in removed.stdout.decode()
    assert "hf.co/someone/Tiny-GGUF:Q8_0" not in cli("models").stdout.decode()
    again = cli("rm", "hf.co/someone/Tiny-GGUF:Q8_0")
    assert again.returncode == 1 and "is not on disk" in one_error_line(again)


def test_a_split_model_pulled_by_name_answers_is_listed_once_and_removed_whole(cli, tmp_path):
    from tests.gguf_models import tiny, write_gguf

    fake = FakeHub()
    server = serve_fake_hub(fake)
    (tmp_path / "w").mkdir()
    first = write_gguf(tiny("llama", True), tmp_path / "w" / "Tiny-Q8_0.gguf", "Q8_0", split_max_tensors=8)
    parts = {p.name: p.read_bytes() for p in sorted(first.parent.iterdir())}
    assert len(parts) == 3
    fake.add("someone/Tiny-GGUF", parts)
    try:
        pulled = cli("pull", "hf.co/someone/Tiny-GGUF", endpoint=fake.url)
    finally:
        server.shutdown()
        server.server_close()
    assert pulled.returncode == 0, pulled.stderr.decode()
    answered = cli("-m", "hf.co/someone/Tiny-GGUF:Q8_0", "-p", "hi", "--max-tokens", "3", "--json")  # hub gone
    assert answered.returncode == 0, answered.stderr.decode()
    assert json.loads(answered.stdout)["model"] == "hf.co/someone/Tiny-GGUF:Q8_0"
    (entry,) = [e for e in json.loads(cli("models", "--json").stdout) if e["repo"] == "someone/Tiny-GGUF"]
    assert (entry["file"], entry["size"], entry["files"]) == (first.name, sum(map(len, parts.values())), list(parts))
    removed = cli("rm", "hf.co/someone/Tiny-GGUF:Q8_0")
    assert removed.returncode == 0, removed.stderr.decode()
    assert not list((tmp_path / "hf").rglob("*.gguf")) and "Tiny-GGUF" not in cli("models").stdout.decode()


@pytest.mark.parametrize("offline", [{"HF_HUB_OFFLINE": "1"}, {}])
def test_offline_a_name_not_on_disk_is_one_line_at_once(cli, offline):
    began = time.monotonic()
    result = cli("-m", "qwen3:4b", "-p", "hi", **offline)
    assert result.returncode == 1
    line = one_error_line(result)
    assert "qwen3:4b is not on disk, and the hub cannot be asked for it" in line
    assert time.monotonic() - began < 30  # a start of the interpreter; no network timeout
