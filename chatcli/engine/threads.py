"""torch's CPU threads, and why a thread that is done with torch lets go of them.

torch runs its CPU kernels in OpenMP teams: each Python thread that calls torch gets
a team of its own (torch's threads = the caller + workers), kept for its next call.
GNU OpenMP lets idle workers spin for a while, so that the next parallel region
starts at once, but only while it manages no more threads than there are CPUs; past
that it spins ~100 times and sleeps, and every one of the ~1,000 small parallel
regions of a decode step pays a wake-up. One other thread with a team is enough
(the thread that loaded the model, the pool thread that ran the previous turn): on
2 cores, decode in a worker thread ran at 21 tok/s against 42 on the main thread.

`release_cpu_threads()` ends the calling thread's team (OpenMP 5's
`omp_pause_resource_all`; torch makes a new one at its next parallel call). Every
thread that runs torch code and then waits, or hands the engine to another thread,
calls it.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from functools import lru_cache

OMP_PAUSE_SOFT = 1


@lru_cache(maxsize=1)
def _pause():
    import torch

    libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp*.so*"))
    for name in [*libs, None]:  # torch's own libgomp, else whatever OpenMP the process has
        try:
            pause = getattr(ctypes.CDLL(name), "omp_pause_resource_all", None)
        except (OSError, TypeError):  # TypeError: CDLL(None) on Windows
            continue
        if pause is not None:
            pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
            return pause
    return None


def release_cpu_threads() -> bool:
    """End the calling thread's OpenMP team; False where this torch build has none to end."""
    if "torch" not in sys.modules:
        return False  # no torch, no team
    try:
        pause = _pause()
        return pause is not None and pause(OMP_PAUSE_SOFT) == 0
    except Exception:  # noqa: BLE001 - an optimisation: never the reason something fails
        return False
