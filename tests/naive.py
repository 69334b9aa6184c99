"""Plain-numpy references for every kernel and rule (stumpy's tests/naive.py).

Slow and obviously correct: whole-array numpy where the operation is element-wise,
``np.subtract.at`` for duplicate rows, and plain Python loops in batch order where a
stateful rule processes duplicates one after the other. Every reference computes in
float64 on (copies of) its inputs and returns new arrays; nothing is modified.
"""

from __future__ import annotations

import numpy as np


def f64(*arrays):
    return [np.array(a, dtype=np.float64, copy=True) for a in arrays]


# --- sparse rows and dense -----------------------------------------------------------

def sgd_rows(W, rows, G, lr):
    W, G = f64(W, G)
    np.subtract.at(W, rows, lr * G)
    return W


def momentum_rows(W, M, rows, G, lr, mu):
    W, M, G = f64(W, M, G)
    for i, r in enumerate(rows):
        M[r] = mu * M[r] + G[i]
        W[r] = W[r] - lr * M[r]
    return W, M


def sgd_flat(w, g, lr):
    w, g = f64(w, g)
    return w - lr * g


def momentum_flat(w, m, g, lr, mu):
    w, m, g = f64(w, m, g)
    m = mu * m + g
    return w - lr * m, m


# --- delayed -------------------------------------------------------------------------

def staleness_aware_flat(w, g, lr, tau):
    return sgd_flat(w, g, lr / max(tau, 1))


def staleness_aware_rows(W, rows, G, lr, tau):
    return sgd_rows(W, rows, G, lr / max(tau, 1))


def staleness_aware_momentum_flat(w, m, g, lr, mu, tau):
    return momentum_flat(w, m, np.asarray(g, np.float64) / max(tau, 1), lr, mu)


def staleness_aware_momentum_rows(W, M, rows, G, lr, mu, tau):
    return momentum_rows(W, M, rows, np.asarray(G, np.float64) / max(tau, 1), lr, mu)


def dc_flat(w, g, w_bak, lr, lam):
    w, g, b = f64(w, g, w_bak)
    return w - lr * (g + lam * g * g * (w - b))


def dc_rows(W, rows, G, B, lr, lam):
    """Gaps are taken when the update arrives (before its own rows move)."""
    W, G, B = f64(W, G, B)
    D = W[rows] - B
    for i, r in enumerate(rows):
        W[r] = W[r] - lr * (G[i] + lam * G[i] * G[i] * D[i])
    return W


def dc_adaptive_flat(w, ms, g, w_bak, lr, lam0, m, eps):
    w, ms, g, b = f64(w, ms, g, w_bak)
    ms = m * ms + (1 - m) * g * g
    lam_t = lam0 / np.sqrt(ms + eps)
    return w - lr * (g + lam_t * g * g * (w - b)), ms


def dc_adaptive_rows(W, MS, rows, G, B, lr, lam0, m, eps):
    W, MS, G, B = f64(W, MS, G, B)
    D = W[rows] - B
    for i, r in enumerate(rows):
        MS[r] = m * MS[r] + (1 - m) * G[i] * G[i]
        lam_t = lam0 / np.sqrt(MS[r] + eps)
        W[r] = W[r] - lr * (G[i] + lam_t * G[i] * G[i] * D[i])
    return W, MS


def _gap(w, w_read, v, gamma, k, lr_max):
    v_hat = v / (1 - gamma ** k)
    C = lr_max * (np.sqrt(v_hat) + 1e-8)
    return 1 + np.abs(w - w_read) / C


def gap_aware_flat(w, mom, v, g, w_read, lr, mu, gamma, lr_max, k):
    w, v, g, wr = f64(w, v, g, w_read)
    mom = f64(mom)[0] if mu else np.zeros_like(w)
    u = mu * mom + g
    v = gamma * v + (1 - gamma) * u * u
    G = _gap(w, wr, v, gamma, k, lr_max)
    mom = mu * mom + g / G
    return w - lr * mom, mom, v


