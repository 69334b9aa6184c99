"""``hogkit doctor``: can this machine run hogkit, and will it run it well?

Each check returns a :class:`~hogkit.engine.preflight.Finding`: ``ok``, ``warn`` (it
runs, but slower or differently than it should) or ``fatal`` (a run would fail). The
cheap fatal ones live below the engine, in :mod:`hogkit.engine.preflight`, whose
:func:`~hogkit.engine.preflight.preflight` every live run calls before it builds
anything; the doctor runs those and the rest, and reports them all.

The checks: shared memory (``/dev/shm`` exists, is writable, and has room for the
planned stores), the open-file and process limits against the worker count, the cores
the process may use against the worker count, the thread-pool variables, the ``spawn``
start method, whether torch is the CPU build (a CUDA build is gigabytes of nothing on
this kind of machine), whether numba can write its cache (else every run recompiles),
the time a cache line takes to pass between two of the usable cores
(:func:`line_handover_ns`: what each write to a row another worker wrote costs), and a
one-second smoke run of two real workers.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import threading
import time
from typing import Optional

from hogkit import workloads
from hogkit.engine.settings import Outputs
from hogkit.errors import InvalidArgument
from hogkit.engine.preflight import (FATAL, OK, SHM_DIR, WARN, Finding, files_needed,
                                     open_files, platform, preflight, processes,
                                     shared_memory, start_method, store_bytes)

__all__ = ["Finding", "run_checks", "preflight", "format_findings", "planned_bytes", "SHM_DIR",
           "OK", "WARN", "FATAL", "shared_memory", "open_files", "processes", "cores",
           "start_method", "files_needed", "line_handover_ns", "core_to_core"]

#: a hand-over slower than this means the two cores share no cache (different chiplets
#: or sockets, or vCPUs the host placed so): on a 2-vCPU AMD EPYC virtual machine every
#: probe read 27-51 ns or 162-179 ns, and two logreg workers ran ~3x slower in the
#: second placement (benchmarks/RESULTS.md, session 53)
FAR_NS = 100.0


def planned_bytes(workload, workers: int, *, rule=None, density=None, seed: int = 0) -> int:
    """The shared memory a live run of ``workload`` with ``workers`` workers takes: its
    parameters and data (built, as the run builds them), every worker's rule and
    density state (:mod:`hogkit.state.worker_state`), and the control arrays."""
    from hogkit.rules.core import SGD
    from hogkit.engine.worker_loop import control_specs
    from hogkit.state.worker_state import initial

    params, data = workload.build(seed)
    rule = rule if rule is not None else SGD(lr=workload.default_lr)
    return store_bytes(params, data, initial(rule, density, params, workers),
                       control=control_specs(workers))


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


def _pinnable() -> set:
    """The CPUs this process may pin a thread to; none without an affinity API (not
    Linux: nothing to measure there)."""
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()


def line_handover_ns(rounds: int = 20_000, cpus=None, timeout: float = 5.0):
    """The ns one hand-over of a 64-byte cache line between two cores takes, measured
    now: two threads, each pinned to one of ``cpus`` (default: two this process may use
    on different physical cores where /sys tells them apart,
    :func:`hogkit.procfs.two_cores`), pass an integer back and forth ``rounds`` times
    (:func:`hogkit.kernels.probe.line_pingpong`; ~1-7 ms). None with fewer than two
    usable cores, or when the other thread did not come within ``timeout`` s (a
    machine too busy to run both at once)."""
    import numpy as np

    from hogkit.kernels.probe import line_pingpong
    from hogkit.procfs import two_cores
    warm = min(100, rounds // 10)
    if rounds - 1 - warm < 1:
        raise InvalidArgument(f"rounds={rounds}: expected at least 2 round trips (a few "
                              f"thousand give a steady figure)")
    usable = _pinnable()
    if cpus is None:
        cpus = two_cores(usable)
    elif not set(cpus) <= usable:
        raise InvalidArgument(f"cpus={list(cpus)}: this process may run on "
                              f"{sorted(usable)} only; pick two of those")
    cpus = list(cpus)
    if len(cpus) < 2:
        return None
    flag = np.zeros(8, np.int64)              # 64 bytes: flag[0] sits in one line
    line_pingpong(flag, 0, 1, 0, 0)           # compiled (or loaded) here, not in a thread
    flag[0] = 0
    out, errors = [None, None], []
    deadline = time.monotonic_ns() + int(timeout * 1e9)

    def side(k):
        try:
            os.sched_setaffinity(0, {cpus[k]})    # this thread only (Linux)
            out[k] = line_pingpong(flag, k, rounds, warm, deadline)
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the join
            flag[0] = -1                          # the other side stops at once
            errors.append(e)

    threads = [threading.Thread(target=side, args=(k,), daemon=True) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    if any(v is None or v < 0 for v in out):
        return None
    return out[0] / (2 * (rounds - 1 - warm))


def core_to_core(samples: int = 7, pause: float = 0.1) -> Finding:
    """:func:`line_handover_ns` ``samples`` times, ``pause`` s apart (the first probe
    that cannot measure ends the check): warns when the median is over :data:`FAR_NS`
    (the cores share no cache) or when the samples differ by more than 2x (the host
    moved the cores during the check, or the machine was busy)."""
    from hogkit.procfs import two_cores
    cpus = two_cores(_pinnable())
    got = []
    for k in range(samples if len(cpus) == 2 else 0):
        ns = line_handover_ns(cpus=cpus)
        if ns is None:
            break
        got.append(ns)
        if k + 1 < samples:
            time.sleep(pause)
    if not got:
        return Finding("core to core", OK, "fewer than two usable cores, or too busy to "
                       "measure: nothing to compare")
    med, lo, hi = statistics.median(got), min(got), max(got)
    what = (f"a cache line passes between CPUs {cpus[0]} and {cpus[1]} in {med:.0f} ns "
            f"(median of {len(got)}, {lo:.0f}-{hi:.0f})")
    fix = ("workers that write the same rows pay this at each such write: on a dense "
           "model try --replication worker; compare live speeds only across runs made "
           "with the same hand-over time")
    if hi > 2 * lo:
        return Finding("core to core", WARN, f"{what}: it changed during the check: the "
                       f"host moved these cores (a virtual machine's vCPUs), or the "
                       f"machine was busy; live speeds of workers that share rows can "
                       f"differ from run to run", fix)
    if med > FAR_NS:
        return Finding("core to core", WARN, f"{what}: these cores share no cache "
                       f"(different chiplets or sockets)", fix)
    return Finding("core to core", OK, what)


def smoke(seconds: float = 1.0) -> Finding:
    """Two real workers on a small ``mf`` for ``seconds``."""
    import math

    from hogkit.engine.runtime import train
    try:
        run = train(workloads.get("mf", preset="hot"), workers=2, seconds=seconds,
                    outputs=Outputs(progress=False, eval_every=None))
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
    out = [platform(), shared_memory(needed_bytes), open_files(workers), processes(workers),
           cores(workers), thread_variables(), start_method(), torch_build(),
           numba_cache(), core_to_core()]
    if with_smoke and not any(f.status == FATAL for f in out):
        out.append(smoke())
    return out


def format_findings(findings) -> str:
    return "\n".join(f.line() for f in findings)


