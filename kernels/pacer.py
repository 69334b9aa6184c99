"""A straggler's extra time per step, the one definition of the straggler formulas.

A straggler model (``hogkit.engine.delays``: ``Slowdown``, ``Pauses``, ``Load``) is
encoded as a float64 pacer row ``[kind, a, b, t0_ns]`` (kinds ``layout.PACE_*``):

- Slowdown(a): a step that computed for ``busy`` takes ``a·busy`` in all;
- Pauses(a, b): with probability ``a`` a step pauses ``b`` seconds;
- Load(a, b): the slowdown factor follows ``f(t) = 1 + a·(1 + sin(2πt/b))/2``
  (:func:`load_factor`), ``t`` in seconds since ``t0_ns``.

:func:`pace_ns` is what the live step core spins or hands back to sleep and what the
Python engine's pacer waits (both from the generator ``(seed, rank, 0x5EED)``);
:func:`load_factor` is also the simulator's time-varying load (``sim.step_time``) and
the load a live straggler reports to an adaptive batch sizer. Nothing here imports
hogkit.
"""

import math

from numba import njit

from ._intrinsics import FASTMATH
from .layout import PACE_LOAD, PACE_PAUSES, PACE_SLOWDOWN


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def load_factor(amplitude, period, t):
    """``1 + amplitude·(1 + sin(2πt/period))/2``: Load's slowdown factor at ``t``
    seconds (the same expression, in the same order, wherever a load is applied)."""
    return 1.0 + amplitude * 0.5 * (1.0 + math.sin(2.0 * math.pi * t / period))


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def pace_ns(pacer, prng, busy_ns, now):
    """A straggler's extra time (ns) for a step that took ``busy_ns``, at monotonic
    ``now`` (``pacer``: the row ``[kind, a, b, t0_ns]``): Slowdown(a) ``(a-1)·busy``;
    Pauses(a, b) ``b`` s with probability a (drawn from ``prng``); Load(a, b)
    ``(f(t) - 1)·busy``."""
    kind = int(pacer[0])
    if kind == PACE_SLOWDOWN:
        return int((pacer[1] - 1.0) * busy_ns)
    if kind == PACE_PAUSES:
        return int(pacer[2] * 1e9) if prng.random() < pacer[1] else 0
    if kind == PACE_LOAD:
        f = load_factor(pacer[1], pacer[2], (now - pacer[3]) * 1e-9)
        return int((f - 1.0) * busy_ns)
    return 0
