"""Sparse logistic-regression kernels over CSR rows (indptr, indices, values).

Notation: sample s has features x_s (row s of the CSR matrix) and label y_s in {0, 1};
the margin is m_s = w . x_s, the prediction p_s = sigma(m_s), and the log-loss is
l_s = softplus(m_s) - y_s m_s with softplus(m) = max(m, 0) + log1p(exp(-|m|)) (stable
for any m). Its gradient restricted to the sample's nonzeros j is (p_s - y_s) x_sj.

Pure functions on arrays and scalars; no checking (the caller checks); nothing here
imports hogkit. float32 or float64 weights and values; int32 or int64 indices. All
arithmetic is float64 (each element is converted once), results are stored in the
output's dtype.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from . import step as _step
from ._intrinsics import cas, sched_yield
from .mf import _FM, _FM_LANE, sweep_sample
from .sgd import SGDCfg


@njit(cache=True, nogil=True, fastmath=_FM)
def _sigmoid(m):
    if m >= 0.0:
        return 1.0 / (1.0 + math.exp(-m))
    z = math.exp(m)
    return z / (1.0 + z)


class LogRegArrays(NamedTuple):
    """Sparse logistic regression's compiled part: the CSR samples and labels, in the
    stored order, the L2 coefficient ``reg``, and the per-sample lane's ``locks`` (int64
    words in shared memory: none for Hogwild!, one for a lock on the whole model, one
    per feature for a lock per weight; :func:`logreg_lane`)."""
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    y: np.ndarray
    reg: float
    locks: np.ndarray = np.zeros(0, np.int64)


#: spins on a held lock before giving the core away (more workers than cores)
SPINS = 64


@njit(cache=True, nogil=True, inline="always")
def _acquire(locks, j):
    """Take lock word ``j`` (0 free, 1 held): compare-and-swap until it is ours."""
    n = 0
    while cas(locks, j, 0, 1) != 0:
        n += 1
        if n >= SPINS:
            sched_yield()
            n = 0


@njit(cache=True, nogil=True, inline="always")
def _lock_sample(locks, indices, start, end, take):
    """Take (``take``) or give back the locks a sample needs: the model's one word, or
    its features' words in increasing feature order (every sample takes them in that
    order, so two samples cannot wait on each other). A release is a compare-and-swap
    too: a full fence, so the weights written before it are seen by the next holder."""
    if locks.shape[0] == 1:
        if take:
            _acquire(locks, 0)
        else:
            cas(locks, 0, 1, 0)
        return
    for j in range(start, end):
        f = indices[j]
        if take:
            _acquire(locks, f)
        else:
            cas(locks, f, 1, 0)


@njit(cache=True, nogil=True, inline="always")
def logreg_sample(wl, rng, cursor, nb, idx):
    """The step core's sampler: a sweep of the samples from the worker's cursor
    (``mf.sweep_sample``; ``rng`` unused)."""
    sweep_sample(wl.y.shape[0], cursor, nb, idx)


@njit(cache=True, nogil=True, fastmath=_FM, inline="always")
def _margin(w, indices, values, start, end):
    """``w · x_s`` over sample s's nonzeros ``start:end``, in float64: one definition
    for the gradient and the fused SGD kernel, so both sum in the same order."""
    m = 0.0
    for j in range(np.uint64(start), np.uint64(end)):    # unsigned: no index fix-ups
        m += float(w[np.uint64(indices[j]), 0]) * float(values[j])
    return m


@njit(cache=True, nogil=True, fastmath=_FM)
def logreg_gradient(wl, params, idx, nb, keep_read, G, R, RD, cnt):
    """Sparse minibatch gradient of the samples ``idx[:nb]`` (the step core protocol).

    ``params[0]`` is ``w`` viewed as ``(n_features, 1)``. For each sample s and each
    nonzero j of row s, in order, one entry t: ``R[0][t]`` = the feature, ``RD[0][t]`` =
    w[feature] as read (always kept: it is read once per entry anyway) and

        G[0][t] = ((p_s - y_s) x_sj + reg * w_read) / nb

    with p_s = sigma(w . x_s) from the read values: the mean over the batch of the
    per-sample log-loss gradient. A feature shared by several samples appears once per
    sample (left for the rule to add up), so the L2 term acts on touched features in
    proportion to how often they are touched (Hogwild!'s sparse regulariser, Niu et
    al. 2011, eq. 2.4). ``cnt[0]`` = the entries written (the batch's nonzeros).

    Racy by design when w is shared: entries may be read mid-update by others.
    """
    w = params[0]
    indptr, indices, values, y, reg = wl.indptr, wl.indices, wl.values, wl.y, wl.reg
    g, rows, read = G[0], R[0], RD[0]
    scale = 1.0 / nb
    # entry t of the buffers is nonzero j of its sample: indexed unsigned (no
    # negative-index fix-up per access: 2.0 -> 1.0 µs a batch of 16 at ~26 nonzeros)
    t = np.uint64(0)
    for b in range(nb):
        s = idx[b]
        start = np.uint64(indptr[s])
        end = np.uint64(indptr[s + 1])
        for j in range(start, end):
            f = indices[j]
            tt = t + (j - start)
            read[tt, 0] = w[np.uint64(f), 0]
            rows[tt] = f
        # with keep_read the margin is taken from the copies, so w_read is exactly
        # what the gradient saw; else straight from w (as the fused kernel does)
        if keep_read:
            m = 0.0
            for j in range(start, end):
                m += float(read[t + (j - start), 0]) * float(values[j])
        else:
            m = _margin(w, indices, values, indptr[s], indptr[s + 1])   # as the fused
        d = _sigmoid(m) - float(y[s])                                 # kernel sums
        for j in range(start, end):
            tt = t + (j - start)
            g[tt, 0] = scale * (d * float(values[j]) + reg * float(read[tt, 0]))
        t += end - start
    cnt[0] = t


@njit(cache=True, nogil=True, fastmath=_FM)
def logreg_sgd(wl, params, idx, nb, lr, G, R, RD, cnt, scratch):
    """Plain SGD on the samples ``idx[:nb]`` fused with their gradient: the step core's
    fast path, with exactly the result of :func:`logreg_gradient` followed by the SGD
    apply, without storing the gradient.

    Pass 1 computes every sample's ``d = p - y`` from the weights as they are at the
    start of the step; pass 2 writes ``w[f] -= lr·g`` for every (sample, nonzero) in order, with g formed
    as the gradient kernel forms it. With ``reg == 0`` the gradient does not read the
    weights, so repeated features need no saved start values; with ``reg > 0``, or a
    non-finite margin, it returns False having written nothing, and the core runs the
    general path. ``G[0]`` column 0 keeps the ``d`` of each sample.
    """
    w = params[0]
    indptr, indices, values, y, reg = wl.indptr, wl.indices, wl.values, wl.y, wl.reg
    if reg != 0.0:
        return False
    D = G[0]
    T = w.dtype.type
    a = T(lr)
    scale = 1.0 / nb
    chk = 0.0
    t = 0
    for b in range(nb):
        s = idx[b]
        start = indptr[s]
        end = indptr[s + 1]
        m = _margin(w, indices, values, start, end)
        D[b, 0] = _sigmoid(m) - float(y[s])
        chk += m - m
        t += end - start
    if not chk == 0.0:
        return False
    for b in range(nb):
        s = idx[b]
        d = float(D[b, 0])
        for j in range(indptr[s], indptr[s + 1]):
            f = np.uint64(indices[j])            # unsigned: no index fix-up per write
            g = T(scale * (d * float(values[j]) + reg * 0.0))
            w[f, 0] = w[f, 0] - a * g
    cnt[0] = t
    return True


@njit(cache=True, nogil=True, fastmath=_FM_LANE)
def logreg_lane(wl, params, idx, nb, c, S1, skip):
    """The per-sample lane of logistic regression (the step core protocol's ``lane``):
    for b < nb in order, sample s = idx[b] updates its features at once, from the
    weights as they are now (Hogwild!, Niu et al. 2011, section 5):

        d = sigma(w · x_s) - y_s;   w[f] -= lr·(d·x_sf + reg·w[f])   for f in x_s

    Plain SGD only (registered for ``SGDCfg``); ``c.lr`` is the lr of one sample (the core divides a batch-mean
    workload's lr by the batch). A sample whose margin is not finite is left out,
    nothing of it written (with ``skip`` False the call stops there). Returns the
    samples left out.

    With ``wl.locks`` (the locking baselines Hogwild! is measured against) each sample
    reads and writes its weights holding the whole model's lock, or its features'
    locks; the arithmetic is the same, so one worker gets the same bits either way."""
    if wl.locks.shape[0] > 0:
        return _locked_lane(wl, params[0], idx, nb, c.lr, skip)
    w = params[0]
    indptr, indices, values, y, reg = wl.indptr, wl.indices, wl.values, wl.y, wl.reg
    T = w.dtype.type
    a = c.lr
    bad = 0
    for b in range(nb):
        s = idx[b]
        start = indptr[s]
        end = indptr[s + 1]
        m = _margin(w, indices, values, start, end)
        if not m - m == 0.0:
            bad += 1
            if not skip:
                return bad
            continue
        d = _sigmoid(m) - float(y[s])
        for j in range(start, end):
            f = indices[j]
            w[f, 0] = T(float(w[f, 0]) - a * (d * float(values[j]) + reg * float(w[f, 0])))
    return bad


@njit(cache=True, nogil=True, fastmath=_FM_LANE)
def _locked_lane(wl, w, idx, nb, a, skip):
    """:func:`logreg_lane` holding locks around each sample's read and write."""
    indptr, indices, values, y, reg, locks = (wl.indptr, wl.indices, wl.values, wl.y,
                                              wl.reg, wl.locks)
    T = w.dtype.type
    bad = 0
    for b in range(nb):
        s = idx[b]
        start = indptr[s]
        end = indptr[s + 1]
        _lock_sample(locks, indices, start, end, True)
        m = _margin(w, indices, values, start, end)
        if not m - m == 0.0:
            _lock_sample(locks, indices, start, end, False)
            bad += 1
            if not skip:
                return bad
            continue
        d = _sigmoid(m) - float(y[s])
        for j in range(start, end):
            f = indices[j]
            w[f, 0] = T(float(w[f, 0]) - a * (d * float(values[j]) + reg * float(w[f, 0])))
        _lock_sample(locks, indices, start, end, False)
    return bad


@njit(cache=True, nogil=True, fastmath=False)
def logreg_loss(w, indptr, indices, values, y):
    """(sum over samples of the log-loss, number of samples classified right).

    A sample counts as right when (m_s > 0) == (y_s > 0.5). Accumulated in float64.
    """
    total = 0.0
    right = 0
    for s in range(indptr.shape[0] - 1):
        m = 0.0      # in order (no fastmath), indexed unsigned: no negative-index fix-ups
        for j in range(np.uint64(indptr[s]), np.uint64(indptr[s + 1])):
            m += float(w[np.uint64(indices[j])]) * float(values[j])
        ys = float(y[s])
        total += max(m, 0.0) + math.log1p(math.exp(-abs(m))) - ys * m
        if (m > 0.0) == (ys > 0.5):
            right += 1
    return total, right


@njit(cache=True, nogil=True, fastmath=False)
def csr_matvec(indptr, indices, values, w, out):
    """out[s] = sum_j values[j] * w[indices[j]] over row s (float64 accumulation)."""
    for s in range(indptr.shape[0] - 1):
        m = 0.0
        for j in range(np.uint64(indptr[s]), np.uint64(indptr[s + 1])):
            m += float(w[np.uint64(indices[j])]) * float(values[j])
        out[s] = m


_step.register(LogRegArrays, sample_kernel=logreg_sample, gradient_kernel=logreg_gradient,
               sgd_kernel=logreg_sgd, lane_kernels={SGDCfg: logreg_lane}, cache=True)
