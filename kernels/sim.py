"""The simulator's fused fast path: a discrete-event loop in virtual time with the
sparse logistic-regression or matrix-factorisation gradient and the SGD /
staleness-aware sparse-row apply in one kernel.

``hogkit.simulator`` owns the semantics (its module docstring); this kernel replays
them exactly, so both engines give bit-identical results for the same seed:

- one pending event per worker: ``START`` (wait for the policy, then read) or
  ``FINISH`` (apply); the next event is the smallest ``(time, kind, seq)`` with
  ``FINISH = 0 < START = 1`` (updates that finish at time t are visible to reads at
  t) and ``seq`` a global counter (FIFO among equal times);
- a read computes the gradient at once into the worker's pending buffer (so it sees
  the parameters exactly as of the read event) and records the clock vector and the
  clock lag; the apply at the finish event uses the gap = updates by others since;
- SSP(bound) (``bound = inf`` for Async): a worker whose lag exceeds the bound blocks
  until a finish event; after every finish the blocked workers are re-checked in rank
  order; DONE workers are excluded from the minimum (as ``hogkit.policy``).

State lives in arrays so the loop can return to Python (to evaluate the loss, to
refill a worker's pre-drawn samples and step times, to raise on a non-finite
gradient) and resume. Gradients and applies reuse the kernels of ``logreg.py`` /
``mf.py`` and the arithmetic of ``sparse.py`` / ``delayed.py`` (``a = dtype(lr /
max(tau, 1))``, ``W[r] -= a * G[i]`` in the table's dtype). Deterministic: no races
(one thread), no fastmath. Nothing here imports hogkit.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .staleness import record_event

from .guard import all_finite
from .logreg import logreg_grad
from .mf import mf_grad

# event kinds
FINISH, START, NONE = 0, 1, -1
# worker states (as hogkit.clocks)
RUNNING, DONE = 1, 2
# int state columns, ist[w, col]
I_UPD, I_ITER, I_STATE, I_STARTED, I_QUOTA, I_OREAD, I_LAG, I_KIND, I_SEQ, I_BLOCKED, \
    I_NNZ, I_FILLED, I_SKIPPED, I_BAD = range(14)
NI = 14
# float state columns, fst[w, col]
F_T, F_READ, F_WAIT_SINCE, F_WAIT, F_LAST = range(5)
NF = 5
# global ints gi[...]
G_SEQ, G_TOTAL, G_WHO = range(3)
# cfg (float64) entries
C_LR, C_AWARE, C_BOUND, C_EVAL_T, C_EVAL_U, C_T_STOP, C_SKIP, C_REG, C_SCALE = range(9)
NC = 9
# return codes
R_DONE, R_EVAL_T, R_EVAL_U, R_REFILL, R_NONFINITE = range(5)


@njit(cache=True, nogil=True)
def step_time(base, speed, amp, period, t, pause):
    """``base · speed · load(t) + pause`` with ``load(t) = 1 + amp·(1 + sin(2πt/period))/2``
    (``amp = 0`` gives 1 exactly); used by both simulator engines."""
    f = 1.0
    if amp != 0.0:
        f = 1.0 + amp * 0.5 * (1.0 + math.sin(2.0 * math.pi * t / period))
    return base * speed * f + pause


@njit(cache=True, nogil=True)
def draw_samples(rng, n, batch, out):
    """``out[k] = rng.integers(0, n, size=batch)`` for each row k, in order: the same
    draws a workload's ``gradient`` makes, one call per step (bit-identical to NumPy)."""
    for k in range(out.shape[0]):
        s = rng.integers(0, n, size=batch)
        for j in range(batch):
            out[k, j] = s[j]


@njit(cache=True, nogil=True)
def draw_blocks(rng, n, batch, out):
    """``out[k] = (start + arange(batch)) % n`` with ``start = rng.integers(0, n)`` per
    row: a block of consecutive samples at a uniform offset (wrapping), the draw of
    matrix factorisation's ``gradient``."""
    for k in range(out.shape[0]):
        start = rng.integers(0, n)
        wrap = start + batch > n
        for j in range(batch):
            v = start + j
            out[k, j] = v % n if wrap else v


