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
this in two passes: :func:`gaps_into` turns every entry's read copy into its gap
(``w_now - w_read``) before any row is written, then one update pass
(``*_gap_rows``) takes each entry's gap from there. The step core calls the two
passes on its own read buffer (``kernels.rule.apply_rows``: the copies become the
gaps in place); the public ``*_rows`` leave their ``B``/``R`` as they were. One pass
(each row's start value saved at its first occurrence, the gap taken in the update)
gives the same bits and was built, and ran slower live on logreg with two workers
(benchmarks/RESULTS.md, session 54): the two passes stay. The step core skips the gap
pass altogether when its update clock counts every writer (``cfg[CLOCK]``) and says no
other update landed since the read, and on a local-SGD replica
(``kernels.rule.apply_rows(..., fresh)``): every gap is zero, and the rules take their
undamped form at once (:func:`undamped_rows`, no gap row at all; Gap-Aware with
momentum zeroes its copies and takes its update pass). A row
whose gap is all zeros (no one else wrote it since the read: most rows, most steps)
takes the rule's undamped form, which skips the square roots and divisions and
gives the same bits.

Scalars are cast to the parameter dtype once per call. Nothing is checked here;
``hogkit.rules.core`` validates shapes, dtypes and row ranges first (numba does no bounds
checking). Hogwild! races as in ``sparse.py``: deterministic with one writer. The
one-column loops index through ``np.uint64`` as ``sparse.py``'s do (no negative-index
fix-up per access: logreg's Gap-Aware and adaptive DC-ASGD steps 5-10 % faster, one
worker, scratch runs). Row kernels prefetch rows ahead: the gap pass 16 batch entries
ahead (one row in flight per entry: 16 measured 1.2x faster than 8 on a 256 MB table),
the update pass its state rows 8 ahead (with 2-3 tables per entry 16 was slower than
8); square roots use the ``llvm.sqrt`` intrinsic so the loops vectorise
(``_intrinsics.py``).

**Flags.** Every kernel here states its fast-math flags: the step core's
:data:`~hogkit.kernels._intrinsics.FASTMATH` (reassociation), the flags these kernels have
always run with on every engine (they are reached through ``rule.apply_rows`` /
``apply_flat``, compiled with them). A numba kernel that states none takes its first
caller's: compiled first by a direct call, then cached, it ran without reassociation,
and every later run on that numba cache (every engine, every process) computed other
bits: DC-ASGD and Gap-Aware's simulated cells then missed their stored losses in the
last digits (``tests/test_architecture.py`` and ``tests/test_kernels.py`` hold it).
Reassociation may reorder the rules' products; DC-ASGD's fresh read is kept exact by
a select (:func:`_dc_step`).
"""

from typing import NamedTuple

import numpy as np
from numba import njit

from .gapvec import dc_adaptive as _vec_dc_adaptive
from .gapvec import fits as _vec_fits
from .gapvec import gap_aware as _vec_gap_aware
from .gapvec import gaps as _vec_gaps
from .gapvec import undamped as _vec_undamped
from ._intrinsics import FASTMATH, prefetch, prefetch_row, sqrt
from .dense import momentum_flat, sgd_flat
from .rule import register
from .sparse import momentum_rows, prefetched, sgd_rows

_AHEAD = 16              # constant DC-ASGD rows prefetch this many batch entries ahead
_AHEAD2 = 8              # ... and the kernels with a state table (2-3 rows per entry)


# --- staleness-aware (Zhang, Gupta, Lian, Liu; IJCAI 2016) ---------------------------

@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def staleness_aware_flat(w, g, lr, tau):
    """``w -= (lr / max(tau, 1)) * g``: the dense update at a damped learning rate."""
    sgd_flat(w, g, lr / max(tau, 1))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def staleness_aware_rows(W, rows, G, lr, tau, n=-1):
    """``W[rows[i]] -= (lr / max(tau, 1)) * G[i]`` in batch order: the plain sparse
    update at a damped learning rate."""
    sgd_rows(W, rows, G, lr / max(tau, 1), n)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def staleness_aware_momentum_flat(w, m, g, lr, mu, tau):
    """``m = mu * m + g / max(tau, 1); w -= lr * m`` (the stale gradient is damped
    before it enters the momentum buffer)."""
    momentum_flat(w, m, g, lr, mu, 1.0 / max(tau, 1))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def staleness_aware_momentum_rows(W, M, rows, G, lr, mu, tau, n=-1):
    """Lazy sparse-row twin of ``staleness_aware_momentum_flat``."""
    momentum_rows(W, M, rows, G, lr, mu, 1.0 / max(tau, 1), n)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def gaps_into(W, rows, B, n):
    """Each entry's gap as the call starts, in place of its read copy: ``B[i] =
    W[rows[i]] - B[i]`` for ``i < n``, every one taken before any row is written. The
    update pass then takes every occurrence's gap from ``B``, duplicates or not,
    without finding the duplicates (a hash of the batch positions did that: its probes
    and the update pass's branch on each row's kind cost ~13 ns an entry on logreg's
    varying batches), and finds the rows in cache (this pass is their prefetch). In
    place, not into a second array: with two array arguments that might be one, LLVM's
    overlap check sends the loop to its scalar version (measured 1.3x slower on mf's
    rows). A one-column table has a loop of its own (the column loop's set-up cost
    more than the subtraction)."""
    d = W.shape[1]
    pf = prefetched(W)
    if d == 1:
        for i in range(n):
            if pf and i + _AHEAD < n:
                prefetch(W, rows[i + _AHEAD], 0)
            B[i, 0] = W[np.uint64(rows[i]), 0] - B[i, 0]
        return
    if _vec_fits(W, W, B, B) and _vec_gaps(W, rows, B, n, _AHEAD if pf else 0) == 0:
        return
    for i in range(n):
        if pf and i + _AHEAD < n:
            prefetch_row(W, rows[i + _AHEAD])
        r = rows[i]
        for j in range(d):
            B[i, j] = W[r, j] - B[i, j]


@njit(cache=True, nogil=True, inline="always")
def _moved(D, i, d):
    """True when entry ``i``'s gap row is not all zeros (a NaN counts as moved): a row
    no one else wrote since the read takes the rule's undamped form, exactly."""
    m = False
    for j in range(d):
        m |= D[i, j] != 0
    return m


