"""Integration: the embedded SmolLM2-135M (offline, CPU)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from chatcli.engine.engine import Finished
from chatcli.engine.sample.sampling import SamplingParams

pytestmark = pytest.mark.real_model
GREEDY = SamplingParams(temperature=0, max_tokens=40)


def reply(engine, messages, session=None):
    events = list(engine.generate(messages, session or engine.new_session(), GREEDY))
    assert isinstance(events[-1], Finished)
    return events[-1]


def test_capital_of_france_is_paris(real_engine):
    done = reply(real_engine, [{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in done.reply
    assert done.finish_reason == "stop"


def test_second_turn_reuses_first_turn_cache(real_engine):
    session = real_engine.new_session()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    first = reply(real_engine, messages, session)
    messages += [{"role": "assistant", "content": first.reply}, {"role": "user", "content": "And of Germany?"}]
    second = reply(real_engine, messages, session)
    assert second.stats.cached_tokens >= first.stats.prompt_tokens + first.stats.completion_tokens - 1
    assert second.stats.prefill_tokens < 20
    assert "Berlin" in second.reply


def test_conversion_cache_round_trip_and_rebuild(real_engine, tmp_path, monkeypatch):
    from safetensors.numpy import load_file

    from chatcli.engine.load.hf import load
    from chatcli.engine.load.sources import embedded_gguf
    from chatcli.engine.weights import gguf_convert as convert

    gguf = embedded_gguf()
    session = convert.converted_folder(gguf)  # converted into the session's fresh cache, as the engine read it
    original = load_file(session / "model.safetensors")
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path))
    shutil.copytree(session, convert.folder_for(gguf), copy_function=shutil.copy2)  # a copy to damage
    folder = convert.converted_folder(gguf)
    assert folder == convert.folder_for(gguf) and convert.is_valid(folder)
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert (folder / "chat_template.jinja").is_file() or "chat_template" in (
        folder / "tokenizer_config.json"
    ).read_text()

    # Corrupt the weights in place (same size): the next load rebuilds instead of crashing.
    with open(folder / "model.safetensors", "r+b") as f:
        f.seek(50 << 20)
        f.write(b"\0" * 4096)
    assert not convert.is_valid(folder)
    loaded = load(str(gguf))
    assert convert.is_valid(folder)
    rebuilt = load_file(folder / "model.safetensors")
    assert rebuilt.keys() == original.keys()
    assert all((rebuilt[name] == original[name]).all() for name in original)
    assert loaded.model.model.embed_tokens.weight.shape[0] == rebuilt["model.embed_tokens.weight"].shape[0]


def linked(source, target):
    """A hard link where the file system allows one, else a copy: 540 MB a test need not write again."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def test_a_corrupt_lean_file_is_converted_again(real_engine, tmp_path, monkeypatch):
    """The lean file is memory-mapped at each start: a corrupt one (same size, in place) is
    found by its sidecar and converted again, and the reply is today's."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from chatcli.engine.load.sources import embedded_gguf
    from chatcli.engine.weights import gguf_convert as convert

    converted = convert.converted_folder(embedded_gguf())  # the session cache's: the GGUF is not what is tested
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path))
    shutil.copytree(converted, convert.folder_for(embedded_gguf()), copy_function=linked)  # only read
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    want = reply(real_engine, messages).reply
    first = load_engine(str(embedded_gguf()), LoadOptions(device="cpu", quantize="none"))
    [path] = list((tmp_path / "lean").rglob("*.safetensors"))  # one lean file for the runner it picked
    del first
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"\xff" * 4096)
    again = load_engine(str(embedded_gguf()), LoadOptions(device="cpu", quantize="none"))
    assert reply(again, messages).reply == want


def test_ctrl_c_stops_oneshot_with_130_keeping_output(tmp_path):
    from chatcli.chat.store import Store

    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "none.toml"), "CHATCLI_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chatcli",
            "-p",
            "Write a very long story about a dragon.",
            "--max-tokens",
            "2000",
            "--temperature",
            "0",
        ],  # greedy runs the whole 2,000 tokens; a sampled story can end before the signal
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # an ignored SIGINT would be inherited
    )
    first = proc.stdout.read(20)  # the reply has started streaming
    assert first
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert b"Traceback" not in err
    assert len(first + out) >= 20
    store = Store(tmp_path / "chatcli.db")
    [saved] = [store.load(s.id) for s in store.summaries()]
    reply = saved.messages[-1]
    assert reply.role == "assistant" and reply.finish_reason == "cancelled"
    assert (first + out).decode().strip().startswith(reply.content.strip()[:10])
