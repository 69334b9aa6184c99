"""Adaptive per-coordinate update kernels: AdaGrad and RMSProp, per coordinate or row-wise.

AdaGrad (Duchi, Hazan, Singer, JMLR 2011) and RMSProp (Tieleman & Hinton, 2012, lecture
6.5), with torch's semantics (``torch.optim.Adagrad``; ``torch.optim.RMSprop`` without
momentum or centring); ``s`` is the accumulator, ``eps`` is added after the root::

    AdaGrad:  s = s + g*g                     w -= lr * g / (sqrt(s) + eps)
    RMSProp:  s = alpha*s + (1 - alpha)*g*g   w -= lr * g / (sqrt(s) + eps)

**Row-wise** (the per-row adaptive step LIBMF's FPSG uses, Chin, Zhuang, Juan, Lin,
PAKDD 2015): one accumulator per table row, fed the row's *mean* of ``g*g`` over its
``d`` columns, and one step size for the whole row::

    AdaGrad:  s_r = s_r + mean_j(g_j*g_j)     a = lr / (sqrt(s_r) + eps);  w_j -= a * g_j
    RMSProp:  s_r = alpha*s_r + (1-alpha)*mean_j(g_j*g_j)          (then the same step)

The kernels tell the variant by the state's shape: on rows (``*_rows``, ``W`` ``(n, d)``)
a state ``S`` of ``d`` columns is per coordinate and of 1 column (``(n, 1)``) row-wise; on
a flat buffer (``*_flat``) a state as long as ``w`` is per coordinate and a shorter one
(``n`` entries, ``w`` of ``n * d``) row-wise over ``w`` seen as ``(n, d)``. A parameter of
one column (``d = 1``, e.g. a 1-D parameter seen as ``(n, 1)``) has the same shape both
ways and takes the per-coordinate arithmetic.

Arithmetic, in the parameter's dtype throughout (every scalar is cast once per call, so
float32 stays float32), in this order (``gs`` the gradient scale, 1 unless the
staleness-scaled variant divides by ``max(tau, 1)``; ``gs * x`` with ``gs = 1`` is
exact):

- per coordinate: ``g = gs*G[i, j]``; AdaGrad ``s = S + g*g``; RMSProp
  ``s = S*alpha + ((1-alpha)*g)*g`` (torch's ``mul_(alpha).addcmul_``); then
  ``S = s``, ``W -= (lr*g) / (sqrt(s) + eps)`` (torch's ``addcdiv_(g, sqrt(s) + eps,
  value=-lr)``: the same operations in the same order);
- row-wise: ``ss = sum_j (gs*G[i, j])**2`` (a sum in the parameter's dtype, over j in
  order, reassociated by ``FASTMATH`` so it vectorises: :func:`row_sumsq`, one
  definition); ``m = ss / d``; AdaGrad ``s = S[r, 0] + m``; RMSProp
  ``s = S[r, 0]*alpha + (1-alpha)*m``; ``S[r, 0] = s``; ``a = lr / (sqrt(s) + eps)``;
  ``W[r, j] -= a * (gs*G[i, j])`` (one division per row).

On sparse rows only the touched rows of the state move ("lazy" state, as every sparse
rule here); duplicate rows are processed one after the other in batch order, each
occurrence one accumulator step. Nothing is checked here; ``hogkit.rules.core``
validates shapes, dtypes and row ranges first (numba does no bounds checking). Hogwild!
races as in ``sparse.py``: deterministic with one writer. Square roots use the
``llvm.sqrt`` intrinsic so the loops vectorise (``_intrinsics.py``).

``AdaGradCfg`` and ``RMSPropCfg`` register the two as rules of ``rule.py``'s contract
(``stale``: the gradient is divided by ``max(tau, 1)`` first).
"""

from typing import NamedTuple

from numba import njit

from ._intrinsics import FASTMATH, prefetch_row, sqrt
from .rule import register
from .sparse import prefetched

_AHEAD = 8               # rows prefetched ahead: two tables per entry, as momentum_rows


# --- one row: the inline-able pieces (a fused per-sample kernel calls these) ----------

@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def row_sumsq(G, i, gs):
    """``sum_j (gs * G[i, j])**2`` in ``G``'s dtype, summed over j in order under
    ``FASTMATH`` (so the loop vectorises): the one definition of a row's square sum."""
    T = G.dtype.type
    ss = T(0.0)
    for j in range(G.shape[1]):
        g = gs * G[i, j]
        ss += g * g
    return ss


@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def adaptive_row(W, S, r, G, i, lr, decay, fresh, eps, gs):
    """One occurrence of row ``r`` with gradient row ``G[i]`` under AdaGrad
    (``decay = 1, fresh = 1``) or RMSProp (``decay = alpha, fresh = 1 - alpha``);
    every scalar already of ``W``'s dtype. Per coordinate when ``S`` has ``W``'s
    columns, row-wise when it has one (see the module docstring for the order).

    AdaGrad's ``s*1 + (1*g)*g`` is bit for bit ``s + g*g`` (multiplying by one is
    exact), so both rules share this body."""
    d = W.shape[1]
    if S.shape[1] == d:
        for j in range(d):
            g = gs * G[i, j]
            s = S[r, j] * decay + (fresh * g) * g
            S[r, j] = s
            W[r, j] -= (lr * g) / (sqrt(s) + eps)
    else:
        m = row_sumsq(G, i, gs) / W.dtype.type(d)
        s = S[r, 0] * decay + fresh * m
        S[r, 0] = s
        a = lr / (sqrt(s) + eps)
        for j in range(d):
            W[r, j] -= a * (gs * G[i, j])