def gap_aware_rows(W, M, V, rows, G, R, lr, mu, gamma, lr_max, k):
    W, V, G, R = f64(W, V, G, R)
    M = f64(M)[0] if mu else np.zeros_like(W)
    W_start = W.copy()
    for i, r in enumerate(rows):
        u = mu * M[r] + G[i]
        V[r] = gamma * V[r] + (1 - gamma) * u * u
        gap = _gap(W_start[r], R[i], V[r], gamma, k, lr_max)
        M[r] = mu * M[r] + G[i] / gap
        W[r] = W[r] - lr * M[r]
    return W, M, V


# --- density -------------------------------------------------------------------------

def topk_mask(x, k):
    """The k largest |x| (stable: among equal magnitudes, lowest positions first)."""
    x = np.asarray(x)
    mask = np.zeros(x.size, bool)
    k = min(k, x.size)
    if k > 0:
        order = np.argsort(-np.abs(x.astype(np.float64)), kind="stable")
        mask[order[:k]] = True
    return mask


def threshold_mask(x, t):
    return np.abs(np.asarray(x, np.float64)) > t


def mask_seed(seed, step, pos):
    """The random density filter's seed, in Python's big integers."""
    return (seed * 0x9E3779B1 + step * 0x85EBCA77 + pos * 0xC2B2AE3D
            + 0x27D4EB2F) % (2147483647 - 1) + 1


def random_mask(n, k, seed):
    """Algorithm S with Park-Miller minstd, in plain Python integers."""
    mod = 2147483647
    s = seed % mod
    if s <= 0:
        s += mod - 1
    for _ in range(4):
        s = s * 48271 % mod
    need = min(k, n)
    mask = np.zeros(n, bool)
    for i in range(n):
        if need == 0:
            break
        s = s * 48271 % mod
        if (n - i) * (s / mod) < need:
            mask[i] = True
            need -= 1
    return mask


def filter_dense(g, r, mask, residual):
    """(sent, new residual) for a dense gradient with the given send mask."""
    x = np.asarray(g, np.float64) + (np.asarray(r, np.float64) if residual else 0)
    m = mask.reshape(x.shape)
    sent = np.where(m, x, 0.0)
    return sent, (np.where(m, 0.0, x) if residual else None)


def filter_rows(G, rows, R, mask, residual):
    """(sent, new residual) for sparse rows: the residual of a row is folded into its
    first occurrence, unsent entries are added back to the row's residual."""
    X = np.array(G, np.float64)
    R = np.array(R, np.float64)
    if residual:
        for i, r in enumerate(rows):
            X[i] += R[r]
            R[r] = 0
    m = mask.reshape(X.shape)
    sent = np.where(m, X, 0.0)
    if residual:
        np.add.at(R, rows, np.where(m, 0.0, X))
    return sent, (R if residual else None)


def all_finite(values):
    return bool(np.isfinite(values).all())


def changed_rows(cur, base):
    """Reference ``take_changed_rows`` (and the cluster agent's delta, numpy's way):
    ``(rows, deltas, new base)`` for the rows where ``cur − base`` is non-zero."""
    d = cur - base
    rows = np.flatnonzero(d.reshape(d.shape[0], -1).any(axis=1))
    new = base.copy()
    new[rows] += d[rows]
    return rows, d[rows], new


def adam_flat(w, m, v, g, lr, b1, b2, eps, t):
    """torch.optim.Adam's step ``t`` (1-based) on a flat buffer."""
    w, m, v, g = f64(w, m, v, g)
    m = m + (1 - b1) * (g - m)
    v = b2 * v + (1 - b2) * g * g
    w = w - (lr / (1 - b1 ** t)) * (m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps))
    return w, m, v


