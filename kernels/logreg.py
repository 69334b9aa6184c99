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

from numba import njit


@njit(cache=True, nogil=True)
def _sigmoid(m):
    if m >= 0.0:
        return 1.0 / (1.0 + math.exp(-m))
    z = math.exp(m)
    return z / (1.0 + z)


@njit(cache=True, nogil=True)
def logreg_grad(w, indptr, indices, values, y, sample, reg, scale, g, rows, read):
    """Sparse minibatch gradient; returns t, the number of entries written.

    For each b, sample s = sample[b] and each nonzero j of row s, in order, one entry
    t: ``rows[t]`` = the feature id, ``read[t]`` = w[feature] as read (each element of
    the shared ``w`` is read exactly once per entry) and

        g[t] = scale * ((p_s - y_s) x_sj + reg * read[t])

    with p_s computed from the ``read`` copies. A feature shared by several samples
    appears once per sample (duplicates are left for the apply rule to add up), so
    the L2 term acts only on touched features, in proportion to how often they are
    touched (the sparse regulariser of Hogwild!, Niu et al. 2011, eq. 2.4).
    ``g``, ``rows`` and ``read`` need room for the batch's total nonzeros.

    Racy by design when w is shared: entries may be read mid-update by other workers.
    """
    t = 0
    for b in range(sample.shape[0]):
        s = sample[b]
        start = indptr[s]
        end = indptr[s + 1]
        m = 0.0
        for j in range(start, end):
            f = indices[j]
            wf = w[f]
            read[t + j - start] = wf
            rows[t + j - start] = f
            m += float(wf) * float(values[j])
        d = _sigmoid(m) - float(y[s])
        for j in range(start, end):
            tt = t + j - start
            g[tt] = scale * (d * float(values[j]) + reg * float(read[tt]))
        t += end - start
    return t


@njit(cache=True, nogil=True)
def logreg_loss(w, indptr, indices, values, y):
    """(sum over samples of the log-loss, number of samples classified right).

    A sample counts as right when (m_s > 0) == (y_s > 0.5). Accumulated in float64.
    """
    total = 0.0
    right = 0
    for s in range(indptr.shape[0] - 1):
        m = 0.0
        for j in range(indptr[s], indptr[s + 1]):
            m += float(w[indices[j]]) * float(values[j])
        ys = float(y[s])
        total += max(m, 0.0) + math.log1p(math.exp(-abs(m))) - ys * m
        if (m > 0.0) == (ys > 0.5):
            right += 1
    return total, right


@njit(cache=True, nogil=True)
def csr_matvec(indptr, indices, values, w, out):
    """out[s] = sum_j values[j] * w[indices[j]] over row s (float64 accumulation)."""
    for s in range(indptr.shape[0] - 1):
        m = 0.0
        for j in range(indptr[s], indptr[s + 1]):
            m += float(w[indices[j]]) * float(values[j])
        out[s] = m
