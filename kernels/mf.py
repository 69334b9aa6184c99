"""Matrix-factorisation kernels: minibatch gradient and sum of squared errors.

Notation (Koren, Bell & Volinsky 2009; Hogwild!, Niu et al. 2011, section 5): a rating
r_ui is predicted by the dot product of a row factor p_u (row u of ``P``) and a column
factor q_i (row i of ``Q``); the error is e_ui = r_ui - p_u . q_i and the per-rating
loss is 1/2 (e_ui^2 + reg (|p_u|^2 + |q_i|^2)), whose gradient is

    dP[u] = -e_ui q_i + reg p_u        dQ[i] = -e_ui p_u + reg q_i

Pure functions on arrays and scalars; no checking (the caller checks); nothing here
imports hogkit. float32 or float64 factors; int32 or int64 index arrays. All arithmetic
is float64 (each element is converted once), results are stored in the output's dtype.
``MFArrays`` with ``mf_sample`` and ``mf_gradient`` are the step core's protocol
(``step.register``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from . import step as _step
from ._intrinsics import prefetch, sqrt
from .blocks import block_sample
from .rowvec import (fits, grad_fits, grad_rows, rowwise_span, rowwise_span_pf, sgd_span,
                     sgd_span_pf, sgd_span_pf_plain, sgd_span_plain)
from .adaptive import AdaGradCfg, RMSPropCfg
from .rule import FASTMATH as _FM   # the step core's flags: the same numbers both ways
from .sgd import SGDCfg


_NO_BLOCKS = np.zeros(0, np.int64)


class MFArrays(NamedTuple):
    """Matrix factorisation's compiled part: the ratings (``u``, ``i``, ``r``, in the
    order ``build`` shuffled once) and the L2 coefficient ``reg``; for the block order
    (``blocks.py``) the block offsets ``blk_off`` and the shared scheduler ``blk_sched``
    (empty: the sweep); ``prefetch``, how many ratings ahead the per-sample lane asks
    for a rating's rows (0: never; worth it when the factor tables outgrow the core's
    cache, a cost when they fit)."""
    u: np.ndarray
    i: np.ndarray
    r: np.ndarray
    reg: float
    blk_off: np.ndarray = _NO_BLOCKS
    blk_sched: np.ndarray = _NO_BLOCKS
    prefetch: int = 0


@njit(cache=True, nogil=True, inline="always")
def sweep_sample(n, cursor, nb, idx):
    """``idx[j] = (cursor + j) mod n`` for j < nb, then ``cursor += nb`` (mod n): a
    worker sweeps the stored (shuffled) order from its own random start, so every
    sample is visited once per pass: SGD epochs without replacement, read sequentially
    (the order LIBMF and a plain per-sample loop read in)."""
    v = cursor[0]
    if not 0 <= v < n:                # a cursor from other data: start over inside
        v %= n
    j = 0
    while j < nb:                     # runs up to the end, then from 0
        m = min(nb - j, n - v)
        base = np.uint64(j)           # unsigned: no negative-index fix-up, so the
        for k in range(np.uint64(m)):   # loop vectorises (5x faster at 256 ids)
            idx[base + k] = v + np.int64(k)
        j += m
        v += m
        if v >= n:
            v = 0
    cursor[0] = v


@njit(cache=True, nogil=True, inline="always")
def mf_sample(wl, rng, cursor, nb, idx):
    """The step core's sampler of matrix factorisation: a sweep, or the block order
    when ``blk_off`` is given (``blocks.block_sample``); ``rng`` unused."""
    if wl.blk_off.shape[0] == 0:
        sweep_sample(wl.r.shape[0], cursor, nb, idx)
    else:
        block_sample(wl.blk_off, wl.blk_sched, cursor, nb, idx)


@njit(cache=True, nogil=True, fastmath=_FM)
def mf_gradient(wl, params, idx, nb, keep_read, G, R, RD, cnt):
    """Per-rating gradient rows of the ratings ``idx[:nb]`` (the step core protocol).

    For b < nb, with t = idx[b], uu = u[t], ii = i[t]: ``R[0][b] = uu``,
    ``R[1][b] = ii``, ``G[0][b] = dP[uu]`` and ``G[1][b] = dQ[ii]`` as in the module
    docstring. With ``keep_read`` the two factor rows are first copied into
    ``RD[0][b]``, ``RD[1][b]`` and everything is computed from the copies (a consistent
    ``w_read`` for DC-ASGD and Gap-Aware); else straight from the shared rows. Nothing
    is summed across b: duplicate rows are left for the rule. ``cnt[0] = cnt[1] = nb``.
    Returns True when it checked every value it wrote finite (the vector rows,
    ``rowvec.grad_rows``: the step core then skips its scan), else False.

    Racy by design when P and Q are shared and written by others: a row may be read
    half-updated (Hogwild!). Arithmetic: the error e is accumulated in float64 (the dot
    product reassociated, so it vectorises); the gradient rows are formed in the
    factors' dtype, ``g = (-e)·q + reg·p``.
    """
    if keep_read:
        checked = _mf_rows(wl, params[0], params[1], idx, nb, G[0], G[1], R[0], R[1],
                           RD[0], RD[1], True)
    else:
        checked = _mf_rows(wl, params[0], params[1], idx, nb, G[0], G[1], R[0], R[1],
                           G[0], G[1], False)
    cnt[0] = nb
    cnt[1] = nb
    return checked


@njit(cache=True, nogil=True, fastmath=_FM, inline="always")
def _dot(P, Q, uu, ii):
    """``(P[uu] · Q[ii], |P[uu]|² + |Q[ii]|²)`` in one loop, accumulated in the factors'
    dtype (as a plain loop and LIBMF do: float32 sums vectorise twice as wide as
    float64; ~8 % faster steps on ``mf``): one definition for the gradient and the
    fused SGD kernel, so both sum in the same order (the fused kernel bounds its update
    with the norm; a float32 norm that overflows is inf, and the bound then fails)."""
    T = P.dtype.type
    pred = T(0.0)
    norm = T(0.0)
    for k in range(P.shape[1]):
        pk = P[uu, k]
        qk = Q[ii, k]
        pred += pk * qk
        norm += pk * pk + qk * qk
    return float(pred), float(norm)


@njit(cache=True, nogil=True, inline="always")
def _rating(u, i, idx, b, RP, RQ):
    """The ``b``-th sampled rating: its id and its rows of P and Q, recorded in RP/RQ."""
    t = idx[b]
    uu = u[t]
    ii = i[t]
    RP[b] = uu
    RQ[b] = ii
    return t, uu, ii


@njit(cache=True, nogil=True, fastmath=_FM, inline="always")
def _mf_rows(wl, P, Q, idx, nb, GP, GQ, RP, RQ, DP, DQ, copy):
    u, i, r = wl.u, wl.i, wl.r
    T = P.dtype.type
    reg = T(wl.reg)
    K = P.shape[1]
    if copy and grad_fits(P, Q, GP, GQ, DP, DQ):
        done = grad_rows(P, Q, u, i, r, idx, nb, GP, GQ, RP, RQ, DP, DQ, reg)
        if done >= 0:                   # straight-line vector rows (kernels/rowvec.py)
            return done == 0            # ... which checked every value finite
    for b in range(nb):
        t, uu, ii = _rating(u, i, idx, b, RP, RQ)
        if copy:                        # w_read: the rows as read, used for everything
            for k in range(K):
                DP[b, k] = P[uu, k]
                DQ[b, k] = Q[ii, k]
            ne = T(_dot(DP, DQ, b, b)[0] - float(r[t]))
            for k in range(K):
                GP[b, k] = ne * DQ[b, k] + reg * DP[b, k]
                GQ[b, k] = ne * DP[b, k] + reg * DQ[b, k]
        else:
            ne = T(_dot(P, Q, uu, ii)[0] - float(r[t]))
            for k in range(K):
                GP[b, k] = ne * Q[ii, k] + reg * P[uu, k]
                GQ[b, k] = ne * P[uu, k] + reg * Q[ii, k]
    return False


@njit(cache=True, nogil=True, inline="always")
def _later_use(saved, side, slot, S, W, row):
    """A repeated row (``slot > 0``): at its first use in the step save its start value
    into ``S[slot]`` and return False; at a later use return True (its gradient then
    comes from the save). A row seen once (``slot == 0``): False."""
    if slot == 0:
        return False
    if saved[side, slot] == 0:
        saved[side, slot] = 1
        for k in range(W.shape[1]):
            S[slot, k] = W[row, k]
        return False
    return True


@njit(cache=True, nogil=True, fastmath=_FM, inline="always")
def _stamp(x, tag, ns):
    """A factor row met in pass 1 of :func:`mf_sgd`: ``(its new stamp, the save slots
    handed out)`` for a row stamped ``x``, in the step stamped ``tag = step << 20``.
    At the row's first use in the step ``tag``; at its second the next save slot,
    ``tag | ns + 1``; later, unchanged. Scalars in and out: with the stamp array passed
    in, reference counting stayed in the rating loop (steps 1.2-1.6x slower), and
    cutting the two passes into helpers added a reference count per step."""
    if (x >> 20) != (tag >> 20):
        return tag, ns                      # first occurrence in this step
    if (x & 0xFFFFF) == 0:
        return tag | (ns + 1), ns + 1       # a repeat: give the row a save slot
    return x, ns


@njit(cache=True, nogil=True, fastmath=_FM)
def mf_sgd(wl, params, idx, nb, lr, G, R, RD, cnt, scratch):
    """Plain SGD on the ratings ``idx[:nb]`` fused with their gradient: the step core's
    fast path, with exactly the result of :func:`mf_gradient` followed by the SGD
    apply (``W[rows[b]] -= lr·G[b]`` in batch order), without storing the gradient.

    Pass 1 computes every rating's error from the factors as they are at the start of
    the step (nothing is written yet) and finds the rows that occur more than once in
    the batch: ``scratch`` = ``(stamp_P, stamp_Q, saved, step)`` holds, per factor row,
    ``step << 20 | slot`` (slot 0: seen once in this step, else the save slot of a
    repeated row; :func:`_stamp`), so a repeat is found with one load per row (no
    hashing, no reset).
    Pass 2 applies; a repeated row has its start value saved (into ``G``, as scratch)
    before its first update, and its later occurrences form their gradient from it,
    as the minibatch does. Returns False, having written nothing, when it cannot
    guarantee a finite update (a non-finite error, or ``(|e| + |reg|)·‖(p, q)‖`` near
    the dtype's range): the core then runs the general path, whose guard decides.
    ``RD[0]`` column 0 keeps the errors.
    """
    P = params[0]
    Q = params[1]
    u, i, r = wl.u, wl.i, wl.r
    stP, stQ, saved, counter = scratch
    T = P.dtype.type
    reg = T(wl.reg)
    a = T(lr)
    RP, RQ, E, SP, SQ = R[0], R[1], RD[0], G[0], G[1]
    K = P.shape[1]
    sid = counter[0] + 1
    counter[0] = sid
    tag = sid << 20
    nsp = 0
    nsq = 0
    chk = 0.0
    worst = 0.0                             # the largest bound on (|g_k| / guard)^2
    for b in range(nb):
        t, uu, ii = _rating(u, i, idx, b, RP, RQ)
        stP[uu], nsp = _stamp(stP[uu], tag, nsp)
        stQ[ii], nsq = _stamp(stQ[ii], tag, nsq)
        pred, norm = _dot(P, Q, uu, ii)
        ne = T(pred - float(r[t]))
        E[b, 0] = ne
        e = abs(float(ne)) + abs(float(reg))
        bound = e * e * norm                # |g_k| <= (|e| + |reg|)·‖(p, q)‖
        worst = bound if bound > worst else worst
        chk += float(ne) - float(ne)
    big = 3.4e36 if P.itemsize == 4 else 1.7e306     # 1 % of the dtype's largest value
    if not (chk == 0.0 and worst < big * big):
        return False
    for s in range(nsp + 1):
        saved[0, s] = 0
    for s in range(nsq + 1):
        saved[1, s] = 0
    for b in range(nb):
        uu = RP[b]
        ii = RQ[b]
        ne = E[b, 0]
        sp = stP[uu] & 0xFFFFF
        sq = stQ[ii] & 0xFFFFF
        later_p = _later_use(saved, 0, sp, SP, P, uu)
        later_q = _later_use(saved, 1, sq, SQ, Q, ii)
        if not (later_p or later_q):        # both rows hold their start values
            for k in range(K):
                pk = P[uu, k]
                qk = Q[ii, k]
                P[uu, k] = pk - a * (ne * qk + reg * pk)
                Q[ii, k] = qk - a * (ne * pk + reg * qk)
        else:
            for k in range(K):
                pk = SP[sp, k] if later_p else P[uu, k]
                qk = SQ[sq, k] if later_q else Q[ii, k]
                P[uu, k] -= a * (ne * qk + reg * pk)
                Q[ii, k] -= a * (ne * pk + reg * qk)
    cnt[0] = nb
    cnt[1] = nb
    return True


#: the per-sample lane's flags: the step core's, plus FMA contraction (``a·e·q + p`` in
#: one rounding; ~20 % faster per rating, and what a plain compiled loop gets)
_FM_LANE = {"reassoc", "contract"}
#: the lane's guard: an error below ``LANE_LIMIT / max(lr, 1)`` in magnitude (and
#: finite) keeps the update finite while every factor it reads is below
#: ``LANE_LIMIT`` (1e18 for float32, max ~3.4e38; 1e150 for float64; see
#: docs/algorithms.md, the per-sample lane)
LANE_LIMIT32, LANE_LIMIT64 = 1e18, 1e150


@njit(cache=True, nogil=True, fastmath=_FM_LANE, inline="always")
def _pred(P, Q, uu, ii):
    """``P[uu] · Q[ii]`` accumulated in the factors' dtype (reassociated: vectorised)."""
    T = P.dtype.type
    pred = T(0.0)
    for k in range(P.shape[1]):
        pred += P[uu, k] * Q[ii, k]
    return pred


@njit(cache=True, nogil=True, fastmath=_FM_LANE, inline="always")
def _pred_norms(P, Q, uu, ii):
    """``(P[uu]·Q[ii], |P[uu]|², |Q[ii]|²)`` in one pass, in the factors' dtype."""
    T = P.dtype.type
    pred = T(0.0)
    pp = T(0.0)
    qq = T(0.0)
    for k in range(P.shape[1]):
        pk = P[uu, k]
        qk = Q[ii, k]
        pred += pk * qk
        pp += pk * pk
        qq += qk * qk
    return pred, pp, qq


@njit(cache=True, nogil=True, inline="always")
def _run_length(idx, b, nb):
    """How many of ``idx[b:nb]`` are consecutive ids from ``idx[b]`` (at least 1): one
    vectorised pass when they all are (a sweep's batch), else a scan to the first gap."""
    t0 = idx[b]
    gaps = 0
    ub = np.uint64(b)
    for j in range(ub, np.uint64(nb)):
        gaps += idx[j] != t0 + np.int64(j - ub)
    if gaps == 0:
        return nb - b
    m = 1
    while idx[b + m] == t0 + m:
        m += 1
    return m


@njit(cache=True, nogil=True, fastmath=_FM_LANE, inline="always")
def _sgd_runs(wl, P, Q, idx, nb, a, lim, skip):
    """SGD's per-sample lane on the batch ``idx[:nb]``, cut into runs of consecutive
    rating ids (a sweep's batch is one run, or two where it wraps; a block-order batch
    one per block it reads), each run applied by a span kernel that reads rating ``t0 +
    b`` by position: no index load, and an unsigned index needs no sign check. With
    ``wl.prefetch`` > 0 a span also prefetches the rows of the rating that many places
    ahead in storage, past the run's end while inside the data (the next batch goes on
    from there). Returns the ratings left out by the guard."""
    n = wl.r.shape[0]
    T = P.dtype.type
    reg = T(wl.reg)
    pf_end = n if wl.prefetch > 0 else 0    # prefetch rating t + ahead while < pf_end
    u, i, r, ahead = wl.u, wl.i, wl.r, wl.prefetch
    vector = fits(P, Q)
    keep = T(1.0) - a * reg
    bad = 0
    b = 0
    while b < nb:
        m = _run_length(idx, b, nb)
        t0 = idx[b]
        if vector:                    # straight-line vector rows (kernels/rowvec.py)
            if pf_end > 0 and reg == 0:
                got = sgd_span_pf_plain(P, Q, u, i, r, t0, m, ahead, pf_end, a, keep, lim,
                                        skip)
            elif pf_end > 0:
                got = sgd_span_pf(P, Q, u, i, r, t0, m, ahead, pf_end, a, keep, lim, skip)
            elif reg == 0:
                got = sgd_span_plain(P, Q, u, i, r, t0, m, ahead, pf_end, a, keep, lim, skip)
            else:
                got = sgd_span(P, Q, u, i, r, t0, m, ahead, pf_end, a, keep, lim, skip)
        elif pf_end > 0 and reg == 0:
            got = _sgd_span_pf_plain(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip)
        elif pf_end > 0:
            got = _sgd_span_pf(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip)
        elif reg == 0:
            got = _sgd_span_plain(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip)
        else:
            got = _sgd_span(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip)
        bad += got
        if got > 0 and not skip:
            return bad
        b += m
    return bad


@njit(cache=True, nogil=True, fastmath=_FM_LANE, inline="always")
def _adaptive_runs(wl, P, Q, SP, SQ, idx, nb, a, decay, fresh, eps, lim, skip):
    """:func:`_sgd_runs` for AdaGrad and RMSProp (only their spans compiled)."""
    n = wl.r.shape[0]
    T = P.dtype.type
    reg = T(wl.reg)
    pf_end = n if wl.prefetch > 0 else 0
    u, i, r, ahead = wl.u, wl.i, wl.r, wl.prefetch
    vector = SP.shape[1] != P.shape[1] and fits(P, Q)    # row-wise (as _adaptive_body)
    bad = 0
    b = 0
    while b < nb:
        m = _run_length(idx, b, nb)
        t0 = idx[b]
        if vector and pf_end > 0:
            got = rowwise_span_pf(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip, SP,
                                  SQ, decay, fresh, eps)
        elif vector:
            got = rowwise_span(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip, SP, SQ,
                               decay, fresh, eps)
        elif pf_end > 0:
            got = _adaptive_span_pf(P, Q, SP, SQ, u, i, r, t0, m, ahead, pf_end, a, reg,
                                    decay, fresh, eps, lim, skip)
        else:
            got = _adaptive_span(P, Q, SP, SQ, u, i, r, t0, m, ahead, pf_end, a, reg, decay,
                                 fresh, eps, lim, skip)
        bad += got
        if got > 0 and not skip:
            return bad
        b += m
    return bad


@njit(cache=True, nogil=True, fastmath=_FM_LANE, inline="always")
def mf_lane_sgd(wl, params, idx, nb, c, S1, skip):
    """The per-sample lane of matrix factorisation (the step core protocol's ``lane``)
    under SGD: for b < nb in order, rating t = idx[b] updates its two factor rows at
    once, from their values now (Hogwild!, Niu et al. 2011; LIBMF's inner loop), with
    ``e = p·q - r``, ``g_p = e·q + reg·p``, ``g_q = e·p + reg·q`` (both from the rows as
    read): ``p -= lr·g_p``, ``q -= lr·g_q``.

    The guard is per rating and costs one compare: a rating whose error is not finite
    or exceeds ``LANE_LIMIT / max(lr, 1)`` is left out (nothing of it written, counted
    in the return value); with ``skip`` False the call stops there. Returns the ratings
    left out. One kernel a rule (registered per configuration class): a run on SGD
    compiles none of the adaptive rules' spans. Inlined where it is called: the step
    core then calls the span kernels (compiled under their own flags) directly, and
    does not pay a call level's reference counts of the data, factors and state."""
    P = params[0]
    T = P.dtype.type
    lim = T((LANE_LIMIT32 if P.itemsize == 4 else LANE_LIMIT64) / max(c.lr, 1.0))
    return _sgd_runs(wl, P, params[1], idx, nb, T(c.lr), lim, skip)


@njit(cache=True, nogil=True, fastmath=_FM_LANE, inline="always")
def mf_lane_adagrad(wl, params, idx, nb, c, S1, skip):
    """:func:`mf_lane_sgd` under AdaGrad (``kernels.adaptive``, state ``S1 = (S_P,
    S_Q)``): per coordinate, in the order of operations of ``adaptive.adaptive_row``; or
    row-wise (a state of one column: LIBMF's per-row step), the mean square of a row's
    gradient formed from the norms the dot product's pass also sums,
    ``|g_p|² = e²|q|² + 2·e·reg·(p·q) + reg²|p|²`` (the same value up to rounding,
    without a pass of its own)."""
    P = params[0]
    T = P.dtype.type
    lim = T((LANE_LIMIT32 if P.itemsize == 4 else LANE_LIMIT64) / max(c.lr, 1.0))
    return _adaptive_runs(wl, P, params[1], S1[0], S1[1], idx, nb, T(c.lr), T(1.0),
                          T(1.0), T(c.eps), lim, skip)


@njit(cache=True, nogil=True, fastmath=_FM_LANE, inline="always")
def mf_lane_rmsprop(wl, params, idx, nb, c, S1, skip):
    """:func:`mf_lane_adagrad` under RMSProp (the accumulator decays by ``alpha``)."""
    P = params[0]
    T = P.dtype.type
    lim = T((LANE_LIMIT32 if P.itemsize == 4 else LANE_LIMIT64) / max(c.lr, 1.0))
    decay = T(c.alpha)
    return _adaptive_runs(wl, P, params[1], S1[0], S1[1], idx, nb, T(c.lr), decay,
                          T(1.0) - decay, T(c.eps), lim, skip)


@njit(cache=True, nogil=True, inline="always")
def _prefetch_rows(A, B, ra, rb):
    """Ask for row ``ra`` of ``A`` and row ``rb`` of ``B`` (every 64-byte line) ahead of
    their use: for tables bigger than the cache, the rows' misses then overlap the
    ratings in between (``MFArrays.prefetch``). A hint: nothing is read or written."""
    for j in range(0, A.shape[1], max(1, 64 // A.itemsize)):
        prefetch(A, ra, j)
        prefetch(B, rb, j)


@njit(cache=True, nogil=True, fastmath=_FM_LANE, inline="always")
def _sgd_body(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip, prefetching, plain):
    """Per-rating SGD on the ratings ``t0 .. t0+m-1`` in order, prefetching the rows of
    rating ``t + ahead`` while it is below ``pf_end``; returns the ratings left out.
    ``prefetching`` and ``plain`` (no L2 term) are constants where it is inlined, so
    each of the four spans below carries only its own loop (a per-rating test that is
    never true still cost ~10 % of a rating's time)."""
    T = P.dtype.type
    keep = T(1.0) - a * reg           # p - a(e q + reg p) = keep p - (a e) q
    base = np.uint64(t0)
    step = np.uint64(ahead)
    end = np.uint64(pf_end)
    bad = 0
    for b in range(m):
        t = base + np.uint64(b)
        if prefetching and t + step < end:
            _prefetch_rows(P, Q, u[t + step], i[t + step])
        uu = u[t]
        ii = i[t]
        e = _pred(P, Q, uu, ii) - T(r[t])
        if not abs(e) < lim:
            bad += 1
            if not skip:
                return bad
            continue
        ae = a * e
        if plain:                     # no decay term: one multiply-add a coordinate
            for k in range(P.shape[1]):
                pk = P[uu, k]
                qk = Q[ii, k]
                P[uu, k] = pk - ae * qk
                Q[ii, k] = qk - ae * pk
        else:
            for k in range(P.shape[1]):
                pk = P[uu, k]
                qk = Q[ii, k]
                P[uu, k] = keep * pk - ae * qk
                Q[ii, k] = keep * qk - ae * pk
    return bad


@njit(cache=True, nogil=True, fastmath=_FM_LANE)
def _sgd_span(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip):
    return _sgd_body(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip, False, False)


@njit(cache=True, nogil=True, fastmath=_FM_LANE)
def _sgd_span_plain(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip):
    return _sgd_body(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip, False, True)


@njit(cache=True, nogil=True, fastmath=_FM_LANE)
def _sgd_span_pf(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip):
    return _sgd_body(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip, True, False)


@njit(cache=True, nogil=True, fastmath=_FM_LANE)
def _sgd_span_pf_plain(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip):
    return _sgd_body(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip, True, True)


@njit(cache=True, nogil=True, fastmath=_FM_LANE)
def _adaptive_span(P, Q, SP, SQ, u, i, r, t0, m, ahead, pf_end, a, reg, decay, fresh, eps,
                   lim, skip):
    return _adaptive_body(P, Q, SP, SQ, u, i, r, t0, m, ahead, pf_end, a, reg, decay,
                          fresh, eps, lim, skip, False)


@njit(cache=True, nogil=True, fastmath=_FM_LANE)
def _adaptive_span_pf(P, Q, SP, SQ, u, i, r, t0, m, ahead, pf_end, a, reg, decay, fresh,
                      eps, lim, skip):
    return _adaptive_body(P, Q, SP, SQ, u, i, r, t0, m, ahead, pf_end, a, reg, decay,
                          fresh, eps, lim, skip, True)


@njit(cache=True, nogil=True, fastmath=_FM_LANE, inline="always")
def _adaptive_body(P, Q, SP, SQ, u, i, r, t0, m, ahead, pf_end, a, reg, decay, fresh, eps,
                   lim, skip, prefetching):
    """Per-rating AdaGrad / RMSProp (see :func:`mf_lane_adagrad`) on the ratings of a
    span, as :func:`_sgd_body`; the states' rows are prefetched with the factors'."""
    T = P.dtype.type
    K = P.shape[1]
    rowwise = SP.shape[1] != K
    base = np.uint64(t0)
    step = np.uint64(ahead)
    end = np.uint64(pf_end)
    bad = 0
    for b in range(m):
        t = base + np.uint64(b)
        if prefetching and t + step < end:
            _prefetch_rows(P, Q, u[t + step], i[t + step])
            _prefetch_rows(SP, SQ, u[t + step], i[t + step])
        uu = u[t]
        ii = i[t]
        if rowwise:                   # one accumulator and one step size per row
            # |g_p|^2 = |e q + reg p|^2 = e^2 |q|^2 + 2 e reg (p.q) + reg^2 |p|^2: the
            # norms come with the dot product, so no pass over the rows is added
            pred, pp, qq = _pred_norms(P, Q, uu, ii)
            e = pred - T(r[t])
            if not abs(e) < lim:
                bad += 1
                if not skip:
                    return bad
                continue
            cross = T(2.0) * e * reg * pred
            ssp = max(T(0.0), e * e * qq + cross + reg * reg * pp)
            ssq = max(T(0.0), e * e * pp + cross + reg * reg * qq)
            sp = SP[uu, 0] * decay + fresh * (ssp / T(K))
            sq = SQ[ii, 0] * decay + fresh * (ssq / T(K))
            SP[uu, 0] = sp
            SQ[ii, 0] = sq
            ap = a / (sqrt(sp) + eps)
            aq = a / (sqrt(sq) + eps)
            for k in range(K):
                pk = P[uu, k]
                qk = Q[ii, k]
                P[uu, k] = pk - ap * (e * qk + reg * pk)
                Q[ii, k] = qk - aq * (e * pk + reg * qk)
            continue
        e = _pred(P, Q, uu, ii) - T(r[t])
        if not abs(e) < lim:
            bad += 1
            if not skip:
                return bad
            continue
        for k in range(K):
            pk = P[uu, k]
            qk = Q[ii, k]
            gp = e * qk + reg * pk
            gq = e * pk + reg * qk
            sp = SP[uu, k] * decay + (fresh * gp) * gp
            sq = SQ[ii, k] * decay + (fresh * gq) * gq
            SP[uu, k] = sp
            SQ[ii, k] = sq
            P[uu, k] = pk - (a * gp) / (sqrt(sp) + eps)
            Q[ii, k] = qk - (a * gq) / (sqrt(sq) + eps)
    return bad


def mf_scratch(n_rows, n_cols):
    """``scratch(batch)`` of :func:`mf_sgd`: per-row stamps of P and Q, the save-slot
    flags and the step counter (batch 0: placeholders of the same types)."""
    def scratch(batch):
        if batch == 0:
            return (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((2, 1), np.int64),
                    np.zeros(1, np.int64))
        return (np.zeros(n_rows, np.int64), np.zeros(n_cols, np.int64),
                np.zeros((2, batch + 1), np.int64), np.zeros(1, np.int64))
    return scratch


@njit(cache=True, nogil=True, inline="always")
def _dot64(U, V, uu, ii):
    """``U[uu] . V[ii]`` accumulated in float64 (the loss's precision, not the step's)."""
    s = 0.0
    for k in range(U.shape[1]):
        s += float(U[uu, k]) * float(V[ii, k])
    return s


@njit(cache=True, nogil=True, fastmath=False)
def mf_sse(P, Q, u, i, r):
    """Sum over all ratings n of (r[n] - P[u[n]] . Q[i[n]])^2, accumulated in float64."""
    total = 0.0
    for n in range(r.shape[0]):
        e = float(r[n]) - _dot64(P, Q, u[n], i[n])
        total += e * e
    return total


@njit(cache=True, nogil=True, fastmath=False)
def mf_predict(U, V, u, i, out):
    """out[n] = U[u[n]] . V[i[n]] (accumulated in float64, stored in out's dtype)."""
    for n in range(out.shape[0]):
        out[n] = _dot64(U, V, u[n], i[n])


_step.register(MFArrays, sample_kernel=mf_sample, gradient_kernel=mf_gradient,
               sgd_kernel=mf_sgd, cache=True, checks_finite=True,
               lane_kernels={SGDCfg: mf_lane_sgd, AdaGradCfg: mf_lane_adagrad,
                             RMSPropCfg: mf_lane_rmsprop})
