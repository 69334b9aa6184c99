"""Bounded-delay asynchronous SGD: no worker runs more than K updates ahead.

The analyses of asynchronous SGD assume that every gradient is computed from
parameters at most T updates old ("the delay is bounded by T": Lian, Huang, Li and Liu,
*Asynchronous Parallel Stochastic Gradient for Nonconvex Optimization*, NeurIPS 2015;
the Hogwild! analysis, Niu, Recht, Ré and Wright, NIPS 2011, bounds the lag by τ too).
Hogwild! itself enforces nothing; :class:`BoundedDelay` enforces a bound of that kind
on the workers' update counts, so a run can be held to the assumption it is analysed
under.
"""

from __future__ import annotations

import numpy as np

from hogkit.kernels import clock as _kc
from hogkit.policy.base import Policy, check_bound
from hogkit.errors import InvalidArgument

__all__ = ["BoundedDelay"]


class BoundedDelay(Policy):
    """Bounded-delay async (Lian et al., NeurIPS 2015: delay bounded by T): worker p
    may start its next update only while its own update count is at most K above the
    mean of the running workers',

        u_p − (Σ_q u_q) / n ≤ K,   i.e.   n·u_p − Σ_q u_q ≤ n·K   (integers: nothing rounds),

    over the n workers that are not DONE (p always counts). The slowest worker is always
    admitted (its count is at most the mean), so it cannot deadlock. Encodes as
    ``K_DELAY`` with ``P_A = K``
    (``hogkit.kernels.clock.update_lead``). Not supported across the nodes of a
    cluster run (``cluster_bound`` is None): a node's gate row bounds clocks, not
    update counts.
    """

    __slots__ = ("K",)
    _key = ("K",)
    spell = "delay"
    spell_args = ("K",)
    _counted = ("update count", "u")

    def __init__(self, K):
        self.K = check_bound("K", K, "update delay bound")
        if self.K == float("inf"):
            raise InvalidArgument(f"BoundedDelay(K={K}) needs a finite int K; use "
                                  f"Async() for unbounded")

    @property
    def bound(self):
        """K: the most updates a worker may be ahead of the running workers' mean."""
        return self.K

    def encode(self) -> np.ndarray:
        return self.row(_kc.K_DELAY, self.K)

    def may_proceed(self, updates, state, rank) -> bool:
        """Pure predicate on a vector of update counts (and the workers' states)."""
        slots = np.zeros((len(updates), _kc.SLOT), np.int64)
        slots[:, _kc.UPD], slots[:, _kc.STATE] = updates, state
        return bool(_kc.update_lead(slots, int(rank)) <= self.K)

    def _needs(self, mine, bound) -> str:
        return f"its update count at most {bound} above the running workers' mean"

    def config(self) -> dict:
        return {"name": "delay", "K": self.K}

    def __repr__(self):
        return f"BoundedDelay({self.K})"