@njit(cache=True, nogil=True, inline="always")
def _count(rows, n):
    return rows.shape[0] if n < 0 else n


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def undamped_rows(W, S, rows, G, lr, decay, n):
    """Adaptive DC-ASGD's and Gap-Aware's (without momentum) step on a *fresh* read (no
    other update landed since it: every gap zero), for ``i < n`` in batch order::

        S[r] = decay * S[r] + (1 - decay) * G[i]**2        W[r] -= lr * G[i]

    (``decay`` is DC-ASGD's ``m``, Gap-Aware's ``gamma``): what
    :func:`dc_adaptive_gap_rows` and :func:`gap_aware_gap_rows` do on a row whose gaps
    are all zeros, to the bit, without a gap row to write, read or check
    (``kernels.rule.apply_rows(..., fresh)`` calls it; zeroing the read copies and
    reading them back cost mf's adaptive DC-ASGD ~9 ns a rating in a scratch A/B, one
    thread)."""
    a = W.dtype.type(lr)
    keep = W.dtype.type(decay)
    fr = W.dtype.type(1.0 - decay)
    d = W.shape[1]
    pf = prefetched(S)
    if d == 1:
        for i in range(n):
            if pf and i + _AHEAD2 < n:
                prefetch(S, rows[i + _AHEAD2], 0)
            r = np.uint64(rows[i])
            gi = G[i, 0]
            S[r, 0] = keep * S[r, 0] + fr * (gi * gi)
            W[r, 0] -= a * gi
        return
    if _vec_fits(W, S, G, G) and _vec_undamped(
            W, S, rows, G, n, _AHEAD2 if pf else 0, a, keep, fr) == 0:
        return
    for i in range(n):
        if pf and i + _AHEAD2 < n:
            prefetch_row(S, rows[i + _AHEAD2])
        r = rows[i]
        for j in range(d):
            gi = G[i, j]
            S[r, j] = keep * S[r, j] + fr * (gi * gi)
            W[r, j] -= a * gi


# --- DC-ASGD (Zheng, Meng, Wang, Chen, Yu, Ma, Liu; ICML 2017) -----------------------

