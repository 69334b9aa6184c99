"""The parent's side of a live run: worker processes, their failures, and shutdown.

:class:`Supervisor` spawns the workers (``spawn`` start method, thread pools capped
through the environment they inherit), waits on their process sentinels, tells a
root-cause failure from a peer that failed because of it, restarts dead workers while
restarts are left, fails a worker whose heartbeat stops, and shuts everything down in
order: stop flag → grace → SIGTERM → grace → SIGKILL.

:func:`parent_signals` turns SIGINT/SIGTERM into :class:`~hogkit.errors.Interrupted`
while a run is supervised (a cluster driver uses it too, :mod:`hogkit.cluster.backend`);
:class:`signals_deferred` holds them while the workers are being stopped, so a second
Ctrl-C cannot cut a shutdown short and a first one is not lost.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time

from hogkit.engine import entry as _worker
from hogkit.errors import Interrupted, WorkerFailed
from hogkit.state.clocks import DONE, FAILED, IDLE, RUNNING

__all__ = ["Supervisor", "parent_signals", "signals_deferred", "signal_name"]


@contextlib.contextmanager
def _child_env(threads):
    """Thread caps in os.environ while children are spawned (they inherit it)."""
    saved = {v: os.environ.get(v) for v in _worker.THREAD_VARS}
    try:
        _worker.cap_threads(threads)
        yield
    finally:
        for v, old in saved.items():
            if old is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = old


@contextlib.contextmanager
def parent_signals():
    """SIGINT/SIGTERM raise :class:`Interrupted` in the supervisor (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class signals_deferred:
    """Shutdown must not be cut short by a second Ctrl-C, and a Ctrl-C that lands
    while the workers are being stopped must not be lost either: SIGINT/SIGTERM are
    held for the block and raised as :class:`Interrupted` when it ends, unless an
    exception is already on its way out (then that one wins; it is an interruption
    or a failure already). SIGKILL still works, and then the resource tracker
    unlinks the segments."""

    def __enter__(self):
        self.got, self.old = [], {}
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, lambda signum, frame: self.got.append(signum))
                        for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, kind, value, tb):
        for s, h in self.old.items():
            signal.signal(s, h)
        if self.got and kind is None and sys.exc_info()[0] is None:
            raise Interrupted(self.got[0])
        return False


def signal_name(exitcode):
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return None