@njit(cache=True, nogil=True, inline="always")
def _rows(W, S, rows, G, lr, decay, fresh, eps, gscale, n):
    """The body of the ``*_rows`` kernels (inlined: they carry the flags)."""
    T = W.dtype.type
    a, dc, fr, e, gs = T(lr), T(decay), T(fresh), T(eps), T(gscale)
    b = rows.shape[0] if n < 0 else n
    pf = prefetched(W)                       # tables that fit the cache: no prefetch
    for i in range(min(_AHEAD, b) if pf else 0):
        prefetch_row(W, rows[i])
        prefetch_row(S, rows[i])
    for i in range(b):
        if pf and i + _AHEAD < b:
            prefetch_row(W, rows[i + _AHEAD])
            prefetch_row(S, rows[i + _AHEAD])
        adaptive_row(W, S, rows[i], G, i, a, dc, fr, e, gs)


@njit(cache=True, nogil=True, inline="always")
def _flat(w, s, g, lr, decay, fresh, eps, gscale):
    """The body of the ``*_flat`` kernels (inlined: they carry the flags)."""
    T = w.dtype.type
    a, dc, fr, e, gs = T(lr), T(decay), T(fresh), T(eps), T(gscale)
    n = s.shape[0]
    if n == w.shape[0]:                       # per coordinate
        for j in range(n):
            gj = gs * g[j]
            v = s[j] * dc + (fr * gj) * gj
            s[j] = v
            w[j] -= (a * gj) / (sqrt(v) + e)
    elif n > 0:                               # row-wise over w seen as (n, d)
        d = w.shape[0] // n
        W = w.reshape((n, d))
        G = g.reshape((n, d))
        S = s.reshape((n, 1))
        for r in range(n):
            adaptive_row(W, S, r, G, r, a, dc, fr, e, gs)


# --- AdaGrad (Duchi, Hazan, Singer, JMLR 2011) ----------------------------------------

@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def adagrad_rows(W, S, rows, G, lr, eps, gscale=1.0, n=-1):
    """``W[rows[i]]`` by AdaGrad for i in batch order; ``S`` ``(n, d)`` per coordinate
    or ``(n, 1)`` row-wise; ``gscale`` multiplies the gradient first (1.0 is exact);
    ``n`` as in ``sparse.sgd_rows`` (-1: every entry)."""
    _rows(W, S, rows, G, lr, 1.0, 1.0, eps, gscale, n)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def adagrad_flat(w, s, g, lr, eps, gscale=1.0):
    """AdaGrad on a flat buffer; ``s`` as long as ``w`` (per coordinate) or one entry
    per row of ``w`` seen as ``(len(s), len(w) // len(s))`` (row-wise)."""
    _flat(w, s, g, lr, 1.0, 1.0, eps, gscale)


# --- RMSProp (Tieleman & Hinton 2012) -------------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def rmsprop_rows(W, S, rows, G, lr, alpha, eps, gscale=1.0, n=-1):
    """``W[rows[i]]`` by RMSProp (decay ``alpha``) for i in batch order; ``S`` as in
    :func:`adagrad_rows`."""
    _rows(W, S, rows, G, lr, alpha, 1.0 - alpha, eps, gscale, n)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def rmsprop_flat(w, s, g, lr, alpha, eps, gscale=1.0):
    """RMSProp on a flat buffer; ``s`` as in :func:`adagrad_flat`."""
    _flat(w, s, g, lr, alpha, 1.0 - alpha, eps, gscale)


# --- the rules (rule.py's contract) --------------------------------------------------

class AdaGradCfg(NamedTuple):
    """AdaGrad: ``eps``; ``stale`` divides the gradient by ``max(tau, 1)`` first
    (``S1`` the accumulator, per coordinate or ``(rows, 1)`` row-wise)."""
    lr: float
    eps: float
    stale: bool


class RMSPropCfg(NamedTuple):
    """RMSProp: decay ``alpha``, ``eps``, ``stale`` as :class:`AdaGradCfg`'s."""
    lr: float
    alpha: float
    eps: float
    stale: bool


@njit(cache=True, nogil=True, inline="always")
def _gscale(c, tau):
    """The gradient scale: ``1 / max(tau, 1)`` when ``c.stale``, else 1.0 (exact)."""
    return 1.0 / max(tau, 1) if c.stale else 1.0


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def adagrad_rows_rule(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
    adagrad_rows(W, S1, rows, G, c.lr, c.eps, _gscale(c, tau), n)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def adagrad_flat_rule(c, w, s1, s2, K, ki, g, read, tau, t):
    adagrad_flat(w, s1, g, c.lr, c.eps, _gscale(c, tau))


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def rmsprop_rows_rule(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
    rmsprop_rows(W, S1, rows, G, c.lr, c.alpha, c.eps, _gscale(c, tau), n)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def rmsprop_flat_rule(c, w, s1, s2, K, ki, g, read, tau, t):
    rmsprop_flat(w, s1, g, c.lr, c.alpha, c.eps, _gscale(c, tau))


register(AdaGradCfg, rows=adagrad_rows_rule, flat=adagrad_flat_rule)
register(RMSPropCfg, rows=rmsprop_rows_rule, flat=rmsprop_flat_rule)
