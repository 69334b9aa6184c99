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
arrives, i.e. from each row's value when the call starts. A duplicated row
therefore does not count the step of its own earlier occurrence as part of its gap
(a fresh read gives plain SGD exactly, duplicates or not). The ``*_rows`` kernels do
this in one pass over the table rows: a pre-pass over the row *indices* only
(``_repeats``: a small hash of the batch positions, no sorting, no table row
touched) finds the rows that occur more than once; the update pass saves the start
value of such a row at its first occurrence into a ``(repeated rows, d)`` scratch
and takes the gap of its later occurrences from there. Rows that occur once (all
of them in a batch without duplicates) are read, updated and written once. Results
are bit-for-bit those of the earlier two-pass kernels (same operations, same order).

Scalars are cast to the parameter dtype once per call. Nothing is checked here;
``hogkit.rules.core`` validates shapes, dtypes and row ranges first (numba does no bounds
checking). Hogwild! races as in ``sparse.py``: deterministic with one writer. Row
kernels prefetch rows 8 batch entries ahead (16 for constant DC-ASGD, which has no
state table: one row in flight per entry, and 16 measured 1.2x faster than 8 on a
256 MB table; with 2-3 tables per entry 16 was slower than 8); square roots use
the ``llvm.sqrt`` intrinsic so the loops vectorise (``_intrinsics.py``).
"""

import numpy as np
from numba import njit

from ._intrinsics import prefetch_row, sqrt
from .dense import momentum_flat, sgd_flat
from .sparse import momentum_rows, prefetched, sgd_rows

_AHEAD = 16              # constant DC-ASGD rows prefetch this many batch entries ahead
_AHEAD2 = 8              # ... and the kernels with a state table (2-3 rows per entry)


# --- staleness-aware (Zhang, Gupta, Lian, Liu; IJCAI 2016) ---------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def staleness_aware_flat(w, g, lr, tau):
    """``w -= (lr / max(tau, 1)) * g``: the dense update at a damped learning rate."""
    sgd_flat(w, g, lr / max(tau, 1))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def staleness_aware_rows(W, rows, G, lr, tau, n=-1):
    """``W[rows[i]] -= (lr / max(tau, 1)) * G[i]`` in batch order: the plain sparse
    update at a damped learning rate."""
    sgd_rows(W, rows, G, lr / max(tau, 1), n)


@njit(cache=True, nogil=True, error_model="numpy")
def staleness_aware_momentum_flat(w, m, g, lr, mu, tau):
    """``m = mu * m + g / max(tau, 1); w -= lr * m`` (the stale gradient is damped
    before it enters the momentum buffer)."""
    momentum_flat(w, m, g, lr, mu, 1.0 / max(tau, 1))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def staleness_aware_momentum_rows(W, M, rows, G, lr, mu, tau, n=-1):
    """Lazy sparse-row twin of ``staleness_aware_momentum_flat``."""
    momentum_rows(W, M, rows, G, lr, mu, 1.0 / max(tau, 1), n)


@njit(cache=True, nogil=True, error_model="numpy")
def _repeats(rows, b):
    """Find the rows that occur more than once among the first ``b``, without sorting.

    Returns ``(code, ns)``: ``code[i] = -1`` when ``rows[i]`` occurs once;
    ``code[i] = 2*s`` at the first occurrence of a repeated row and ``2*s + 1`` at
    each later one, ``s`` in ``[0, ns)`` numbering the distinct repeated rows in the
    order their second occurrences come. Allocates its table and codes; the step
    core's fused kernels call :func:`repeats_into` with buffers of their own.
    """
    tab = np.empty(hash_size(b), np.int32)
    code = np.empty(b, np.int64)
    return code, repeats_into(rows, b, tab, code)


@njit(cache=True, nogil=True, inline="always")
def hash_size(b):
    """Slots of :func:`repeats_into`'s table for ``b`` rows: a power of two >= 8b."""
    size = 16
    while size < 8 * b:
        size *= 2
    return size


