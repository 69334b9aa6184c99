"""Worker process entry point.

This module is what a spawned worker imports first, so it imports nothing heavy at
module level: :func:`main` caps the thread pools (OpenMP/BLAS/numba/torch) *before*
numpy, numba or torch load, makes the worker ignore SIGINT (the parent owns it),
and asks the kernel to kill the worker if the parent dies (``PR_SET_PDEATHSIG``),
so no worker outlives its parent. Only then does it import the worker loop.

A worker that raises writes its traceback to its error file and marks its clock
slot FAILED before exiting with code 1; the parent re-raises that traceback (the
same shape as ``torch.multiprocessing.spawn``).
"""

from __future__ import annotations

import os
import signal
import sys

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMBA_NUM_THREADS")

_PR_SET_PDEATHSIG = 1


def cap_threads(n: int = 1) -> None:
    """Set every known thread-pool size variable to ``n`` (before heavy imports)."""
    for var in THREAD_VARS:
        os.environ[var] = str(n)


def _die_with_parent(parent_pid: int) -> None:
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(3)


def main(blob: bytes, parent_pid: int, threads: int, error_file: str) -> None:
    """Run one worker.

    ``blob`` is the pickled spec (:class:`hogkit.engine.worker_loop.WorkerSpec`, or
    :class:`hogkit.spawning.SpawnSpec`: anything with ``run()``, ``rank`` and the
    ``control`` store's handle). It arrives as
    bytes so that unpickling it - which imports numpy and the workload - happens only
    after the thread caps are in place.
    """
    cap_threads(threads)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    spec = None
    try:
        import pickle
        spec = pickle.loads(blob)
        spec.run()
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        import traceback
        text = traceback.format_exc()
        try:
            with open(error_file, "w") as f:
                f.write(text)
        except OSError:
            pass
        try:
            from hogkit.engine.worker_loop import mark_failed
            if spec is not None:
                mark_failed(spec)
        except BaseException:  # noqa: BLE001
            pass
        sys.stderr.flush()
        os._exit(1)
