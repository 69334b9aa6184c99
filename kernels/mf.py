"""Matrix-factorisation kernels: minibatch gradient and sum of squared errors.

Notation (Koren, Bell & Volinsky 2009; Hogwild!, Niu et al. 2011, section 5): a rating
r_ui is predicted by the dot product of a row factor p_u (row u of ``P``) and a column
factor q_i (row i of ``Q``); the error is e_ui = r_ui - p_u . q_i and the per-rating
loss is 1/2 (e_ui^2 + reg (|p_u|^2 + |q_i|^2)), whose gradient is

    dP[u] = -e_ui q_i + reg p_u        dQ[i] = -e_ui p_u + reg q_i

Pure functions on arrays and scalars; no checking (the caller checks); nothing here
imports hogkit. float32 or float64 factors; int32 or int64 index arrays. All arithmetic
is float64 (each element is converted once), results are stored in the output's dtype.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def mf_grad(P, Q, u, i, r, sample, reg, gP, gQ, rows_u, rows_i, read_P, read_Q):
    """Per-rating gradients of the ratings ``sample`` indexes, one output row each.

    For b in range(len(sample)), with n = sample[b], uu = u[n], ii = i[n]:
    copies p_uu into ``read_P[b]`` and q_ii into ``read_Q[b]`` (each element of the
    shared factors is read exactly once), writes uu, ii into ``rows_u[b]``,
    ``rows_i[b]`` and the gradient above, computed from the copies, into ``gP[b]``,
    ``gQ[b]``. Nothing is summed across b: duplicate rows are left for the apply rule.

    Racy by design when P and Q are shared and written by other workers: a row may
    be read half-updated. The copies in read_P/read_Q are exactly what the gradient
    was computed from, so DC-ASGD and Gap-Aware see a consistent w_read.
    """
    K = P.shape[1]
    for b in range(sample.shape[0]):
        n = sample[b]
        uu = u[n]
        ii = i[n]
        rows_u[b] = uu
        rows_i[b] = ii
        pred = 0.0
        for k in range(K):
            pk = P[uu, k]
            qk = Q[ii, k]
            read_P[b, k] = pk
            read_Q[b, k] = qk
            pred += float(pk) * float(qk)
        e = float(r[n]) - pred
        for k in range(K):
            pk = float(read_P[b, k])
            qk = float(read_Q[b, k])
            gP[b, k] = -e * qk + reg * pk
            gQ[b, k] = -e * pk + reg * qk


@njit(cache=True, nogil=True)
def mf_sse(P, Q, u, i, r):
    """Sum over all ratings n of (r[n] - P[u[n]] . Q[i[n]])^2, accumulated in float64."""
    K = P.shape[1]
    total = 0.0
    for n in range(r.shape[0]):
        uu = u[n]
        ii = i[n]
        pred = 0.0
        for k in range(K):
            pred += float(P[uu, k]) * float(Q[ii, k])
        e = float(r[n]) - pred
        total += e * e
    return total


@njit(cache=True, nogil=True)
def mf_predict(U, V, u, i, out):
    """out[n] = U[u[n]] . V[i[n]] (accumulated in float64, stored in out's dtype)."""
    K = U.shape[1]
    for n in range(out.shape[0]):
        uu = u[n]
        ii = i[n]
        s = 0.0
        for k in range(K):
            s += float(U[uu, k]) * float(V[ii, k])
        out[n] = s