class Supervisor:
    """The parent's side of a run: processes, stores, events, shutdown."""

    def __init__(self, workers, grace, restarts=0):
        self.workers = workers
        self.grace = grace
        self.restarts_left = self.budget = restarts   # budget: for the failure message
        self.procs = []
        self.blobs = []
        self.finished = set()
        self.closed = False

    def _spawn(self, r):
        ctx = mp.get_context("spawn")
        with _child_env(1):
            p = ctx.Process(target=_worker.main, name=f"hogkit-worker-{r}", daemon=True,
                            args=(self.blobs[r], os.getpid(), 1, self.errfiles[r]))
            p.start()
        return p

    def start(self, specs, errdir):
        self.errfiles = [os.path.join(errdir, f"worker{r}.err") for r in range(self.workers)]
        self.blobs = [pickle.dumps(spec) for spec in specs]
        for r in range(self.workers):
            self.procs.append(self._spawn(r))

    def _restart(self, r, clocks, step):
        """Replace dead worker ``r`` by a fresh process on the same stores: it passes
        the start barrier at once (nobody is IDLE but itself) and goes on from its
        clock slot (its iterations so far count against its share of the steps).
        Returns the restart's record: the rank, how it ended, the step in flight, and
        its ``iterations`` and ``updates`` then (this segment's, in a resumed run; on
        replicas their difference is the steps it ran and had not merged, lost)."""
        old = self.procs[r]
        info = {"rank": r, "exitcode": old.exitcode, "signal": signal_name(old.exitcode),
                "step": step, "iterations": int(clocks.iterations[r]),
                "updates": int(clocks.updates[r])}
        old.close()
        clocks.state[r] = IDLE       # neither FAILED (peers would fail) nor RUNNING
        open(self.errfiles[r], "w").close()
        self.procs[r] = self._spawn(r)
        self.restarts_left -= 1
        return info

    def poll(self, clocks, step_slots, timeout):
        """Wait up to ``timeout`` for a worker to exit; raise WorkerFailed on failure,
        or replace the failed workers while restarts are left; returns the restarts."""
        alive = [p for r, p in enumerate(self.procs) if r not in self.finished]
        if not alive:
            return []
        ready = mp.connection.wait([p.sentinel for p in alive], timeout=timeout)
        failed = []
        for r, p in enumerate(self.procs):
            if r in self.finished or p.sentinel not in ready:
                continue
            p.join()
            if p.exitcode == 0 and clocks.state[r] == DONE:
                self.finished.add(r)
                continue
            failed.append(r)
        if failed and self.restarts_left >= len(failed):
            return [self._restart(r, clocks, int(step_slots[r])) for r in failed]
        if failed:
            # A worker blocked on a failed peer fails too (WorkerFailed from its policy
            # wait), possibly before the peer has finished exiting. Blame the root
            # cause: a failure that is not secondary, else a peer that marked itself
            # FAILED (it does so before exiting), given a grace period to exit.
            root = [r for r in failed if not self._secondary(r)]
            if not root:
                marked = [r for r in range(self.workers)
                          if r not in failed and clocks.state[r] == FAILED]
                for r in marked:
                    self.procs[r].join(self.grace)
                root = [r for r in marked if not self.procs[r].is_alive()]
            r = (root or failed)[0]
            raise self.failure(r, clocks, int(step_slots[r]), budget=self.budget or None)
        return []

    def _secondary(self, r):
        try:
            with open(self.errfiles[r]) as f:
                last = f.read().strip().splitlines()[-1:]
        except (OSError, IndexError):
            return False
        return bool(last) and last[0].startswith(("hogkit.errors.WorkerFailed",
                                                   "hogkit.errors.PolicyTimeout"))

    def check_heartbeats(self, clocks, step_slots, limit_s):
        """A RUNNING worker whose last beat is older than ``limit_s`` is hung (or
        stopped with SIGSTOP): fail the run rather than wait forever."""
        now = time.monotonic_ns()
        for r in range(self.workers):
            if r in self.finished or clocks.state[r] != RUNNING:
                continue
            age = (now - int(clocks.heartbeat_ns[r])) * 1e-9
            if age > limit_s:
                raise self.failure(r, clocks, int(step_slots[r]),
                                   reason=f"sent no heartbeat for {age:.0f} s (hung or "
                                          f"stopped); raise wait_timeout if one step can "
                                          f"take that long")

    def failure(self, r, clocks, step=None, reason="", budget=None):
        """The run's :class:`WorkerFailed` for rank ``r`` (its traceback, exit code or
        signal; ``budget``: the restarts it had, named when they ran out)."""
        p = self.procs[r]
        clocks.state[r] = FAILED
        tb = ""
        try:
            with open(self.errfiles[r]) as f:
                tb = f.read()
        except OSError:
            pass
        if not reason and p.exitcode == 0:
            reason = "exited before finishing its steps"
        return WorkerFailed(r, step=step, exitcode=p.exitcode,
                            signal=signal_name(p.exitcode), traceback=tb, reason=reason,
                            budget=budget)

    @property
    def done(self):
        return len(self.finished) == self.workers

    def shutdown(self, clocks):
        """Stop flag → grace → SIGTERM → grace → SIGKILL; reaps every process.

        Idempotent: the failure path and the final ``finally`` may both call it."""
        if self.closed:
            return
        self.closed = True
        if clocks is not None:
            clocks.request_stop()
        deadline = time.monotonic() + self.grace
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        live = [p for p in self.procs if p.is_alive()]
        for p in live:
            p.terminate()
        deadline = time.monotonic() + self.grace
        for p in live:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in live:
            if p.is_alive():
                p.kill()
                p.join()
        for p in self.procs:
            p.close()