def adam_rows(W, M, V, rows, G, lr, b1, b2, eps, t):
    """Lazy Adam (torch.optim.SparseAdam's) on rows, one occurrence after the other, the
    bias correction of step ``t`` for every row."""
    W, M, V, G = f64(W, M, V, G)
    for i, r in enumerate(rows):
        W[r], M[r], V[r] = adam_flat(W[r], M[r], V[r], G[i], lr, b1, b2, eps, t)
    return W, M, V


# --- rules: the same equations on float64 copies, one Grad at a time ----------------

def apply_rule(rule, params, grads, state, *, staleness=0):
    """Reference ``rule.apply``: returns new (params, state) as float64 copies."""
    params = {k: np.array(v, np.float64) for k, v in params.items()}
    state = {k: np.array(v, np.float64 if v.dtype.kind == "f" else v.dtype)
             for k, v in state.items()}
    kind = type(rule).__name__
    tau = staleness
    for grad in grads:
        p = params[grad.name]
        dense = grad.rows is None
        n = p.shape[0]
        d = int(np.prod(p.shape[1:]))
        P = p.reshape(-1) if dense else p.reshape(n, d)
        shape = P.shape if dense else (len(grad.rows), d)
        G = np.asarray(grad.values, np.float64).reshape(shape)
        R = None if grad.read is None else np.asarray(grad.read, np.float64).reshape(shape)
        rows = grad.rows

        def slot(s):
            return state[f"{s}/{grad.name}"].reshape(P.shape)

        if kind in ("SGD", "StalenessAware"):
            if kind == "StalenessAware":
                G = G / max(tau, 1)
            if rule.momentum:
                M = slot("m")
                if dense:
                    w, m = momentum_flat(P, M, G, rule.lr, rule.momentum)
                else:
                    w, m = momentum_rows(P, M, rows, G, rule.lr, rule.momentum)
                M[...] = m
            else:
                w = sgd_flat(P, G, rule.lr) if dense else sgd_rows(P, rows, G, rule.lr)
        elif kind == "DelayCompensated":
            if rule.adaptive:
                MS = slot("ms")
                f = dc_adaptive_flat if dense else dc_adaptive_rows
                args = (P, MS, G, R) if dense else (P, MS, rows, G, R)
                w, ms = f(*args, rule.lr, rule.lam0, rule.m, rule.eps)
                MS[...] = ms
            else:
                w = (dc_flat(P, G, R, rule.lr, rule.lam) if dense
                     else dc_rows(P, rows, G, R, rule.lr, rule.lam))
        elif kind == "GapAware":
            k = state[f"k/{grad.name}"]
            k[0] += 1
            V = slot("v")
            M = slot("m") if rule.momentum else None
            f = gap_aware_flat if dense else gap_aware_rows
            args = (P, M, V, G, R) if dense else (P, M, V, rows, G, R)
            w, m, v = f(*args, rule.lr, rule.momentum, rule.gamma, rule.lr_max, int(k[0]))
            V[...] = v
            if rule.momentum:
                M[...] = m
        elif kind == "Adam":
            k = state[f"k/{grad.name}"]
            k[0] += 1
            M, V = slot("m"), slot("v")
            b1, b2 = rule.betas
            f = adam_flat if dense else adam_rows
            args = (P, M, V, G) if dense else (P, M, V, rows, G)
            w, m, v = f(*args, rule.lr, b1, b2, rule.eps, int(k[0]))
            M[...], V[...] = m, v
        else:  # pragma: no cover - a new rule needs a reference here
            raise NotImplementedError(kind)
        P[...] = w
    return params, state


# --- admission (hogkit.kernels.clock: admit, lead, blocked, holding_back) -------------
# Plain Python from the definitions, on a (W, 8) slot matrix; a policy row is
# [kind, a, b] and a worker's admission state [extra, released, wait].

_UPD, _ITER, _BEAT, _STATE, _INTERVAL = 0, 1, 2, 3, 4
_DONE = 2
_K_SSP, _K_DSSP, _K_DELAY = 0, 1, 2


def running(slots, me):
    """The workers that count: not DONE, and ``me`` always."""
    return [q for q in range(len(slots)) if q == me or slots[q][_STATE] != _DONE]


