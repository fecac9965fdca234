"""What a process killed mid-write leaves behind is swept by the next start (issue 46, item 9).

A child process runs each writer chatcli has — a lean file streamed in (`StreamedTensors`), a KV
cache save (`persist.save_cache`), a kernel build (`kernels.build`, its compiler a stand-in), a
GGUF's folder (`gguf_convert.convert`), a sidecar, the identity index — up to the rename that
would put it in place, where it stops; then it is killed with SIGKILL, as `kill -9` would. The
next start (`load_engine`) or `chatcli pull --verify` removes every temporary it left; while it
still runs, they are kept. The KV folder's budget counts a save being written.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chatcli import paths

ROOT = Path(__file__).resolve().parent.parent

WRITERS = r"""
import os, sys, threading, time
from pathlib import Path

import numpy as np

from chatcli.paths import cache_dir, data_dir

started = []


def stop_before_rename(src, dst):  # every writer renames its temporary into place last: it stops there
    started.append(str(src))
    time.sleep(3600)


os.replace = stop_before_rename
cache = cache_dir()


def lean():
    from chatcli.engine.weights.tensorfile import StreamedTensors

    folder = cache / "lean" / "m-0123abcd"
    folder.mkdir(parents=True)
    (folder / "source.txt").write_text(str(cache))  # a model that is still there: the folder stays
    w = StreamedTensors(folder / "gguf-0123.safetensors")
    w.declare("x", "U8", (1 << 20,))
    w.write("x", 0, bytes(1 << 20))
    w.close({})


def kv():
    from chatcli.engine.kv.persist import save_cache

    class Cache:
        ids = [1, 2, 3]

        def state(self):
            return {"k": ("F32", np.ones((3, 64), np.float32))}

    save_cache(Cache(), data_dir() / "kv" / "c1.safetensors", "fp")


def kernel():
    from chatcli.engine.runners import kernels

    kernels.build(["true"], cache / "kernels" / "decode-avx2-0123456789abcdef.so", "avx2")


def gguf_folder():
    from chatcli.engine.weights import gguf_convert

    def save(src, out, status):
        (out / "config.json").write_text("{}")

    gguf_convert.convert(Path(sys.argv[1]), cache / "gguf" / "gemma-chat-0123456789abcdef", save=save)


def side():
    from chatcli.engine.weights import sidecar

    done = cache / "kernels" / "done.so"
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_bytes(b"so")
    sidecar.record(done)


def index():
    from chatcli.engine.weights import identity

    path = Path(sys.argv[1])
    identity._remember(path, identity.stat_key(path.stat()), "0" * 64)


writers = [lean, kv, kernel, gguf_folder, side, index]
for writer in writers:
    threading.Thread(target=writer, daemon=True).start()
while len(started) < len(writers):
    time.sleep(0.01)
print("\n".join(started), flush=True)
time.sleep(3600)
"""


def start_writers(tmp_path: Path) -> tuple[subprocess.Popen, list[Path]]:
    """The child, stopped before each writer's rename; the temporaries it is writing."""
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    err = (tmp_path / "writers.err").open("w")
    child = subprocess.Popen(
        [sys.executable, "-c", WRITERS, str(source)], stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=ROOT
    )
    ready, _, _ = select.select([child.stdout], [], [], 120)
    if not ready:
        kill(child)
        pytest.fail(f"the writers did not start: {(tmp_path / 'writers.err').read_text()[-2000:]}")
    temps = [Path(child.stdout.readline().strip()) for _ in range(6)]
    assert all(p.exists() for p in temps), temps
    return child, temps


def kill(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait(10)


@pytest.fixture
def own_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CHATCLI_DATA_DIR", str(tmp_path / "data"))


def tiny_gguf(tmp_path: Path) -> Path:
    from tests.gguf_models import tiny, write_gguf

    return write_gguf(tiny("llama", True), tmp_path / "tiny.gguf", "Q4_0")


@pytest.mark.parametrize("start", ["load", "pull --verify"])
def test_a_start_sweeps_what_a_killed_writer_left_and_keeps_a_live_ones(kernel, own_dirs, tmp_path, start):
    from chatcli.engine import verify_model_files
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions

    model = tiny_gguf(tmp_path)
    run = (lambda: load_engine(str(model), LoadOptions(device="cpu"))) if start == "load" else None
    run = run or (lambda: verify_model_files(str(model), LoadOptions(device="cpu")))
    child, temps = start_writers(tmp_path)
    try:
        run()
        assert all(p.exists() for p in temps), "a live writer's temporary was removed"
    finally:
        kill(child)
    run()
    assert [p for p in temps if p.exists()] == []
    assert (tmp_path / "cache" / "lean" / "m-0123abcd" / "source.txt").is_file()  # only the temporaries went


def test_older_and_other_machines_temporaries_go_after_a_day(tmp_path):
    old = time.time() - paths.STALE_TEMP_S - 60
    names = {
        ".c1.safetensors.k2j4l5m6": True,  # an older chatcli's tensorfile temporary, untagged
        ".gemma-chat-0123456789abcdef.x1y2z3w4": True,  # its GGUF folder's (a file here: same rule)
        "decode-avx2-0123.ab12cd34.tmp": True,  # its kernel build's
        ".c2.safetensors.tmp-1-ffffff-a1b2c3d4": True,  # another machine's (host hash ffffff), pid unknown here
        "c3.safetensors": False,  # a finished file is no temporary, however old
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (old, old))
    fresh = tmp_path / ".c4.safetensors.q1w2e3r4"
    fresh.write_bytes(b"x")
    paths.sweep_temps(tmp_path)
    assert {name: not (tmp_path / name).exists() for name in names} == names
    assert fresh.exists()  # an older chatcli may be writing it now


def test_the_kv_budget_counts_a_save_being_written(tmp_path):
    from chatcli.engine.kv.persist import trim_folder

    older, newer = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    for i, p in enumerate((older, newer)):
        p.write_bytes(bytes(1000))
        os.utime(p, (1000 + i, 1000 + i))
    fd, live = paths.temp_file(tmp_path / "c.safetensors")  # this process's: live, kept
    os.write(fd, bytes(1500))
    os.close(fd)
    trim_folder(tmp_path, budget=2600)
    assert not older.exists() and newer.exists() and Path(live).exists()