@njit(cache=True, nogil=True, inline="always")
def _dc_step(a, g, lam, d):
    """DC-ASGD's step on one coordinate, ``a·(g + ((lam·d)·g)·g)`` for the gap ``d = w -
    w_bak``; exactly ``a·g`` on a fresh read (``d == 0``), even for a ``g`` whose
    square overflows: under :data:`FASTMATH` LLVM may form ``(lam·d)·(g·g)``, which is
    ``0·inf = NaN`` there. Scalars only (an inlined helper taking arrays pays their
    reference counts in the loop)."""
    return a * g if d == 0 else a * (g + ((lam * d) * g) * g)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def dc_flat(w, g, w_bak, lr, lam):
    """Constant DC-ASGD: ``g' = g + lam * g * g * (w - w_bak); w -= lr * g'``.

    A fresh read (``w == w_bak``) gives exactly ``g``, even for huge ``g``
    (:func:`_dc_step`).
    """
    a = w.dtype.type(lr)
    c = w.dtype.type(lam)
    for i in range(w.shape[0]):
        gi = g[i]
        wi = w[i]
        w[i] = wi - _dc_step(a, gi, c, wi - w_bak[i])


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def dc_rows(W, rows, G, B, lr, lam, n=-1):
    """Sparse-row constant DC-ASGD; ``B[i]`` is the ``w_bak`` of row ``rows[i]``;
    ``w - w_bak`` is the row's value when the call starts (see the module docstring:
    the gaps are taken first, then one update pass). ``B`` is left as it was."""
    n = _count(rows, n)
    D = B[:n].copy()
    gaps_into(W, rows, D, n)
    dc_gap_rows(W, rows, G, D, lr, lam, n)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def dc_gap_rows(W, rows, G, D, lr, lam, n):
    """:func:`dc_rows`'s update pass, from the gaps ``D`` (:func:`gaps_into`)."""
    a = W.dtype.type(lr)
    c = W.dtype.type(lam)
    d = W.shape[1]
    if d == 1:
        for i in range(n):
            gi = G[i, 0]
            W[np.uint64(rows[i]), 0] -= _dc_step(a, gi, c, D[i, 0])
        return
    for i in range(n):
        r = rows[i]
        for j in range(d):
            gi = G[i, j]
            W[r, j] -= _dc_step(a, gi, c, D[i, j])


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
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
        w[i] = wi - _dc_step(a, gi, lam_t, wi - w_bak[i])


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def dc_adaptive_rows(W, MS, rows, G, B, lr, lam0, m, eps, n=-1):
    """Sparse-row adaptive DC-ASGD (``MS`` moves on touched rows only; ``B`` is left
    as it was)."""
    n = _count(rows, n)
    D = B[:n].copy()
    gaps_into(W, rows, D, n)
    dc_adaptive_gap_rows(W, MS, rows, G, D, lr, lam0, m, eps, n)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def dc_adaptive_gap_rows(W, MS, rows, G, D, lr, lam0, m, eps, n):
    """:func:`dc_adaptive_rows`'s update pass, from the gaps ``D``. A row whose gap is
    all zeros skips ``lam_t``'s square root and division: its step is ``a·g``, what
    :func:`_dc_step` gives a zero compensation."""
    a = W.dtype.type(lr)
    l0 = W.dtype.type(lam0)
    mm = W.dtype.type(m)
    m1 = W.dtype.type(1.0 - m)
    e = W.dtype.type(eps)
    d = W.shape[1]
    pf = prefetched(MS)
    if d == 1:
        for i in range(n):
            if pf and i + _AHEAD2 < n:
                prefetch(MS, rows[i + _AHEAD2], 0)
            r = np.uint64(rows[i])
            gi = G[i, 0]
            dd = D[i, 0]
            v = mm * MS[r, 0] + m1 * (gi * gi)
            MS[r, 0] = v
            if dd != 0:
                W[r, 0] -= _dc_step(a, gi, l0 / sqrt(v + e), dd)
            else:
                W[r, 0] -= a * gi
        return
    if _vec_fits(W, MS, G, D) and _vec_dc_adaptive(
            W, MS, rows, G, D, n, _AHEAD2 if pf else 0, a, mm, m1, l0, e) == 0:
        return
    for i in range(n):
        if pf and i + _AHEAD2 < n:
            prefetch_row(MS, rows[i + _AHEAD2])
        r = rows[i]
        if _moved(D, i, d):
            for j in range(d):
                gi = G[i, j]
                v = mm * MS[r, j] + m1 * (gi * gi)
                MS[r, j] = v
                lam_t = l0 / sqrt(v + e)
                W[r, j] -= _dc_step(a, gi, lam_t, D[i, j])
        else:
            for j in range(d):
                gi = G[i, j]
                MS[r, j] = mm * MS[r, j] + m1 * (gi * gi)
                W[r, j] -= a * gi


