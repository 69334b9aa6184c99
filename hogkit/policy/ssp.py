"""Stale Synchronous Parallel and its two ends, BSP and Async.

- **SSP(s)** (Ho et al., NIPS 2013): worker p at clock c may proceed only while
  ``c − min_q c_q ≤ s`` (DONE workers excluded, :mod:`hogkit.policy.base`).
  Read-my-writes holds trivially (one shared copy).
- **BSP()** is ``SSP(0)`` and **Async()** (ASP, Hogwild!) is ``SSP(∞)``: subclasses of
  :class:`SSP` that ``SSP`` itself builds for those bounds, so ``SSP(0)`` is a ``BSP``,
  ``BSP() == SSP(0)`` and ``Async() == SSP(math.inf)``.

All three encode as ``K_SSP`` with ``P_A = s`` (-1: unbounded) for
``hogkit.kernels.clock.admit``.
"""

from __future__ import annotations

import math

import numpy as np

from hogkit.errors import InvalidArgument
from hogkit.kernels import clock as _kc
from hogkit.policy.base import Policy, check_bound, clock_lag

__all__ = ["SSP", "BSP", "Async", "may_proceed"]


def may_proceed(iterations, state, rank, bound) -> bool:
    """SSP(bound)'s rule: ``c_rank − min_q c_q ≤ bound`` (DONE workers excluded).

    ``bound`` is a non-negative int or ``math.inf`` (then always True).
    """
    if bound == math.inf:
        return True
    return clock_lag(iterations, state, rank) <= bound


class SSP(Policy):
    """Stale Synchronous Parallel (Ho et al., NIPS 2013): worker p at clock c proceeds
    only while ``c − min_q c_q ≤ s``.

    ``s`` is a non-negative int, or ``math.inf``. The two ends are classes of their
    own, and ``SSP`` builds them: ``SSP(0)`` is a :class:`BSP` and ``SSP(math.inf)`` an
    :class:`Async` (so ``isinstance(SSP(0), BSP)`` holds, and ``BSP() == SSP(0)``).
    One instance may serve every worker (and thread): its only state is per rank.
    """

    __slots__ = ("s",)
    _key = ("s",)
    spell = "ssp"
    spell_args = ("s",)

    def __new__(cls, *args, **kwargs):
        if cls is SSP:
            s = args[0] if args else kwargs.get("s")
            if s.__class__ is not bool and isinstance(s, (int, float, np.integer)):
                cls = BSP if s == 0 else Async if s == math.inf else SSP
        return Policy.__new__(cls)

    def __init__(self, s):
        self.s = check_bound("s", s, "staleness bound")

    @property
    def bound(self):
        """The staleness bound ``s`` (``math.inf`` for Async)."""
        return self.s

    #: across nodes the gate enforces s itself (BSP 0, Async none)
    cluster_bound = bound

    @property
    def name(self) -> str:
        return "async" if self.s == math.inf else "bsp" if self.s == 0 else "ssp"

    def encode(self) -> np.ndarray:
        return self.row(_kc.K_SSP, -1 if self.s == math.inf else int(self.s))

    def may_proceed(self, iterations, state, rank) -> bool:
        """Pure predicate of this policy on a clock vector (see :func:`may_proceed`)."""
        return may_proceed(iterations, state, rank, self.s)

    def config(self) -> dict:
        return {"name": self.name, "s": None if self.s == math.inf else self.s}

    def __repr__(self):
        return {"async": "Async()", "bsp": "BSP()"}.get(self.name, f"SSP({self.s})")

    def _family(self):
        return SSP                  # BSP() == SSP(0): one family


class BSP(SSP):
    """Bulk Synchronous Parallel: wait until every worker has finished clock c−1.
    Exactly ``SSP(0)``."""

    __slots__ = ()
    spell = "bsp"
    spell_args = ()

    def __init__(self, s=0):
        if s != 0:
            raise InvalidArgument(f"BSP is SSP(0); got s={s!r}: use SSP({s!r})")
        super().__init__(0)


class Async(SSP):
    """Asynchronous (ASP, Hogwild!): never wait. Exactly ``SSP(math.inf)``."""

    __slots__ = ()
    spell = "async"
    spell_args = ()

    def __init__(self, s=math.inf):
        if s != math.inf:
            raise InvalidArgument(f"Async is SSP(math.inf); got s={s!r}: use SSP({s!r})")
        super().__init__(math.inf)
