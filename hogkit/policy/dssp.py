"""Dynamic SSP (Zhao et al., ICDCS 2019): a staleness threshold chosen at run time in
[s_lo, s_hi] from the workers' recent iteration times.

The episode logic (proceed within s_lo; past it decide a grant r* once per episode;
proceed within s_lo + r*; a released worker decides afresh) is
``hogkit.kernels.clock.admit``, the one copy every engine runs; the controller is
``hogkit.kernels.clock.dssp_decide`` / ``dssp_extra``. This module is the policy's
face: its settings, encoding and histogram of grants.
"""

from __future__ import annotations

import math

import numpy as np

from hogkit.errors import InvalidArgument
from hogkit.kernels import clock as _kc
from hogkit.policy.base import Policy, check_bound
from hogkit.policy.ssp import may_proceed

__all__ = ["DSSP", "dssp_extra"]


def dssp_extra(last_f, interval_f, last_s, interval_s, r_max) -> int:
    """DSSP's synchronization controller (Zhao et al., ICDCS 2019), pure: the r in
    ``[0, r_max]`` whose predicted finish ``last_f + r·interval_f`` of the fastest
    worker is closest to one of the slowest's ``last_s + k·interval_s`` (k ≥ 1; ties:
    the smaller r); 0 when an interval is not positive and finite
    (``hogkit.kernels.clock.dssp_extra``, the one definition)."""
    return int(_kc.dssp_extra(float(last_f), float(interval_f), float(last_s),
                              float(interval_s), int(r_max)))


class DSSP(Policy):
    """Dynamic SSP (Zhao et al., ICDCS 2019): the bound is chosen at run time in
    [s_lo, s_hi].

    Worker p at clock c, lag ``c − min`` (DONE workers excluded, as in SSP):

    - lag ≤ s_lo: proceed (plain SSP(s_lo)); the current episode ends.
    - lag > s_lo and no grant yet in this episode: if p is the fastest (its clock is the
      maximum among running workers) the synchronization controller :func:`dssp_extra`
      picks r* ∈ [0, s_hi − s_lo] from the predicted finish times of p
      (``last_p + r·interval_p``) and of the slowest worker
      (``last_slow + k·interval_slow``); otherwise r* = 0. The grant is recorded; the
      episode's bound is ``s_lo + r*``.
    - p proceeds while lag ≤ s_lo + r*; past that it waits (as SSP(s_lo + r*)) and the
      grant is dropped once released, so the next iteration decides again with fresh
      timings. The bound in force is always in [s_lo, s_hi]; ``bound`` is s_hi.

    Timing (docs/algorithms.md §2: "intervals are each worker's latest iteration time"): every
    worker records, at each finish, its finish time (heartbeat) and how long that
    iteration took (``timing`` is True: ``clocks.tick_iteration(rank, beat=True)``; the
    compiled step core does the same). The decision is
    ``hogkit.kernels.clock.dssp_decide`` on those slots: one definition for the live
    Python path, the compiled core and the simulator. A worker's own "now" is its last
    finish (it decides right after finishing).

    Per-rank episode state (the grant in force) lives in this object, so each spawned
    worker holds its own copy. :meth:`grants` gives the histogram of r* decisions.
    """

    _key = ("s_lo", "s_hi")
    spell = "dssp"
    spell_args = ("s_lo", "s_hi")
    timing = True

    def __init__(self, s_lo, s_hi):
        self.s_lo = check_bound("s_lo", s_lo, "DSSP lower bound")
        self.s_hi = check_bound("s_hi", s_hi, "DSSP upper bound")
        if self.s_lo == math.inf or self.s_hi == math.inf:
            raise InvalidArgument(f"DSSP bounds must be finite ints, got s_lo={s_lo}, "
                                  f"s_hi={s_hi}; use Async() for unbounded")
        if self.s_hi < self.s_lo:
            raise InvalidArgument(f"DSSP needs s_lo <= s_hi, got s_lo={self.s_lo}, "
                                  f"s_hi={self.s_hi}; swap them")

    @classmethod
    def spell_forms(cls):
        return ("dssp:LO:HI",)

    @property
    def bound(self):
        """The largest lag DSSP ever allows (s_hi)."""
        return self.s_hi

    @property
    def cluster_bound(self):
        """Across nodes the gate enforces s_lo; the grants stretch it as on one node."""
        return self.s_lo

    def encode(self) -> np.ndarray:
        return self.row(_kc.K_DSSP, self.s_lo, self.s_hi)

    def may_proceed(self, iterations, state, rank) -> bool:
        """The guarantee only (lag ≤ s_hi); the run-time choice needs timings."""
        return may_proceed(iterations, state, rank, self.s_hi)

    def current_bound(self, rank):
        """The bound in force for ``rank`` now (s_lo outside a grant episode)."""
        extra = int(self.admission(rank)[0][_kc.A_EXTRA])
        return self.s_lo if extra < 0 else self.s_lo + extra

    def grants(self, rank=None) -> dict:
        """Histogram ``{r*: count}`` of the extra iterations granted (one per decision),
        for ``rank`` or summed over the ranks this instance served."""
        rows = [st[1] for r, st in self._ranks.items() if rank is None or r == rank]
        hist = np.sum(rows, axis=0) if rows else ()
        return {int(r): int(n) for r, n in enumerate(hist) if n}

    def config(self) -> dict:
        return {"name": "dssp", "s_lo": self.s_lo, "s_hi": self.s_hi}

    def __repr__(self):
        return f"DSSP({self.s_lo}, {self.s_hi})"
