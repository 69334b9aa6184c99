"""Consistency policies: when may a worker start its next iteration?

One contract (:mod:`hogkit.policy.base`): a policy encodes itself for the one
admission state machine (``hogkit.kernels.clock.admit``) that the compiled step core,
the simulator and the Python ``wait`` share, and declares what else an engine must
know. The policies (docs/algorithms.md §2):

- :class:`SSP` (Ho et al., NIPS 2013), :class:`BSP` = ``SSP(0)``, :class:`Async` =
  ``SSP(∞)`` (:mod:`hogkit.policy.ssp`);
- :class:`DSSP` (Zhao et al., ICDCS 2019), a run-time bound in [s_lo, s_hi]
  (:mod:`hogkit.policy.dssp`);
- :class:`LocalSGD` (HLSGD, Zhou et al. 2020), h private steps per merge
  (:mod:`hogkit.policy.local`; the merge arithmetic in :mod:`hogkit.policy.local_sgd`);
- :class:`BoundedDelay` (the bounded-delay assumption of async SGD analyses, Lian et
  al., NeurIPS 2015): no worker more than K updates ahead of the mean
  (:mod:`hogkit.policy.bounded`).

:func:`from_string` reads their string forms ("ssp:4", "dssp:1:4", "delay:8", ...).
"""

from hogkit.policy.base import Policy, STALE_AFTER, clock_lag, from_string, spellings
from hogkit.policy.ssp import BSP, SSP, Async, may_proceed
from hogkit.policy.dssp import DSSP, dssp_extra
from hogkit.policy.local import LocalSGD
from hogkit.policy.bounded import BoundedDelay

__all__ = ["Policy", "SSP", "BSP", "Async", "DSSP", "LocalSGD", "BoundedDelay",
           "may_proceed", "clock_lag", "dssp_extra", "from_string", "spellings",
           "STALE_AFTER"]
