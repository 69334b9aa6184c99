"""``hogkit doctor``: can this machine run hogkit, and will it run it well?

Each check returns a :class:`Finding`: ``ok``, ``warn`` (it runs, but slower or
differently than it should) or ``fatal`` (a run would fail). :func:`preflight` runs the
cheap fatal checks and raises :class:`~hogkit.errors.EnvironmentProblem` listing every
fatal one; :func:`hogkit.train` calls it before it builds anything, so a machine that
cannot run hogkit is told so in one message, up front, with nothing created.

The checks: shared memory (``/dev/shm`` exists, is writable, and has room for the
planned stores), the open-file and process limits against the worker count, the cores
the process may use against the worker count, the thread-pool variables, the ``spawn``
start method, whether torch is the CPU build (a CUDA build is gigabytes of nothing on
this kind of machine), whether numba can write its cache (else every run recompiles),
and a one-second smoke run of two real workers.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import shutil
from dataclasses import dataclass
from typing import Optional

from hogkit.errors import EnvironmentProblem
from hogkit.state.store import SHM_DIR

__all__ = ["Finding", "run_checks", "preflight", "format_findings", "planned_bytes", "SHM_DIR",
           "OK", "WARN", "FATAL"]

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


def planned_bytes(workload, workers: int, *, rule=None, density=None, seed: int = 0) -> int:
    """The shared memory a live run of ``workload`` with ``workers`` workers takes: its
    parameters and data (built, as the run builds them), every worker's rule and
    density state (:mod:`hogkit.state.worker_state`), and the control arrays."""
    import numpy as np

    from hogkit.rules.core import SGD
    from hogkit.engine.worker_loop import control_specs
    from hogkit.state.worker_state import initial

    params, data = workload.build(seed)
    rule = rule if rule is not None else SGD(lr=workload.default_lr)
    arrays = {**params, **data, **initial(rule, density, params, workers)}
    n = sum(np.asarray(a).nbytes for a in arrays.values())
    n += sum(int(np.prod(shape)) * np.dtype(dt).itemsize
             for shape, dt in control_specs(workers).values())
    return int(n)


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


def cores(workers: int) -> Finding:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    if workers > n:
        return Finding("cores", WARN, f"{workers} workers on {n} usable cores: they take "
                       f"turns, so throughput and staleness differ from {workers} real "
                       f"cores", f"--workers {n}, or `hogkit sim` to study more workers")
    return Finding("cores", OK, f"{n} usable, {workers} workers")


def thread_variables() -> Finding:
    from hogkit.engine.entry import THREAD_VARS
    set_ = {v: os.environ[v] for v in THREAD_VARS if v in os.environ}
    shown = ", ".join(f"{k}={v}" for k, v in set_.items()) or "none set"
    return Finding("threads", OK, f"workers cap every pool to 1 thread ({shown} in "
                   f"this shell)")


def start_method() -> Finding:
    import multiprocessing as mp
    if "spawn" not in mp.get_all_start_methods():
        return Finding("start method", FATAL, "this Python has no 'spawn' start method",
                       "a CPython build with multiprocessing spawn (any Linux CPython)")
    return Finding("start method", OK, "spawn available (hogkit never forks)")


def torch_build() -> Finding:
    if importlib.util.find_spec("torch") is None:
        return Finding("torch", WARN, "not installed: the mlp and rnn workloads, "
                       "TorchWorkload and hogkit.spawn need it",
                       'pip install torch==2.13.0 (see the README for the CPU build)')
    import torch
    cuda = getattr(torch.version, "cuda", None)
    if cuda:
        has_gpu = bool(torch.cuda.is_available())
        if not has_gpu:
            return Finding("torch", WARN, f"{torch.__version__} is a CUDA {cuda} build "
                           f"on a machine without a GPU: gigabytes for nothing",
                           "pip install torch --index-url "
                           "https://download.pytorch.org/whl/cpu")
        return Finding("torch", OK, f"{torch.__version__}, CUDA {cuda} (a GPU is present)")
    return Finding("torch", OK, f"{torch.__version__}, CPU build")


def numba_cache() -> Finding:
    import hogkit.kernels
    where = os.environ.get("NUMBA_CACHE_DIR")
    if where:
        target = where
    else:
        target = os.path.join(os.path.dirname(hogkit.kernels.__file__), "__pycache__")
    probe = target if os.path.isdir(target) else os.path.dirname(target)
    if os.access(probe, os.W_OK):
        return Finding("numba cache", OK, f"writable: {target}")
    user = os.path.join(os.path.expanduser("~"), ".cache")
    if not where and os.access(user if os.path.isdir(user) else
                               os.path.expanduser("~"), os.W_OK):
        return Finding("numba cache", OK, f"{target} is read-only; numba falls back to "
                       f"its per-user cache under {user}")
    return Finding("numba cache", WARN, f"{target} is not writable: every run compiles "
                   f"its kernels again (seconds per run)",
                   "export NUMBA_CACHE_DIR=<a writable folder>")


def smoke(seconds: float = 1.0) -> Finding:
    """Two real workers on a small ``mf`` for ``seconds``."""
    import math

    from hogkit.engine.runtime import train
    try:
        run = train("mf", workers=2, seconds=seconds, progress=False, eval_every=None,
                    workload_options={"preset": "hot"})
    except Exception as e:  # noqa: BLE001 - the finding is the report
        return Finding("smoke run", FATAL, f"2 workers, {seconds:g} s: "
                       f"{type(e).__name__}: {str(e).splitlines()[0]}")
    if run.updates <= 0 or not math.isfinite(run.final_loss):
        return Finding("smoke run", FATAL, f"2 workers made {run.updates} updates, final "
                       f"loss {run.final_loss}")
    return Finding("smoke run", OK, f"2 workers, {run.updates:,} updates in "
                   f"{run.wall_s:.1f} s, loss {run.initial_loss:.3g} -> "
                   f"{run.final_loss:.3g}")


def run_checks(workers: int = 2, needed_bytes: Optional[int] = None,
               with_smoke: bool = True) -> list:
    """Every check, in order; ``with_smoke`` adds the one-second smoke run."""
    out = [shared_memory(needed_bytes), open_files(workers), processes(workers),
           cores(workers), thread_variables(), start_method(), torch_build(),
           numba_cache()]
    if with_smoke and not any(f.status == FATAL for f in out):
        out.append(smoke())
    return out


def format_findings(findings) -> str:
    return "\n".join(f.line() for f in findings)


def preflight(workers: int) -> None:
    """The cheap fatal checks for a live run of ``workers`` workers (shared memory is
    checked again, with the real sizes, when each store is created); raises
    :class:`EnvironmentProblem` naming every problem and its fix."""
    bad = [f for f in (shared_memory(), open_files(workers), processes(workers),
                       start_method()) if f.status == FATAL]
    if bad:
        raise EnvironmentProblem(
            "this machine cannot run it: " + "; ".join(
                f"{f.check}: {f.detail}" + (f" (fix: {f.fix})" if f.fix else "")
                for f in bad) + ". `hogkit doctor` checks everything")