# --- Gap-Aware (Barkai, Hakimi, Schuster; ICLR 2020) ---------------------------------

@njit(cache=True, nogil=True, inline="always")
def _ga_constants(w, lr, mu, gamma, lr_max, k):
    """Gap-Aware's scalars in the parameter's dtype: ``lr, mu, gamma, 1 - gamma``, the
    bias correction ``1 / (1 - gamma^k)``, ``lr_max``, ``1e-8`` and ``1``."""
    T = w.dtype.type
    return (T(lr), T(mu), T(gamma), T(1.0 - gamma), T(1.0 / (1.0 - gamma ** k)), T(lr_max),
            T(1e-8), T(1.0))


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
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


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def gap_aware_rows(W, M, V, rows, G, R, lr, mu, gamma, lr_max, k, n=-1):
    """Sparse-row Gap-Aware; ``R[i]`` is the ``w_read`` of row ``rows[i]``.

    Same equations as ``gap_aware_flat``; ``M`` and ``V`` move on touched rows only,
    and the bias correction uses the parameter's step count ``k`` (a rarely touched
    row's ``v_hat`` is then an under-estimate, which makes its gap larger: the
    conservative side). ``M`` is not touched when ``mu == 0`` (pass any 2-D array).
    The gap is taken from the row's value when the call starts (the gaps first, then
    one update pass); ``R`` is left as it was.
    """
    n = _count(rows, n)
    D = R[:n].copy()
    gaps_into(W, rows, D, n)
    gap_aware_gap_rows(W, M, V, rows, G, D, lr, mu, gamma, lr_max, k, n)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)
def gap_aware_gap_rows(W, M, V, rows, G, D, lr, mu, gamma, lr_max, k, n):
    """:func:`gap_aware_rows`'s update pass, from the gaps ``D``. A row whose gap is
    all zeros has the penalty 1 on every coordinate, and ``g / 1`` is ``g`` exactly:
    it skips the square roots and divisions (the same bits)."""
    a, b, gm, g1, bc, cm, tiny, one = _ga_constants(W, lr, mu, gamma, lr_max, k)
    d = W.shape[1]
    pf = prefetched(V)
    if mu != 0.0:
        for i in range(n):
            if pf and i + _AHEAD2 < n:
                prefetch_row(V, rows[i + _AHEAD2])
                prefetch_row(M, rows[i + _AHEAD2])
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
    elif d == 1:
        for i in range(n):
            if pf and i + _AHEAD2 < n:
                prefetch(V, rows[i + _AHEAD2], 0)
            r = np.uint64(rows[i])
            gi = G[i, 0]
            vi = gm * V[r, 0] + g1 * (gi * gi)
            V[r, 0] = vi
            dl = abs(D[i, 0])
            if dl != 0:
                W[r, 0] -= a * (gi / (one + dl / (cm * (sqrt(vi * bc) + tiny))))
            else:
                W[r, 0] -= a * gi
    elif not (_vec_fits(W, V, G, D) and _vec_gap_aware(
            W, V, rows, G, D, n, _AHEAD2 if pf else 0, a, gm, g1, bc, cm, tiny) == 0):
        for i in range(n):
            if pf and i + _AHEAD2 < n:
                prefetch_row(V, rows[i + _AHEAD2])
            r = rows[i]
            if _moved(D, i, d):
                for j in range(d):
                    gi = G[i, j]
                    vi = gm * V[r, j] + g1 * (gi * gi)
                    V[r, j] = vi
                    dl = abs(D[i, j])
                    gap = one + dl / (cm * (sqrt(vi * bc) + tiny)) if dl != 0 else one
                    W[r, j] -= a * (gi / gap)
            else:
                for j in range(d):
                    gi = G[i, j]
                    V[r, j] = gm * V[r, j] + g1 * (gi * gi)
                    W[r, j] -= a * gi


# --- the rules (rule.py's contract) --------------------------------------------------

class StalenessCfg(NamedTuple):
    """Staleness-aware SGD: ``lr / max(tau, 1)``, with heavy-ball momentum ``mu``
    (0: none) damping the gradient on its way into the buffer ``S1``."""
    lr: float
    mu: float