@njit(cache=True, nogil=True, error_model="numpy")
def repeats_into(rows, b, tab, code):
    """:func:`_repeats` into ``code`` (>= b entries), using ``tab`` (int32, at least
    ``hash_size(b)`` slots, overwritten) as its table; returns ``ns``.

    A linear-probing hash table of batch positions (a power of two of at least ``8 * b``
    slots: 128 KB at b = 4096, in L2), keyed by ``rows[pos]``. Probe collisions are
    branch misses, which is what this loop costs: measured 12 us at load 1/4, 10 us at
    1/8, no better at 1/16 (b = 4096). One pass over ``rows``, no table row touched:
    about 2 ns a row, against about 27 ns a row for the update pass on a table beyond
    L3.
    """
    size = hash_size(b)
    msk = size - 1
    for h in range(size):
        tab[h] = -1
    ns = 0
    for i in range(b):
        r = rows[i]
        h = r * 0x9E3779B1                    # int64 multiply (wraps when compiled)
        h = (h ^ (h >> 16)) & msk
        while True:
            j = tab[h]
            if j < 0:
                tab[h] = i
                code[i] = -1
                break
            if rows[j] == r:
                c = code[j]
                if c < 0:
                    c = 2 * ns
                    code[j] = c
                    ns += 1
                code[i] = c + 1
                break
            h = (h + 1) & msk
    return ns


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
def dc_rows(W, rows, G, B, lr, lam, n=-1):
    """Sparse-row constant DC-ASGD; ``B[i]`` is the ``w_bak`` of row ``rows[i]``;
    ``w - w_bak`` is the row's value when the call starts (see the module docstring:
    one pass, with the start values of repeated rows saved at their first occurrence).
    """
    a = W.dtype.type(lr)
    c = W.dtype.type(lam)
    n = rows.shape[0] if n < 0 else n
    d = W.shape[1]
    pf = prefetched(W)
    for i in range(min(_AHEAD, n) if pf else 0):
        prefetch_row(W, rows[i])
    code, ns = _repeats(rows, n)
    S = np.empty((ns, d), W.dtype)
    for i in range(n):
        if pf and i + _AHEAD < n:
            prefetch_row(W, rows[i + _AHEAD])
        r = rows[i]
        k = code[i]
        if k < 0 or (k & 1) == 0:             # W[r] still holds its start value
            if k >= 0:                        # (kept for its repeats; written out:
                for j in range(d):            # a helper passed the arrays per row)
                    S[k >> 1, j] = W[r, j]
            for j in range(d):
                gi = G[i, j]
                wi = W[r, j]
                W[r, j] = wi - a * (gi + ((c * (wi - B[i, j])) * gi) * gi)
        else:                                 # a repeat: the start value is in S
            s = k >> 1
            for j in range(d):
                gi = G[i, j]
                W[r, j] -= a * (gi + ((c * (S[s, j] - B[i, j])) * gi) * gi)


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


@njit(cache=True, nogil=True, inline="always")
def _prefetch_state(W, A, B, with_b, r):
    """Prefetch row ``r`` of the parameter and of the state it updates with it (the
    callers ask ``sparse.prefetched`` once per call)."""
    prefetch_row(W, r)
    prefetch_row(A, r)
    if with_b:
        prefetch_row(B, r)


@njit(cache=True, nogil=True, inline="always")
def _one_pass_start(W, A, B, with_b, rows, n):
    """The start of a one-pass delayed kernel: prefetch the first rows, find the
    repeated rows (``code``, see :func:`_repeats`) and make room for their start
    values (``S``)."""
    for i in range(min(_AHEAD2, n) if prefetched(W) else 0):
        _prefetch_state(W, A, B, with_b, rows[i])
    code, ns = _repeats(rows, n)
    return code, np.empty((ns, W.shape[1]), W.dtype)


@njit(cache=True, nogil=True, error_model="numpy")
def dc_adaptive_rows(W, MS, rows, G, B, lr, lam0, m, eps, n=-1):
    """Sparse-row adaptive DC-ASGD (``MS`` moves on touched rows only)."""
    a = W.dtype.type(lr)
    l0 = W.dtype.type(lam0)
    mm = W.dtype.type(m)
    m1 = W.dtype.type(1.0 - m)
    e = W.dtype.type(eps)
    n = rows.shape[0] if n < 0 else n
    d = W.shape[1]
    code, S = _one_pass_start(W, MS, MS, False, rows, n)
    pf = prefetched(W)
    for i in range(n):                        # as gap_aware_rows: no per-row helper
        if pf and i + _AHEAD2 < n:
            _prefetch_state(W, MS, MS, False, rows[i + _AHEAD2])
        r = rows[i]
        k = code[i]
        fresh = k < 0 or (k & 1) == 0
        if k >= 0 and fresh:
            for j in range(d):
                S[k >> 1, j] = W[r, j]
        if fresh:
            for j in range(d):
                gi = G[i, j]
                wi = W[r, j]
                v = mm * MS[r, j] + m1 * (gi * gi)
                MS[r, j] = v
                lam_t = l0 / sqrt(v + e)
                W[r, j] = wi - a * (gi + ((lam_t * (wi - B[i, j])) * gi) * gi)
        else:
            s = k >> 1
            for j in range(d):
                gi = G[i, j]
                v = mm * MS[r, j] + m1 * (gi * gi)
                MS[r, j] = v
                lam_t = l0 / sqrt(v + e)
                W[r, j] -= a * (gi + ((lam_t * (S[s, j] - B[i, j])) * gi) * gi)


