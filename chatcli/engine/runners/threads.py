"""torch's CPU threads, and why a thread that is done with torch lets go of them.

torch runs its CPU kernels in OpenMP teams: each Python thread that calls torch gets
a team of its own (torch's threads = the caller + workers), kept for its next call.
GNU OpenMP lets idle workers spin for a while, so that the next parallel region
starts at once, but only while it manages no more threads than there are CPUs; past
that it spins ~100 times and sleeps, and every one of the ~1,000 small parallel
regions of a decode step pays a wake-up. One other thread with a team is enough
(the thread that loaded the model, the pool thread that ran the previous turn): on
2 cores, decode in a worker thread ran at 21 tok/s against 42 on the main thread.

The compiled kernel runs its OpenMP teams the same way (one per calling thread, in the
same `libgomp.so.1`), so the same release applies to the native runner without torch.

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

OMP_PAUSE_SOFT = 1


_found = []  # the runtime's omp_pause_resource_all, once a runtime is loaded


def _pause():
    """`omp_pause_resource_all` of the process's OpenMP runtime (torch's, or the one the compiled
    kernel loaded: the same `libgomp.so.1` where both are there; on macOS torch's `libomp.dylib`,
    which the kernel links); None while none is loaded."""
    if _found:
        return _found[0]
    names = []
    if "torch" in sys.modules:
        import torch

        lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        names += glob.glob(os.path.join(lib, "libgomp*.so*")) + glob.glob(os.path.join(lib, "libomp*.dylib"))  # macOS
    from chatcli.engine.runners.kernels import openmp_runtimes

    names += sorted(openmp_runtimes())  # already mapped: opening them loads nothing new
    for name in names:
        try:
            pause = getattr(ctypes.CDLL(name), "omp_pause_resource_all", None)
        except OSError:
            continue
        if pause is not None:
            pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
            _found.append(pause)
            return pause
    return None


def release_cpu_threads() -> bool:
    """End the calling thread's OpenMP team; False where the process has none to end."""
    try:
        pause = _pause()
        return pause is not None and pause(OMP_PAUSE_SOFT) == 0
    except Exception:  # noqa: BLE001 - an optimisation: never the reason something fails
        return False
