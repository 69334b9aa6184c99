"""Delay-aware update kernels: staleness-aware SGD, DC-ASGD, Gap-Aware.

Each rule comes twice: ``*_flat`` on a flat dense buffer ``w`` (every array 1-D, same
length) and ``*_rows`` on sparse rows of a 2-D table ``W`` (``(n, d)``), with row
indices ``rows`` ``(b,)`` int64 and per-row arrays ``G``, ``B``/``R`` of shape
``(b, d)``; duplicate rows are processed one after the other in batch order. State
arrays (momentum ``M``, mean square ``MS``, second moment ``V``) have the parameter's
shape; on sparse rows only the touched rows of the state move ("lazy" state).

Symbols follow the papers: ``tau`` the staleness (updates by others since the read),
``w_bak`` / ``w_read`` the parameter values the gradient was computed from.

The gap ``w_now - w_read`` of DC-ASGD and Gap-Aware is measured when the update
arrives: the ``*_rows`` kernels first read every touched row into a ``(b, d)``
scratch of deltas, then write. A duplicated row therefore does not count the step
of its own earlier occurrence as part of its gap (a fresh read gives plain SGD
exactly, duplicates or not).

Scalars are cast to the parameter dtype once per call. Nothing is checked here;
``hogkit.rules`` validates shapes, dtypes and row ranges first (numba does no bounds
checking). Hogwild! races as in ``sparse.py``: deterministic with one writer. Row
kernels prefetch rows 8 batch entries ahead; square roots use the ``llvm.sqrt``
intrinsic so the loops vectorise (``_intrinsics.py``).
"""

import numpy as np
from numba import njit

from ._intrinsics import prefetch_row, sqrt


# --- staleness-aware (Zhang, Gupta, Lian, Liu; IJCAI 2016) ---------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def staleness_aware_flat(w, g, lr, tau):
    """``w -= (lr / max(tau, 1)) * g``."""
    a = w.dtype.type(lr / max(tau, 1))
    for i in range(w.shape[0]):
        w[i] -= a * g[i]


@njit(cache=True, nogil=True, error_model="numpy")
def staleness_aware_rows(W, rows, G, lr, tau):
    """``W[rows[i]] -= (lr / max(tau, 1)) * G[i]`` in batch order."""
    a = W.dtype.type(lr / max(tau, 1))
    b = rows.shape[0]
    d = W.shape[1]
    for i in range(min(8, b)):
        prefetch_row(W, rows[i])
    for i in range(b):
        if i + 8 < b:
            prefetch_row(W, rows[i + 8])
        r = rows[i]
        for j in range(d):
            W[r, j] -= a * G[i, j]


@njit(cache=True, nogil=True, error_model="numpy")
def staleness_aware_momentum_flat(w, m, g, lr, mu, tau):
    """``m = mu * m + g / max(tau, 1); w -= lr * m`` (the stale gradient is damped
    before it enters the momentum buffer)."""
    a = w.dtype.type(lr)
    b = w.dtype.type(mu)
    s = w.dtype.type(1.0 / max(tau, 1))
    for i in range(w.shape[0]):
        v = b * m[i] + s * g[i]
        m[i] = v
        w[i] -= a * v


@njit(cache=True, nogil=True, error_model="numpy")
def staleness_aware_momentum_rows(W, M, rows, G, lr, mu, tau):
    """Lazy sparse-row twin of ``staleness_aware_momentum_flat``."""
    a = W.dtype.type(lr)
    b = W.dtype.type(mu)
    s = W.dtype.type(1.0 / max(tau, 1))
    n = rows.shape[0]
    d = W.shape[1]
    for i in range(min(8, n)):
        prefetch_row(W, rows[i])
        prefetch_row(M, rows[i])
    for i in range(n):
        if i + 8 < n:
            prefetch_row(W, rows[i + 8])
            prefetch_row(M, rows[i + 8])
        r = rows[i]
        for j in range(d):
            v = b * M[r, j] + s * G[i, j]
            M[r, j] = v
            W[r, j] -= a * v