# --- Gap-Aware (Barkai, Hakimi, Schuster; ICLR 2020) ---------------------------------

@njit(cache=True, nogil=True, inline="always")
def _ga_constants(w, lr, mu, gamma, lr_max, k):
    """Gap-Aware's scalars in the parameter's dtype: ``lr, mu, gamma, 1 - gamma``, the
    bias correction ``1 / (1 - gamma^k)``, ``lr_max``, ``1e-8`` and ``1``."""
    T = w.dtype.type
    return (T(lr), T(mu), T(gamma), T(1.0 - gamma), T(1.0 / (1.0 - gamma ** k)), T(lr_max),
            T(1e-8), T(1.0))


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
    a, b, gm, g1, bc, cm, tiny, one = _ga_constants(w, lr, mu, gamma, lr_max, k)
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
def gap_aware_rows(W, M, V, rows, G, R, lr, mu, gamma, lr_max, k, n=-1):
    """Sparse-row Gap-Aware; ``R[i]`` is the ``w_read`` of row ``rows[i]``.

    Same equations as ``gap_aware_flat``; ``M`` and ``V`` move on touched rows only,
    and the bias correction uses the parameter's step count ``k`` (a rarely touched
    row's ``v_hat`` is then an under-estimate, which makes its gap larger: the
    conservative side). ``M`` is not touched when ``mu == 0`` (pass any 2-D array).
    The gap is taken from the row's value when the call starts (one pass; repeated
    rows' start values are saved at their first occurrence).
    """
    a, b, gm, g1, bc, cm, tiny, one = _ga_constants(W, lr, mu, gamma, lr_max, k)
    n = rows.shape[0] if n < 0 else n
    d = W.shape[1]
    mom = mu != 0.0
    code, S = _one_pass_start(W, V, M, mom, rows, n)
    pf = prefetched(W)
    for i in range(n):
        # written out, not a helper taking the arrays: an inlined call still counts
        # references on every array it is passed, ~60 ns a row (20x the arithmetic)
        if pf and i + _AHEAD2 < n:
            _prefetch_state(W, V, M, mom, rows[i + _AHEAD2])
        r = rows[i]
        c = code[i]
        fresh = c < 0 or (c & 1) == 0
        if c >= 0 and fresh:                  # first of a repeated row: keep its start
            for j in range(d):
                S[c >> 1, j] = W[r, j]
        if fresh:                             # W[r] still holds its start value
            if mom:
                for j in range(d):
                    gi = G[i, j]
                    wi = W[r, j]
                    mi = M[r, j]
                    u = b * mi + gi
                    vi = gm * V[r, j] + g1 * (u * u)
                    V[r, j] = vi
                    dl = abs(wi - R[i, j])
                    gap = one + dl / (cm * (sqrt(vi * bc) + tiny)) if dl != 0 else one
                    mi = b * mi + gi / gap
                    M[r, j] = mi
                    W[r, j] = wi - a * mi
            else:
                for j in range(d):
                    gi = G[i, j]
                    wi = W[r, j]
                    vi = gm * V[r, j] + g1 * (gi * gi)
                    V[r, j] = vi
                    dl = abs(wi - R[i, j])
                    gap = one + dl / (cm * (sqrt(vi * bc) + tiny)) if dl != 0 else one
                    W[r, j] = wi - a * (gi / gap)
        else:                                 # a repeat: the start value is in S
            s = c >> 1
            if mom:
                for j in range(d):
                    gi = G[i, j]
                    mi = M[r, j]
                    u = b * mi + gi
                    vi = gm * V[r, j] + g1 * (u * u)
                    V[r, j] = vi
                    dl = abs(S[s, j] - R[i, j])
                    gap = one + dl / (cm * (sqrt(vi * bc) + tiny)) if dl != 0 else one
                    mi = b * mi + gi / gap
                    M[r, j] = mi
                    W[r, j] -= a * mi
            else:
                for j in range(d):
                    gi = G[i, j]
                    vi = gm * V[r, j] + g1 * (gi * gi)
                    V[r, j] = vi
                    dl = abs(S[s, j] - R[i, j])
                    gap = one + dl / (cm * (sqrt(vi * bc) + tiny)) if dl != 0 else one
                    W[r, j] -= a * (gi / gap)