@njit(cache=True, nogil=True)
def clock_lag(ist, w):
    """``c_w − min_q c_q`` over workers not DONE (w always counts)."""
    c = ist[w, I_ITER]
    m = c
    for q in range(ist.shape[0]):
        if q != w and ist[q, I_STATE] != DONE and ist[q, I_ITER] < m:
            m = ist[q, I_ITER]
    return c - m


@njit(cache=True, nogil=True)
def _pop(ist, fst):
    best = -1
    for q in range(ist.shape[0]):
        k = ist[q, I_KIND]
        if k == NONE:
            continue
        if best < 0:
            best = q
            continue
        tq, tb = fst[q, F_T], fst[best, F_T]
        if tq < tb or (tq == tb and (k < ist[best, I_KIND] or (
                k == ist[best, I_KIND] and ist[q, I_SEQ] < ist[best, I_SEQ]))):
            best = q
    return best


@njit(cache=True, nogil=True)
def _schedule(ist, fst, gi, w, t, kind):
    fst[w, F_T] = t
    ist[w, I_KIND] = kind
    ist[w, I_SEQ] = gi[G_SEQ]
    gi[G_SEQ] += 1


@njit(cache=True, nogil=True)
def _record(log, w, step, gap, lag, t):
    """The live runtime's log write (``staleness.record_event``), virtual time in ns."""
    gh, lh, st, ring, cursor = log
    record_event(gh, lh, st, ring, cursor, w, step, gap, lag, np.int64(t * 1e9))


@njit(cache=True, nogil=True)
def _read(lg, mf, w, sample, cfg, ist):
    """Compute worker w's gradient now into its pending buffer; False if non-finite."""
    ok = True
    if lg is not None:
        wv, indptr, indices, values, y, g, rows, read = lg
        t = logreg_grad(wv, indptr, indices, values, y, sample, cfg[C_REG], cfg[C_SCALE],
                        g[w], rows[w], read[w])
        ist[w, I_NNZ] = t
        ok = all_finite(g[w, :t])
    if mf is not None:
        P, Q, u, i, r, gP, gQ, ru, ri, rP, rQ = mf
        mf_grad(P, Q, u, i, r, sample, cfg[C_REG], gP[w], gQ[w], ru[w], ri[w], rP[w], rQ[w])
        ist[w, I_NNZ] = sample.shape[0]
        ok = all_finite(gP[w].reshape(-1)) and all_finite(gQ[w].reshape(-1))
    return ok


@njit(cache=True, nogil=True)
def _apply(lg, mf, w, ist, lr, aware, tau):
    """SGD (``aware == 0``) or staleness-aware SGD of worker w's pending gradient."""
    n = ist[w, I_NNZ]
    if lg is not None:
        wv, indptr, indices, values, y, g, rows, read = lg
        a = wv.dtype.type(lr / max(tau, 1)) if aware else wv.dtype.type(lr)
        gw, rw = g[w], rows[w]
        for i in range(n):
            wv[rw[i]] -= a * gw[i]
    if mf is not None:
        P, Q, u, i_, r, gP, gQ, ru, ri, rP, rQ = mf
        a = P.dtype.type(lr / max(tau, 1)) if aware else P.dtype.type(lr)
        d = P.shape[1]
        g, rows = gP[w], ru[w]
        for i in range(n):
            rr = rows[i]
            for j in range(d):
                P[rr, j] -= a * g[i, j]
        g, rows = gQ[w], ri[w]
        for i in range(n):
            rr = rows[i]
            for j in range(d):
                Q[rr, j] -= a * g[i, j]