@njit(cache=True, nogil=True, error_model="numpy")
def _deltas(W, rows, B, S, T):
    """``D[i] = W[rows[i]] - B[i]`` for the whole batch, before anything is written.

    The pass reads every touched row of W (prefetching 8 ahead) and prefetches the
    same rows of the state tables ``S`` and ``T`` (pass W again when there are none),
    so the writing pass that follows finds them in cache (L2 or, for batches beyond
    L2, L3; that pass prefetches again, from there). The price of measuring the gap
    at arrival is this second pass over the rows: see benchmarks/kernels.py.
    """
    b = rows.shape[0]
    d = W.shape[1]
    D = np.empty((b, d), W.dtype)
    for i in range(min(8, b)):
        prefetch_row(W, rows[i])
    for i in range(b):
        if i + 8 < b:
            prefetch_row(W, rows[i + 8])
        r = rows[i]
        prefetch_row(S, r)
        prefetch_row(T, r)
        for j in range(d):
            D[i, j] = W[r, j] - B[i, j]
    return D


# --- DC-ASGD (Zheng, Meng, Wang, Chen, Yu, Ma, Liu; ICML 2017) -----------------------

@njit(cache=True, nogil=True, error_model="numpy")
def dc_flat(w, g, w_bak, lr, lam):
    """Constant DC-ASGD: ``g' = g + lam * g * g * (w - w_bak); w -= lr * g'``.

    Evaluated as ``((lam * (w - w_bak)) * g) * g`` so a fresh read (``w == w_bak``)
    gives exactly ``g`` even for huge ``g``.
    """
    a = w.dtype.type(lr)
    c = w.dtype.type(lam)
    for i in range(w.shape[0]):
        gi = g[i]
        wi = w[i]
        w[i] = wi - a * (gi + ((c * (wi - w_bak[i])) * gi) * gi)


@njit(cache=True, nogil=True, error_model="numpy")
def dc_rows(W, rows, G, B, lr, lam):
    """Sparse-row constant DC-ASGD; ``B[i]`` is the ``w_bak`` of row ``rows[i]``;
    ``w - w_bak`` is taken for the whole batch before the first write."""
    a = W.dtype.type(lr)
    c = W.dtype.type(lam)
    D = _deltas(W, rows, B, W, W)
    d = W.shape[1]
    n = rows.shape[0]
    for i in range(n):
        if i + 8 < n:
            prefetch_row(W, rows[i + 8])
        r = rows[i]
        for j in range(d):
            gi = G[i, j]
            W[r, j] -= a * (gi + ((c * D[i, j]) * gi) * gi)


@njit(cache=True, nogil=True, error_model="numpy")
def dc_adaptive_flat(w, ms, g, w_bak, lr, lam0, m, eps):
    """Adaptive DC-ASGD::

        MS    = m * MS + (1 - m) * g * g
        lam_t = lam0 / sqrt(MS + eps)
        w    -= lr * (g + lam_t * g * g * (w - w_bak))
    """
    a = w.dtype.type(lr)
    l0 = w.dtype.type(lam0)
    mm = w.dtype.type(m)
    m1 = w.dtype.type(1.0 - m)
    e = w.dtype.type(eps)
    for i in range(w.shape[0]):
        gi = g[i]
        wi = w[i]
        s = mm * ms[i] + m1 * (gi * gi)
        ms[i] = s
        lam_t = l0 / sqrt(s + e)
        w[i] = wi - a * (gi + ((lam_t * (wi - w_bak[i])) * gi) * gi)


@njit(cache=True, nogil=True, error_model="numpy")
def dc_adaptive_rows(W, MS, rows, G, B, lr, lam0, m, eps):
    """Sparse-row adaptive DC-ASGD (``MS`` moves on touched rows only)."""
    a = W.dtype.type(lr)
    l0 = W.dtype.type(lam0)
    mm = W.dtype.type(m)
    m1 = W.dtype.type(1.0 - m)
    e = W.dtype.type(eps)
    D = _deltas(W, rows, B, MS, MS)
    d = W.shape[1]
    n = rows.shape[0]
    for i in range(n):
        if i + 8 < n:
            prefetch_row(W, rows[i + 8])
            prefetch_row(MS, rows[i + 8])
        r = rows[i]
        for j in range(d):
            gi = G[i, j]
            s = mm * MS[r, j] + m1 * (gi * gi)
            MS[r, j] = s
            lam_t = l0 / sqrt(s + e)
            W[r, j] -= a * (gi + ((lam_t * D[i, j]) * gi) * gi)


