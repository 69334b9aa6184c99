"""Plain SGD and heavy-ball momentum as rules of the kernels' contract (``rule.py``).

``SGDCfg(lr)``: ``w -= lr·g``; ``MomentumCfg(lr, mu)``: ``m = mu·m + g; w -= lr·m``
(``S1`` the momentum buffer, lazy on rows). Two configurations, not one with a branch
on ``mu``: plain SGD is the common step, and its rows kernel is inlined into the step
loops (a call there cost as much as a small step), while momentum's is called. The
arithmetic is ``sparse.py``'s and ``dense.py``'s.
"""

from typing import NamedTuple

from numba import njit

from ._intrinsics import FASTMATH
from .dense import momentum_flat, sgd_flat
from .rule import register
from .sparse import momentum_rows, sgd_rows


class SGDCfg(NamedTuple):
    """Plain SGD's configuration."""
    lr: float


class MomentumCfg(NamedTuple):
    """SGD with heavy-ball momentum ``mu`` (> 0)."""
    lr: float
    mu: float


@njit(cache=True, nogil=True, inline="always")
def sgd_rows_rule(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
    """``W[rows] -= lr·G`` (``sparse.sgd_rows``), inlined where it is called."""
    sgd_rows(W, rows, G, c.lr, n)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def sgd_flat_rule(c, w, s1, s2, K, ki, g, read, tau, t):
    sgd_flat(w, g, c.lr)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def momentum_rows_rule(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
    momentum_rows(W, S1, rows, G, c.lr, c.mu, 1.0, n)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def momentum_flat_rule(c, w, s1, s2, K, ki, g, read, tau, t):
    momentum_flat(w, s1, g, c.lr, c.mu)


register(SGDCfg, rows=sgd_rows_rule, flat=sgd_flat_rule)
register(MomentumCfg, rows=momentum_rows_rule, flat=momentum_flat_rule)
