"""Update-density kernels: choose which entries of an update are sent, keep the rest.

A filter runs in three steps on a flat C-contiguous view ``x`` of the update:

1. fold the residual in (``fold_flat`` for dense updates, ``fold_rows`` for sparse
   rows); skipped when the unsent part is dropped;
2. build a boolean ``mask`` of the entries to send: ``topk_mask`` (exactly ``k``
   largest ``|x|``, ties broken by position), ``threshold_mask`` (``|x| > t``) or
   ``random_mask`` (exactly ``k`` entries, uniform, from an explicit seed);
3. split: sent entries stay in ``x``, unsent ones are zeroed in ``x`` and, in
   residual mode, added to the residual (``split_flat``, ``split_rows``; ``drop_flat``
   when they are dropped).

Mass is conserved exactly in residual mode: each entry of the folded update ends up
either in the sent update or in the residual, never both, never altered.
"""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def fold_flat(g, r, x):
    """``x = g + r`` (the residual ``r`` is left as is; ``split_flat`` rewrites it)."""
    for i in range(x.shape[0]):
        x[i] = g[i] + r[i]


@njit(cache=True, nogil=True)
def fold_rows(G, rows, R, X):
    """``X[i] = G[i] + R[rows[i]]`` then ``R[rows[i]] = 0``, in batch order.

    A duplicated row takes its residual at its first occurrence only (later ones
    find zeros), so the residual is counted once.
    """
    d = X.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(d):
            X[i, j] = G[i, j] + R[r, j]
            R[r, j] = 0


@njit(cache=True, nogil=True)
def topk_mask(x, k, mask):
    """``mask[i] = True`` for exactly ``min(k, n)`` entries of largest ``|x[i]|``.

    Ties at the k-th magnitude go to the lowest positions. Returns the count set.
    """
    n = x.shape[0]
    if k >= n:
        for i in range(n):
            mask[i] = True
        return n
    for i in range(n):
        mask[i] = False
    if k <= 0:
        return 0
    a = np.empty(n, x.dtype)
    for i in range(n):
        a[i] = abs(x[i])
    t = np.partition(a, n - k)[n - k]          # k-th largest magnitude
    above = 0
    for i in range(n):
        if a[i] > t:
            above += 1
    ties = k - above
    for i in range(n):
        ai = a[i]
        if ai > t:
            mask[i] = True
        elif ai == t and ties > 0:
            mask[i] = True
            ties -= 1
    return k


@njit(cache=True, nogil=True)
def threshold_mask(x, t, mask):
    """``mask[i] = |x[i]| > t``. Returns the count set."""
    c = x.dtype.type(t)
    count = 0
    for i in range(x.shape[0]):
        keep = abs(x[i]) > c
        mask[i] = keep
        if keep:
            count += 1
    return count


@njit(cache=True, nogil=True)
def random_mask(n, k, seed, mask):
    """Exactly ``min(k, n)`` of ``n`` positions, uniformly, by selection sampling
    (Knuth, TAOCP vol. 2, Algorithm S) driven by a Park-Miller ``minstd`` generator
    started from ``seed`` (an int in [1, 2**31 - 2]). Deterministic given ``seed``,
    identical with and without JIT (int64 arithmetic that never overflows).
    Returns the count set.
    """
    modulus = 2147483647
    s = seed % modulus
    if s <= 0:
        s += modulus - 1
    for _ in range(4):                 # decorrelate nearby seeds
        s = (s * 48271) % modulus
    need = min(k, n)
    for i in range(n):
        if need == 0:
            mask[i] = False
            continue
        s = (s * 48271) % modulus
        u = s / modulus                # in (0, 1)
        if (n - i) * u < need:
            mask[i] = True
            need -= 1
        else:
            mask[i] = False
    return min(k, n)


@njit(cache=True, nogil=True)
def drop_flat(x, mask):
    """Zero the unsent entries of ``x`` (they are lost)."""
    for i in range(x.shape[0]):
        if not mask[i]:
            x[i] = 0


@njit(cache=True, nogil=True)
def split_flat(x, mask, r):
    """Dense residual split: ``r[i] = x[i]`` and ``x[i] = 0`` where unsent, else
    ``r[i] = 0`` (``x`` holds the folded ``g + r_old``)."""
    for i in range(x.shape[0]):
        if mask[i]:
            r[i] = 0
        else:
            r[i] = x[i]
            x[i] = 0


@njit(cache=True, nogil=True)
def split_rows(X, rows, mask, R):
    """Sparse residual split: unsent ``X[i, j]`` is added to ``R[rows[i], j]`` and
    zeroed in ``X``; ``mask`` is the flat (b*d) mask of ``X``."""
    d = X.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        base = i * d
        for j in range(d):
            if not mask[base + j]:
                R[r, j] += X[i, j]
                X[i, j] = 0


@njit(cache=True, nogil=True)
def accumulate_rows(R, rows, G):
    """``R[rows[i]] += G[i]`` in batch order (a held-back sparse update joins the
    residual; duplicates add up)."""
    d = R.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(d):
            R[r, j] += G[i, j]