# --- Gap-Aware (Barkai, Hakimi, Schuster; ICLR 2020) ---------------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def gap_aware_flat(w, mom, v, g, w_read, lr, mu, gamma, lr_max, k):
    """Gap-Aware step ``k`` (k >= 1, counted per parameter, this one included)::

        u     = mu * mom + g                   (= g when mu == 0; mom unused then)
        v     = gamma * v + (1 - gamma) * u^2
        v_hat = v / (1 - gamma^k)
        C     = lr_max * (sqrt(v_hat) + 1e-8)
        G     = 1 + |w - w_read| / C           (exactly 1 when w == w_read)
        mom   = mu * mom + g / G ;  w -= lr * mom     (w -= lr * g / G when mu == 0)
    """
    a = w.dtype.type(lr)
    b = w.dtype.type(mu)
    gm = w.dtype.type(gamma)
    g1 = w.dtype.type(1.0 - gamma)
    bc = w.dtype.type(1.0 / (1.0 - gamma ** k))
    cm = w.dtype.type(lr_max)
    tiny = w.dtype.type(1e-8)
    one = w.dtype.type(1.0)
    if mu != 0.0:
        for i in range(w.shape[0]):
            gi = g[i]
            wi = w[i]
            mi = mom[i]
            u = b * mi + gi
            vi = gm * v[i] + g1 * (u * u)
            v[i] = vi
            dl = abs(wi - w_read[i])
            gap = one + dl / (cm * (sqrt(vi * bc) + tiny)) if dl != 0 else one
            mi = b * mi + gi / gap
            mom[i] = mi
            w[i] = wi - a * mi
    else:
        for i in range(w.shape[0]):
            gi = g[i]
            wi = w[i]
            vi = gm * v[i] + g1 * (gi * gi)
            v[i] = vi
            dl = abs(wi - w_read[i])
            gap = one + dl / (cm * (sqrt(vi * bc) + tiny)) if dl != 0 else one
            w[i] = wi - a * (gi / gap)


@njit(cache=True, nogil=True, error_model="numpy")
def gap_aware_rows(W, M, V, rows, G, R, lr, mu, gamma, lr_max, k):
    """Sparse-row Gap-Aware; ``R[i]`` is the ``w_read`` of row ``rows[i]``.

    Same equations as ``gap_aware_flat``; ``M`` and ``V`` move on touched rows only,
    and the bias correction uses the parameter's step count ``k`` (a rarely touched
    row's ``v_hat`` is then an under-estimate, which makes its gap larger: the
    conservative side). ``M`` is not touched when ``mu == 0`` (pass any 2-D array).
    """
    a = W.dtype.type(lr)
    b = W.dtype.type(mu)
    gm = W.dtype.type(gamma)
    g1 = W.dtype.type(1.0 - gamma)
    bc = W.dtype.type(1.0 / (1.0 - gamma ** k))
    cm = W.dtype.type(lr_max)
    tiny = W.dtype.type(1e-8)
    one = W.dtype.type(1.0)
    D = _deltas(W, rows, R, V, M if mu != 0.0 else V)
    d = W.shape[1]
    n = rows.shape[0]
    if mu != 0.0:
        for i in range(n):
            if i + 8 < n:
                prefetch_row(W, rows[i + 8])
                prefetch_row(V, rows[i + 8])
                prefetch_row(M, rows[i + 8])
            r = rows[i]
            for j in range(d):
                gi = G[i, j]
                mi = M[r, j]
                u = b * mi + gi
                vi = gm * V[r, j] + g1 * (u * u)
                V[r, j] = vi
                dl = abs(D[i, j])
                gap = one + dl / (cm * (sqrt(vi * bc) + tiny)) if dl != 0 else one
                mi = b * mi + gi / gap
                M[r, j] = mi
                W[r, j] -= a * mi
    else:
        for i in range(n):
            if i + 8 < n:
                prefetch_row(W, rows[i + 8])
                prefetch_row(V, rows[i + 8])
            r = rows[i]
            for j in range(d):
                gi = G[i, j]
                vi = gm * V[r, j] + g1 * (gi * gi)
                V[r, j] = vi
                dl = abs(D[i, j])
                gap = one + dl / (cm * (sqrt(vi * bc) + tiny)) if dl != 0 else one
                W[r, j] -= a * (gi / gap)
