"""The cheap fatal checks a live run makes before it builds anything.

:func:`preflight` runs them and raises :class:`~hogkit.errors.EnvironmentProblem`
listing every fatal one with its fix; :func:`hogkit.train`, :func:`hogkit.spawn` and
``hogkit run`` call it first, so a machine that cannot run hogkit is told so in one
message, up front, with nothing created. Each check returns a :class:`Finding`
(``ok``, ``warn``: it runs, but slower or differently than it should, or ``fatal``: a
run would fail); ``hogkit doctor`` (:mod:`hogkit.doctor`) runs these and more.
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
from dataclasses import dataclass
from typing import Optional

from hogkit.errors import EnvironmentProblem
from hogkit.state.store import SHM_DIR

__all__ = ["Finding", "preflight", "platform", "shared_memory", "open_files", "processes",
           "start_method", "files_needed", "store_bytes", "check_room", "SHM_DIR", "OK",
           "WARN", "FATAL"]

#: below this /dev/shm is flagged as small (Docker's default is 64 MiB)
SMALL_SHM = 256 * 2**20
OK, WARN, FATAL = "ok", "warn", "fatal"


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f" -> {self.fix}" if self.fix and self.status != OK else ""
        return f"{self.status:<6}{self.check:<16}{self.detail}{fix}"


def _gib(n) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def shared_memory(needed_bytes: Optional[int] = None, path: str = SHM_DIR) -> Finding:
    """``path`` exists, is writable, and has ``needed_bytes`` free (when given)."""
    if not os.path.isdir(path):
        return Finding("shared memory", FATAL, f"{path} does not exist",
                       "hogkit needs POSIX shared memory (Linux: a tmpfs on /dev/shm)")
    if not os.access(path, os.W_OK):
        return Finding("shared memory", FATAL, f"{path} is not writable by this user",
                       f"ask for write access to {path}")
    usage = shutil.disk_usage(path)
    detail = f"{path}: {_gib(usage.free)} free of {_gib(usage.total)}"
    if needed_bytes is not None:
        detail += f"; the run needs {_gib(needed_bytes)}"
        if needed_bytes > usage.free:
            return Finding("shared memory", FATAL, detail,
                           f"free space in {path}, or a smaller model/preset; in a "
                           f"container: --shm-size")
    if usage.total < SMALL_SHM:
        return Finding("shared memory", WARN, detail + f": small (under "
                       f"{_gib(SMALL_SHM)}), only small models fit (the mf 'large' preset "
                       f"needs ~110 MiB)", "in a container: --shm-size=1g; else remount "
                       f"{path} larger")
    return Finding("shared memory", OK, detail)


def store_bytes(*groups, control=None) -> int:
    """The shared memory that stores holding ``groups`` (dicts name -> array) and
    ``control`` (name -> ``(shape, dtype)``, the control store's specs) take: each array
    rounded up to its cache line, and a page per store for its header."""
    import numpy as np
    line, page = 64, 4096

    def rounded(n):
        return -(-int(n) // line) * line
    n = sum(rounded(np.asarray(a).nbytes) for g in groups for a in g.values())
    n += sum(rounded(int(np.prod(shape)) * np.dtype(dt).itemsize)
             for shape, dt in (control or {}).values())
    return int(n + page * (len(groups) + (control is not None)))


def check_room(needed_bytes: int, path: str = SHM_DIR) -> None:
    """Raise :class:`EnvironmentProblem` when ``path`` cannot hold ``needed_bytes``
    (a run's stores, planned before any is made and before the kernels compile)."""
    f = shared_memory(needed_bytes, path)
    if f.status == FATAL:
        raise EnvironmentProblem(f"this machine cannot run it: {f.check}: {f.detail} "
                                 f"(fix: {f.fix}); nothing was created")


def files_needed(workers: int) -> int:
    """Open files a live run of ``workers`` workers may hold in the parent at once
    (stores, sentinels, pipes, logs), with room to spare."""
    return 64 + 8 * workers


def open_files(workers: int) -> Finding:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = files_needed(workers)
    shown = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    if soft != resource.RLIM_INFINITY and soft < need:
        return Finding("open files", FATAL, f"limit {shown}, {workers} workers need "
                       f"about {need}", f"ulimit -n {max(need, 1024)} (hard limit {hard})")
    if soft != resource.RLIM_INFINITY and soft < 1024:
        return Finding("open files", WARN, f"limit {shown} (enough for {workers} workers)",
                       "ulimit -n 1024 or more for larger runs")
    return Finding("open files", OK, f"limit {shown}")


def processes(workers: int) -> Finding:
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY:
        return Finding("processes", OK, "no per-user process limit")
    if soft < workers + 4:
        return Finding("processes", FATAL, f"per-user limit {soft} < {workers} workers + "
                       f"parent", f"ulimit -u {workers + 64}")
    return Finding("processes", OK, f"per-user limit {soft}")


def start_method() -> Finding:
    import multiprocessing as mp
    if "spawn" not in mp.get_all_start_methods():
        return Finding("start method", FATAL, "this Python has no 'spawn' start method",
                       "a CPython build with multiprocessing spawn (any Linux CPython)")
    return Finding("start method", OK, "spawn available (hogkit never forks)")


def platform(name=None) -> Finding:
    """Live runs need Linux: shared memory in /dev/shm, ``os.posix_fallocate`` to
    reserve it, ``PR_SET_PDEATHSIG`` so that no worker outlives its parent."""
    name = sys.platform if name is None else name
    if name.startswith("linux"):
        return Finding("platform", OK, name)
    return Finding("platform", FATAL, f"{name}: live runs need Linux (/dev/shm, "
                   f"posix_fallocate, PR_SET_PDEATHSIG)",
                   "run in a Linux machine, VM or container; `hogkit sim` (the simulator, "
                   "no shared memory) and the numba kernels run here")


def preflight(workers: int) -> None:
    """The cheap fatal checks for a live run of ``workers`` workers (shared memory is
    checked again, with the real sizes, when each store is created); raises
    :class:`EnvironmentProblem` naming every problem and its fix. Not Linux: that one
    line alone (the other checks would only repeat it)."""
    where = platform()
    if where.status == FATAL:
        raise EnvironmentProblem(f"this machine cannot run it: {where.detail} (fix: "
                                 f"{where.fix})")
    bad = [f for f in (shared_memory(), open_files(workers), processes(workers),
                       start_method()) if f.status == FATAL]
    if bad:
        raise EnvironmentProblem(
            "this machine cannot run it: " + "; ".join(
                f"{f.check}: {f.detail}" + (f" (fix: {f.fix})" if f.fix else "")
                for f in bad) + ". `hogkit doctor` checks everything")
