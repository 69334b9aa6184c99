"""A local-SGD worker's private replica and its merges, for the live worker and the
simulator alike (HLSGD, Zhou et al. 2020; the merge arithmetic is
:mod:`hogkit.policy.local_sgd`).

A worker under :class:`~hogkit.policy.LocalSGD` steps on its own replica of the model
for h steps, then merges: ``shared += (replica − base) / W`` and pulls the shared model
back, ``replica = base = shared``. :class:`LocalPhase` is that lifecycle: :meth:`pull`
(start a phase from the shared model), :meth:`merge`, :meth:`pending` (steps not merged
yet), :meth:`close`. The live worker (:mod:`hogkit.engine.worker_loop`) and the
simulator's Python engine (:mod:`hogkit.engine.simulator`) both use it; the staleness
of a merge (merges by others since the pull) is recorded by the caller, who owns the
clocks.

With ``overlap`` (live only: the simulator refuses it) the merge runs in a thread while
the next local phase goes on from the current replica; at the next merge point the
worker joins it and *rebases* the steps taken meanwhile onto the merged model it got
back: ``replica ← S + (replica − committed)``, ``base ← S``. The merge itself is a
lock-free add (racy by design, like every Hogwild! write). Known limit: with overlap,
the staleness recorded for a merge counts others' merges since the previous merge
point, not since the older snapshot S the phase was rebased on, so it can read up to
one phase low.

With ``cost`` c > 0 (``LocalSGD(h, cost=c)``, live) a merge takes c times the wall time
of the phase it merges, a paced stand-in for a network round: without overlap the
worker sleeps it after the merge; with overlap the merge thread sleeps it before its
add, and the worker waits only when it reaches its next merge point first.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from hogkit.kernels.dense import merge_flat
from hogkit.policy.local_sgd import local_delta, merge

__all__ = ["LocalPhase"]


class LocalPhase:
    """One worker's replica of ``shared`` (a dict of arrays) and its merges into it,
    ``divisor`` what each delta is divided by on its way in (the policy's
    ``merge_divisor(W)``: W for local SGD's average, 1 for a sum)."""

    def __init__(self, shared, divisor, overlap=False, cost=0.0):
        self.shared = shared
        self.divisor = divisor
        self.overlap = overlap
        self.cost = float(cost)
        self.t_phase = time.perf_counter()       # when the current phase began
        self.replica = {k: v.copy() for k, v in shared.items()}
        self.base = {k: v.copy() for k, v in shared.items()}
        self.thread = None
        self.result = None
        self.error = None

    def pending(self) -> bool:
        """Whether the replica holds steps not merged yet."""
        return any(not np.array_equal(self.replica[k], self.base[k]) for k in self.replica)

    def _merge_into_shared(self, delta, pause=0.0):
        try:
            if pause > 0:
                time.sleep(pause)                 # the paced round trip (cost)
            for name, d in delta.items():
                merge(self.shared[name], d, workers=self.divisor)
            self.result = {k: v.copy() for k, v in self.shared.items()}
        except BaseException as e:  # noqa: BLE001 - re-raised in the worker by close()
            self.error = e

    def merge(self) -> None:
        """Merge the phase into the shared model (see the module docstring)."""
        pause = self.cost * (time.perf_counter() - self.t_phase)
        if not self.overlap:
            for k, shared in self.shared.items():
                r, b = self.replica[k], self.base[k]
                if shared.flags.c_contiguous and shared.dtype == r.dtype == b.dtype:
                    # one compiled pass (flat views: no copy of a contiguous array)
                    merge_flat(shared.reshape(-1), r.reshape(-1), b.reshape(-1),
                               self.divisor)
                else:
                    merge(shared, local_delta(r, b), workers=self.divisor)
                    r[...] = shared
                    b[...] = shared
            if pause > 0:
                time.sleep(pause)
            self.t_phase = time.perf_counter()
            return
        self.close()                      # join the previous merge, rebase onto it
        if self.result is not None:
            for k in self.replica:        # base holds the replica as last committed
                self.replica[k] += self.result[k] - self.base[k]
                self.base[k][...] = self.result[k]
        delta = {k: local_delta(self.replica[k], self.base[k]) for k in self.replica}
        for k in self.replica:            # commit: progress from here is the next delta
            self.base[k][...] = self.replica[k]
        self.thread = threading.Thread(target=self._merge_into_shared, args=(delta, pause),
                                       daemon=True)
        self.thread.start()
        self.t_phase = time.perf_counter()

    def close(self) -> None:
        """Join an overlapped merge still running; re-raise what it raised."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise RuntimeError("the overlapped LocalSGD merge failed") from error

    def pull(self) -> None:
        """Start a local phase from the shared model as it is now."""
        for k, v in self.shared.items():
            self.replica[k][...] = v
            self.base[k][...] = v
        self.t_phase = time.perf_counter()
