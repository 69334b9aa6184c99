"""Adam (Kingma & Ba, "Adam: a method for stochastic optimization", ICLR 2015) as a rule
of the kernels' contract (``rule.py``), with ``torch.optim.Adam``'s arithmetic::

    m ← m + (1 − β1)·(g − m)            (torch's ``lerp``)
    v ← β2·v + ((1 − β2)·g)·g
    w ← w − (lr / (1 − β1^t)) · m / (sqrt(v) / sqrt(1 − β2^t) + eps)

``S1`` is ``m``, ``S2`` is ``v``; ``t`` is the update count the caller passes (an
engine, for a state every worker shares: the model's updates by every worker, read
from the clocks, this one included), or -1: one more than ``K[ki]``; ``K[ki]`` records
the count used. On sparse rows Adam is lazy, as
``torch.optim.SparseAdam``: only the touched rows' moments move, and the bias
correction uses the one count ``t`` (not the row's own); a row repeated in the batch
takes one step per occurrence, in batch order, as hogkit's other stateful rules do
(SparseAdam sums the repeats first). Scalars are cast to the parameter's dtype once
per call; the bias corrections are formed in float64. Races as ``sparse.py``'s.
"""

import math
from typing import NamedTuple

from numba import njit

from ._intrinsics import FASTMATH, prefetch_row, sqrt
from .rule import register
from .sparse import prefetched

_AHEAD = 8               # rows prefetched ahead: three tables an entry


class AdamCfg(NamedTuple):
    """Adam's configuration: ``lr``, the moments' decays ``beta1``, ``beta2``, ``eps``."""
    lr: float
    beta1: float
    beta2: float
    eps: float


@njit(cache=True, nogil=True, inline="always")
def _scalars(w, c, t):
    """``(1 − β1, β2, 1 − β2, lr / (1 − β1^t), sqrt(1 − β2^t), eps)`` in ``w``'s dtype."""
    T = w.dtype.type
    step = max(t, 1)
    bc1 = 1.0 - c.beta1 ** step
    bc2 = 1.0 - c.beta2 ** step
    return (T(1.0 - c.beta1), T(c.beta2), T(1.0 - c.beta2), T(c.lr / bc1),
            T(math.sqrt(bc2)), T(c.eps))


@njit(cache=True, nogil=True, inline="always")
def _step(W, M, V, r, G, i, b1, b2, c2, size, root, eps):
    """One occurrence of row ``r`` with gradient row ``G[i]``."""
    for j in range(W.shape[1]):
        g = G[i, j]
        m = M[r, j]
        m = m + b1 * (g - m)
        v = b2 * V[r, j] + (c2 * g) * g
        M[r, j] = m
        V[r, j] = v
        W[r, j] -= size * (m / (sqrt(v) / root + eps))


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def adam_rows_rule(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
    """Lazy Adam on ``W[rows[i]]`` for ``i < n`` in batch order (module docstring)."""
    t = K[ki] + 1 if t < 0 else t
    K[ki] = t
    b1, b2, c2, size, root, eps = _scalars(W, c, t)
    b = rows.shape[0] if n < 0 else n
    pf = prefetched(W)
    for i in range(min(_AHEAD, b) if pf else 0):
        prefetch_row(W, rows[i])
        prefetch_row(S1, rows[i])
        prefetch_row(S2, rows[i])
    for i in range(b):
        if pf and i + _AHEAD < b:
            prefetch_row(W, rows[i + _AHEAD])
            prefetch_row(S1, rows[i + _AHEAD])
            prefetch_row(S2, rows[i + _AHEAD])
        _step(W, S1, S2, rows[i], G, i, b1, b2, c2, size, root, eps)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def adam_flat_rule(c, w, s1, s2, K, ki, g, read, tau, t):
    """Adam on a flat buffer (``s1``, ``s2`` as long as ``w``)."""
    t = K[ki] + 1 if t < 0 else t
    K[ki] = t
    b1, b2, c2, size, root, eps = _scalars(w, c, t)
    for j in range(w.shape[0]):
        gj = g[j]
        m = s1[j]
        m = m + b1 * (gj - m)
        v = b2 * s2[j] + (c2 * gj) * gj
        s1[j] = m
        s2[j] = v
        w[j] -= size * (m / (sqrt(v) / root + eps))


register(AdamCfg, rows=adam_rows_rule, flat=adam_flat_rule)