def clock_lag(slots, me):
    return int(slots[me][_ITER]) - min(int(slots[q][_ITER]) for q in running(slots, me))


def within(slots, me, pol, bound):
    """Whether ``me``'s lead under ``pol`` is at most ``bound``: the clock lag for the
    SSP family; bounded delay in its integer form ``n·u_me - Σ u_q <= n·bound``."""
    if pol[0] == _K_DELAY:
        ranks = running(slots, me)
        n, total = len(ranks), sum(int(slots[q][_UPD]) for q in ranks)
        return n * int(slots[me][_UPD]) - total <= n * bound
    return clock_lag(slots, me) <= bound


def dssp_extra(last_f, interval_f, last_s, interval_s, r_max):
    """DSSP's controller: the r in [0, r_max] whose ``last_f + r·interval_f`` is closest
    to one of ``last_s + k·interval_s`` (k >= 1; ties: the smaller r)."""
    if r_max <= 0 or not (interval_f > 0 and interval_s > 0):
        return 0
    if not (np.isfinite(interval_f) and np.isfinite(interval_s)):
        return 0
    dist = []
    for r in range(r_max + 1):
        t_f = last_f + r * interval_f
        k = max(np.rint((t_f - last_s) / interval_s), 1.0)
        dist.append(abs(t_f - (last_s + k * interval_s)))
    return int(np.argmin(dist))


def dssp_decide(slots, me, s_lo, s_hi):
    """DSSP's grant for ``me``: 0 unless it is the fastest running worker and every
    tied slowest one has a timing; the slowest predicted to finish last counts."""
    ranks = running(slots, me)
    clocks = {q: int(slots[q][_ITER]) for q in ranks}
    if max(clocks.values()) > clocks[me]:
        return 0
    lo = min(clocks.values())
    slow = [q for q in ranks if q != me and clocks[q] == lo]
    if any(slots[q][_INTERVAL] <= 0 or slots[q][_BEAT] <= 0 for q in slow) or not slow:
        return 0
    q = max(slow, key=lambda q: (float(slots[q][_BEAT]) + float(slots[q][_INTERVAL]), -q))
    return dssp_extra(float(slots[me][_BEAT]), float(slots[me][_INTERVAL]),
                      float(slots[q][_BEAT]), float(slots[q][_INTERVAL]), s_hi - s_lo)


def admit(slots, me, pol, adm, grants):
    """The admission state machine, from its definition: returns ``(ok, adm, grants)``
    (new lists). Released: go once, no grant. A negative bound: go. DSSP: within s_lo goes
    and ends the episode; past it a grant r* is decided once per episode (counted in
    ``grants[min(r*, len - 1)]``) and the bound is s_lo + r*. A refusal leaves the
    bound waited for in ``adm[2]``."""
    adm, grants = list(adm), list(grants)
    if adm[1]:
        return True, [-1, 0, adm[2]], grants
    kind, a, b = (int(x) for x in pol[:3])
    bound = a
    if kind == _K_DSSP:
        if clock_lag(slots, me) <= a:
            adm[0] = -1
            return True, adm, grants
        if adm[0] < 0:
            adm[0] = dssp_decide(slots, me, a, b)
            grants[min(adm[0], len(grants) - 1)] += 1
        bound = a + adm[0]
    elif a < 0:                                   # unbounded (Async, LocalSGD)
        return True, adm, grants
    if within(slots, me, pol, bound):
        return True, adm, grants
    adm[2] = bound
    return False, adm, grants


def holding_back(slots, me, pol, wait):
    """Ranks not DONE whose counter (updates for bounded delay, else the clock) is more
    than ``wait`` below ``me``'s."""
    col = _UPD if pol[0] == _K_DELAY else _ITER
    return [q for q in range(len(slots)) if q != me and slots[q][_STATE] != _DONE
            and slots[q][col] < slots[me][col] - wait]
