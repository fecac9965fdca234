"""A thread that is done with torch ends its OpenMP team (see chatcli/engine/threads.py)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from chatcli.engine.threads import release_cpu_threads


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
