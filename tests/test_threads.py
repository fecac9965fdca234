"""A thread that is done with torch ends its OpenMP team (see chatcli/engine/runners/threads.py)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from chatcli.engine.runners.threads import release_cpu_threads


def threads_now() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one torch thread: no OpenMP workers to end")
def test_a_thread_ends_its_openmp_team():
    seen = {}

    def work():
        seen["before"] = threads_now()
        torch.ones(1 << 22).add_(1)  # large enough for a parallel region: this thread gets a team
        seen["with_team"] = threads_now()
        seen["released"] = release_cpu_threads()
        deadline = time.monotonic() + 5
        while threads_now() >= seen["with_team"] and time.monotonic() < deadline:
            time.sleep(0.01)  # the workers leave on their own schedule
        seen["after"] = threads_now()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen["with_team"] > seen["before"]
    assert seen["released"] is True
    assert seen["after"] < seen["with_team"]


NATIVE_TEAM = """
import ctypes, os, sys, threading, time
import numpy as np
from chatcli.engine.runners import kernels
from chatcli.engine.runners.kernels.structs import WEIGHT_F32, Matrix
from chatcli.engine.runners.threads import release_cpu_threads

lib = kernels.library()
w = np.ones((16, 1024, 64), np.float32)  # 1024 outputs in fp32 panels
m = Matrix(WEIGHT_F32, 1024, 1024, 1024, w.ctypes.data, None, None)
x, y = np.ones((4, 1024), np.float32), np.empty((4, 1024), np.float32)
count = lambda: len(os.listdir("/proc/self/task"))
seen = {}

def work():
    seen["before"] = count()
    lib.chatcli_project(ctypes.byref(m), x.ctypes.data, 4, y.ctypes.data, 2)
    seen["with_team"] = count()
    seen["released"] = release_cpu_threads()
    deadline = time.monotonic() + 5
    while count() >= seen["with_team"] and time.monotonic() < deadline:
        time.sleep(0.01)
    seen["after"] = count()

t = threading.Thread(target=work)
t.start()
t.join()
assert "torch" not in sys.modules
print(seen["with_team"] > seen["before"], seen["released"], seen["after"] < seen["with_team"])
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_the_kernels_team_is_released_without_torch(kernel):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", NATIVE_TEAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"]