@njit(cache=True, nogil=True)
def run_events(lg, mf, samples, times, log, ist, fst, gi, cfg):
    """Run the event loop until it is done or must return to Python; returns a code.

    ``lg`` / ``mf``: the workload's arrays plus the per-worker pending buffers (one of
    them None). ``samples`` (W, C, batch) int64 and ``times`` = (base (W, C), pause
    (W, C), speed (W,), amp (W,), period (W,)): worker w's step k uses slot k % C,
    valid while ``ist[w, I_STARTED] < ist[w, I_FILLED]``. ``log`` = the StalenessLog
    arrays (gap_hist, lag_hist, stats, ring, cursor). Codes: R_DONE (no events left),
    R_EVAL_T (the next event is at or past ``cfg[C_EVAL_T]``; not consumed),
    R_EVAL_U (a finish brought the update count to ``cfg[C_EVAL_U]``), R_REFILL
    (worker ``gi[G_WHO]`` needs its next C draws; not consumed), R_NONFINITE (worker
    ``gi[G_WHO]``'s gradient is non-finite and ``cfg[C_SKIP] == 0``; not consumed).
    """
    base, pause, speed, amp, period = times
    W = ist.shape[0]
    C = samples.shape[1]
    lr = cfg[C_LR]
    aware = cfg[C_AWARE] != 0.0
    bound = cfg[C_BOUND]
    while True:
        w = _pop(ist, fst)
        if w < 0:
            return R_DONE
        t = fst[w, F_T]
        if t >= cfg[C_EVAL_T]:
            return R_EVAL_T
        if ist[w, I_KIND] == START:
            if t >= cfg[C_T_STOP]:
                ist[w, I_KIND] = NONE
                ist[w, I_STATE] = DONE
                # a DONE worker leaves the minimum: others may be released
                for q in range(W):
                    if ist[q, I_BLOCKED] != 0 and clock_lag(ist, q) <= bound:
                        ist[q, I_BLOCKED] = 0
                        fst[q, F_WAIT] += t - fst[q, F_WAIT_SINCE]
                        _schedule(ist, fst, gi, q, t, START)
                continue
            lag = clock_lag(ist, w)
            if lag > bound:
                ist[w, I_KIND] = NONE
                ist[w, I_BLOCKED] = 1
                fst[w, F_WAIT_SINCE] = t
                continue
            k = ist[w, I_STARTED]
            if k >= ist[w, I_FILLED]:
                gi[G_WHO] = w
                return R_REFILL
            slot = k % C
            ist[w, I_OREAD] = gi[G_TOTAL] - ist[w, I_UPD]
            ist[w, I_LAG] = lag
            fst[w, F_READ] = t
            ist[w, I_BAD] = 0 if _read(lg, mf, w, samples[w, slot], cfg, ist) else 1
            ist[w, I_STARTED] = k + 1
            dt = step_time(base[w, slot], speed[w], amp[w], period[w], t, pause[w, slot])
            _schedule(ist, fst, gi, w, t + dt, FINISH)
            continue
        # FINISH
        k = ist[w, I_ITER]
        if ist[w, I_BAD] != 0:
            if cfg[C_SKIP] == 0.0:
                gi[G_WHO] = w
                return R_NONFINITE
            ist[w, I_SKIPPED] += 1
            ist[w, I_BAD] = 0
        else:
            tau = gi[G_TOTAL] - ist[w, I_UPD] - ist[w, I_OREAD]
            _apply(lg, mf, w, ist, lr, aware, tau)
            ist[w, I_UPD] += 1
            gi[G_TOTAL] += 1
            _record(log, w, k, tau, ist[w, I_LAG], t)
        ist[w, I_ITER] = k + 1
        fst[w, F_LAST] = t
        if k + 1 >= ist[w, I_QUOTA]:
            ist[w, I_KIND] = NONE
            ist[w, I_STATE] = DONE
        else:
            _schedule(ist, fst, gi, w, t, START)
        for q in range(W):
            if ist[q, I_BLOCKED] != 0 and clock_lag(ist, q) <= bound:
                ist[q, I_BLOCKED] = 0
                fst[q, F_WAIT] += t - fst[q, F_WAIT_SINCE]
                _schedule(ist, fst, gi, q, t, START)
        if gi[G_TOTAL] >= cfg[C_EVAL_U]:
            return R_EVAL_U