class DCCfg(NamedTuple):
    """Constant DC-ASGD: compensation strength ``lam``."""
    lr: float
    lam: float


class DCAdaptiveCfg(NamedTuple):
    """Adaptive DC-ASGD: ``lam0``, the mean square's rate ``m`` and ``eps`` (``S1``
    the mean square)."""
    lr: float
    lam0: float
    m: float
    eps: float


class GapAwareCfg(NamedTuple):
    """Gap-Aware: momentum ``mu`` (0: none), the second moment's decay ``gamma`` and
    the gap's unit ``lr_max`` (``S1`` the second moment, ``S2`` the momentum buffer,
    ``K[ki]`` the parameter's step count)."""
    lr: float
    mu: float
    gamma: float
    lr_max: float


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def staleness_rows_rule(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
    n = _count(rows, n)
    if c.mu != 0.0:
        staleness_aware_momentum_rows(W, S1, rows, G, c.lr, c.mu, tau, n)
    else:
        staleness_aware_rows(W, rows, G, c.lr, tau, n)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def staleness_flat_rule(c, w, s1, s2, K, ki, g, read, tau, t):
    if c.mu != 0.0:
        staleness_aware_momentum_flat(w, s1, g, c.lr, c.mu, tau)
    else:
        staleness_aware_flat(w, g, c.lr, tau)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def dc_rows_rule(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
    """Constant DC-ASGD on rows: the read copies ``R`` become the gaps in place, then
    the update pass; on a ``fresh`` step (no gap) SGD's row kernel, ``a·g``."""
    n = _count(rows, n)
    if fresh:
        sgd_rows(W, rows, G, c.lr, n)
    else:
        gaps_into(W, rows, R, n)
        dc_gap_rows(W, rows, G, R, c.lr, c.lam, n)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def dc_flat_rule(c, w, s1, s2, K, ki, g, read, tau, t):
    dc_flat(w, g, read, c.lr, c.lam)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def dc_adaptive_rows_rule(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
    """Adaptive DC-ASGD on rows; a ``fresh`` step takes :func:`undamped_rows` (no gap
    row written, read or checked)."""
    n = _count(rows, n)
    if fresh:
        undamped_rows(W, S1, rows, G, c.lr, c.m, n)
    else:
        gaps_into(W, rows, R, n)
        dc_adaptive_gap_rows(W, S1, rows, G, R, c.lr, c.lam0, c.m, c.eps, n)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def dc_adaptive_flat_rule(c, w, s1, s2, K, ki, g, read, tau, t):
    dc_adaptive_flat(w, s1, g, read, c.lr, c.lam0, c.m, c.eps)


@njit(cache=True, nogil=True, inline="always")
def _gaps(W, rows, R, n, fresh):
    """The read copies ``R[:n]`` become the gaps: zeros when ``fresh`` (nothing else
    wrote since the read, by the caller's clock), else ``W[rows] - R`` (measured).
    Only Gap-Aware with momentum zeroes them (its fresh step still takes its update
    pass); the other rules' fresh steps read no gaps at all."""
    if fresh:
        for i in range(n):
            for j in range(R.shape[1]):
                R[i, j] = 0
    else:
        gaps_into(W, rows, R, n)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def gap_aware_rows_rule(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
    """Gap-Aware on rows, step ``K[ki] + 1``; a ``fresh`` step without momentum takes
    :func:`undamped_rows`."""
    n = _count(rows, n)
    K[ki] += 1
    if fresh and c.mu == 0.0:
        undamped_rows(W, S1, rows, G, c.lr, c.gamma, n)
    else:
        _gaps(W, rows, R, n, fresh)
        gap_aware_gap_rows(W, S2, S1, rows, G, R, c.lr, c.mu, c.gamma, c.lr_max, K[ki], n)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def gap_aware_flat_rule(c, w, s1, s2, K, ki, g, read, tau, t):
    K[ki] += 1
    gap_aware_flat(w, s2, s1, g, read, c.lr, c.mu, c.gamma, c.lr_max, K[ki])


register(StalenessCfg, rows=staleness_rows_rule, flat=staleness_flat_rule)
register(DCCfg, rows=dc_rows_rule, flat=dc_flat_rule)
register(DCAdaptiveCfg, rows=dc_adaptive_rows_rule, flat=dc_adaptive_flat_rule)
register(GapAwareCfg, rows=gap_aware_rows_rule, flat=gap_aware_flat_rule)
