"""Race-test on real processes: a user's update function, N processes, real shared memory.

:func:`hogkit.explore.explore` says which outcomes the interleavings of ``fn`` *can*
reach; :func:`stress` measures which ones a real machine *does* reach, and how often.
The shared arrays live in one hogkit :class:`~hogkit.state.store.ParamStore` segment;
one spawned process per call runs ``fn(**arrays, **call)`` (a numba kernel compiled,
at full speed) in ``rounds`` rounds. Each round: the parent resets the arrays to their
initial values and sets a start instant 2 ms ahead, a barrier releases the workers,
and each spins until that instant plus a random ``jitter_ns`` of its own (so the
workers start within about a µs of each other, their alignment varying from round to
round); once all are done the parent reads the result. It compares each round's
arrays with the race-free result (the calls run one after another, in the parent) and,
given one, checks the invariant.

Nothing is left behind: the segment is unlinked and the workers are joined or killed
on every exit path; a worker's exception fails the call with its rank and traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from hogkit.errors import InvalidArgument, WorkerFailed
from hogkit.explore import _check_inputs, _holds
from hogkit.validation import check_float, check_int

__all__ = ["stress", "StressResult"]

#: the store's start-time word, and how far ahead of the release it is set: a barrier
#: wakes its waiters tens of µs apart, so each worker spins until the same instant
#: (CLOCK_MONOTONIC is one clock for every process), then its own jitter
_GO, _LEAD_NS = "stress_start_ns", 2_000_000


@dataclass(frozen=True)
class StressResult:
    """What :func:`stress` saw. ``rounds``; ``differs``: rounds whose arrays differ
    from the race-free (one call after another) result, and ``rate`` = differs /
    rounds (for additive updates: rounds that lost an update); ``invariant_failures``
    (None without an invariant); ``outcomes``: Counter of distinct final states (their
    bytes) -> rounds; ``sequential``: the race-free arrays; ``examples``: up to three
    final states that differ from it."""

    rounds: int
    differs: int
    rate: float
    invariant_failures: Optional[int]
    outcomes: Counter
    sequential: dict
    examples: list

    def unexplained(self, exploration) -> int:
        """Rounds whose final arrays are not among the outcomes ``exploration`` (an
        :func:`hogkit.explore.explore` of the same fn, arrays and calls) reached: 0
        when the element-level model covers what the machine did."""
        return sum(n for key, n in self.outcomes.items()
                   if not exploration.reaches_bytes(key))


def _worker(name, call, fn, rounds, barrier, jitter_ns, seed, rank, errors):
    """One process: attach the store, then per round wait, jitter, call ``fn``, wait."""
    from hogkit.engine.entry import cap_threads
    from hogkit.state.store import ParamStore
    cap_threads(1)
    store = ParamStore.attach(name)
    try:
        views = store.views()
        rng = random.Random(seed * 7919 + rank)
        go = views.pop(_GO)
        for _ in range(rounds):
            barrier.wait()                       # the parent has reset the arrays
            t = int(go[0]) + rng.randrange(jitter_ns + 1)
            while time.monotonic_ns() < t:       # every worker starts at go + jitter
                pass
            fn(**views, **call)
            barrier.wait()                       # the parent reads the result
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        barrier.abort()
    finally:
        views = go = None
        store.close()


def _sequential(fn, arrays, calls):
    out = {k: np.array(v, copy=True) for k, v in arrays.items()}
    for call in calls:
        fn(**out, **call)
    return out


def stress(fn, arrays, calls, *, rounds: int = 200, invariant: Optional[Callable] = None,
           jitter_ns: int = 20_000, timeout: float = 60.0, seed: int = 0) -> StressResult:
    """Run ``fn(**arrays, **calls[w])`` in ``len(calls)`` processes at once on shared
    memory, ``rounds`` times from the same initial ``arrays``; see the module docstring.

    ``fn`` must be importable by a spawned process (a top-level function; a script
    needs ``if __name__ == "__main__":``); a numba kernel compiles in each process
    unless it is ``@njit(cache=True)``. ``jitter_ns``: the largest random delay
    before each worker's call. ``timeout``: seconds a round may take before the run
    fails (a hung worker). Raises InvalidArgument before anything is spawned when
    ``fn`` fails on the inputs run one after another.
    """
    from hogkit.engine.mainguard import check_main_guard, check_spawnable
    from hogkit.state.store import ParamStore
    check_main_guard("hogkit.testing.stress()")
    arrays, calls = _check_inputs(arrays, calls, invariant or (lambda **_: True))
    if _GO in arrays:
        raise InvalidArgument(f"arrays may not use the name {_GO!r} (stress keeps its "
                              f"start time under it); rename that array")
    rounds = check_int("rounds", rounds, min_value=1)
    jitter_ns = check_int("jitter_ns", jitter_ns, min_value=0)
    timeout = check_float("timeout", timeout, min_value=0.0, exclude_min=True)
    for what, obj in (("fn", fn), ("calls", calls)):
        check_spawnable(what, obj)
    try:
        want = _sequential(fn, arrays, calls)    # also compiles a numba kernel here
    except Exception as e:
        raise InvalidArgument(f"fn fails on these inputs run one call after another: "
                              f"{type(e).__name__}: {e}; fix fn or the calls") from e
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(calls) + 1, timeout=timeout)
    errors = ctx.Queue()
    seen, differs, bad, examples = Counter(), 0, 0, []
    with ParamStore.create({**arrays, _GO: ((1,), np.int64)}, tag="stress") as store:
        views = store.views()
        go = views.pop(_GO)
        procs = [ctx.Process(target=_worker, daemon=True,
                             args=(store.name, c, fn, rounds, barrier, jitter_ns, seed, r,
                                   errors)) for r, c in enumerate(calls)]
        watch = _Watchdog(procs, barrier)
        try:
            for p in procs:
                p.start()
            watch.start()
            for _ in range(rounds):
                for k, v in arrays.items():
                    views[k][...] = v
                go[0] = time.monotonic_ns() + _LEAD_NS
                barrier.wait()
                barrier.wait()
                final = {k: v.copy() for k, v in views.items()}
                seen[tuple(v.tobytes() for v in final.values())] += 1
                if any(not np.array_equal(final[k], want[k], equal_nan=True) for k in want):
                    differs += 1
                    if len(examples) < 3:
                        examples.append(final)
                if invariant is not None and not _holds(invariant, final):
                    bad += 1
        except Exception as e:
            raise _failure(errors, procs, e) from e
        finally:
            views = go = None
            watch.done = True
            _stop(procs)
    return StressResult(rounds=rounds, differs=differs, rate=differs / rounds,
                        invariant_failures=None if invariant is None else bad,
                        outcomes=seen, sequential=want, examples=examples)


def _failure(errors, procs, cause):
    """The error for a round that did not complete: a worker's traceback if one sent
    it, else the first worker that died, else a hang."""
    try:
        rank, tb = errors.get(timeout=1.0)
        return WorkerFailed(rank, reason="raised in a stress round", traceback=tb)
    except Exception:
        for r, p in enumerate(procs):
            if not p.is_alive():
                return WorkerFailed(r, exitcode=p.exitcode)
        return WorkerFailed(0, reason=f"a stress round did not complete "
                                      f"({type(cause).__name__}): a worker hung; "
                                      f"raise timeout= or fix fn")


class _Watchdog(threading.Thread):
    """Breaks the round's barrier as soon as a worker process is gone, so a dead worker
    fails the call at once instead of after ``timeout``."""

    def __init__(self, procs, barrier):
        super().__init__(daemon=True)
        self.procs, self.barrier, self.done = procs, barrier, False

    def run(self):
        while not self.done:
            if any(p.exitcode is not None for p in self.procs) and not self.done:
                self.barrier.abort()
                return
            time.sleep(0.02)


def _stop(procs):
    for p in procs:
        p.join(timeout=5)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
