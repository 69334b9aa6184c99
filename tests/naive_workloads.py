"""Plain-numpy references for the workload kernels (kernels/mf.py, kernels/logreg.py).

Slow and obviously correct: vectorised numpy or one loop per sample, no shared code
with the kernels.
"""

from __future__ import annotations

import numpy as np


def mf_grad(P, Q, u, i, r, sample, reg):
    """(gP, gQ, rows_u, rows_i, read_P, read_Q) of mf_grad, one row per sampled rating."""
    uu = u[sample].astype(np.int64)
    ii = i[sample].astype(np.int64)
    Pu = P[uu].astype(np.float64)
    Qi = Q[ii].astype(np.float64)
    e = r[sample].astype(np.float64) - np.sum(Pu * Qi, axis=1)
    gP = -e[:, None] * Qi + reg * Pu
    gQ = -e[:, None] * Pu + reg * Qi
    return gP, gQ, uu, ii, P[uu], Q[ii]


def mf_sse(P, Q, u, i, r):
    e = r.astype(np.float64) - np.sum(P[u].astype(np.float64) * Q[i].astype(np.float64), axis=1)
    return float(np.sum(e * e))


def _sigmoid(m):
    return 0.5 * (1.0 + np.tanh(0.5 * m))  # stable for any m


def logreg_grad(w, indptr, indices, values, y, sample, reg, scale):
    """(g, rows, read) of logreg_grad: one entry per (sampled row, nonzero), in order."""
    g, rows, read = [], [], []
    for s in sample:
        cols = indices[indptr[s]:indptr[s + 1]].astype(np.int64)
        x = values[indptr[s]:indptr[s + 1]].astype(np.float64)
        ws = w[cols].astype(np.float64)
        d = _sigmoid(np.dot(ws, x)) - float(y[s])
        g.append(scale * (d * x + reg * ws))
        rows.append(cols)
        read.append(w[cols])
    return np.concatenate(g), np.concatenate(rows), np.concatenate(read)


def logreg_loss(w, indptr, indices, values, y):
    """(sum of log-losses, number right), log-loss = logaddexp(0, m) - y m."""
    total, right = 0.0, 0
    for s in range(len(indptr) - 1):
        sl = slice(indptr[s], indptr[s + 1])
        m = float(np.dot(w[indices[sl]].astype(np.float64), values[sl].astype(np.float64)))
        total += np.logaddexp(0.0, m) - float(y[s]) * m
        right += int((m > 0) == (y[s] > 0.5))
    return total, right


def csr_dense(indptr, indices, values, n_features):
    """The CSR matrix as a dense float64 array (duplicates add up)."""
    X = np.zeros((len(indptr) - 1, n_features))
    for s in range(len(indptr) - 1):
        np.add.at(X[s], indices[indptr[s]:indptr[s + 1]], values[indptr[s]:indptr[s + 1]])
    return X
