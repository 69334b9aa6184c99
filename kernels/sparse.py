"""Sparse-row update kernels: ``W[rows[i]] -= lr * G[i]`` on a 2-D table.

Shapes: ``W`` is ``(n, d)``, ``rows`` is ``(b,)`` int64, ``G`` is ``(b, d)``, all
C-contiguous and of one float dtype (float32 or float64). Duplicate rows add up, in
batch order, exactly as ``np.subtract.at(W, rows, lr * G)`` does.

Nothing here checks anything: numba does no bounds checking, so a row outside
``[0, n)`` writes outside the table. ``hogkit.rules.core`` checks every argument first.

Each kernel prefetches rows ahead of use (``_intrinsics.prefetch_row``; see
:func:`prefetched` for when): 16 batch entries for the stateless update (measured 80 vs
108 µs per 4096 rows of a 1e6 x 64 float32 table against 8 ahead), 8 for momentum,
whose extra state rows make a longer distance slower. A small table of narrow rows is
read from cache anyway, and there a prefetch cost more than it saved (~1.5 ns a row).
A one-column table (logreg's weights, ``(n, 1)``) takes a loop of its own: the column
loop's set-up cost ~1.3 ns a row, four times the update itself. Those loops index the
table through ``np.uint64(rows[i])``: a signed index pays numba's negative-index fix-up
on every access, and the rows are never negative (checked at the boundary).

The scalars are cast to the table's dtype once per call (``W.dtype.type(lr)``), so a
float32 table is updated with float32 arithmetic throughout (no float64 temporaries).

Races: called on a shared table from several processes at once, these loops are the
Hogwild! update of Recht et al. (NIPS 2011): each element's read-modify-write is not
atomic, so concurrent writers to one element may lose an update. Called from one
process they are deterministic.
"""

import numpy as np
from numba import njit

from ._intrinsics import prefetch, prefetch_row

#: tables above this many bytes are prefetched ahead of use (about one core's L2)
PREFETCH_BYTES = 2 << 20


@njit(cache=True, nogil=True, inline="always")
def prefetched(W):
    """Whether the row kernels prefetch the 2-D table ``W`` ahead of use: when it
    outgrows :data:`PREFETCH_BYTES`, or its rows span a cache line or more (then a
    prefetch into L1 pays even from L2: mf's 32-float rows). A small table of narrow
    rows (logreg's ``(n, 1)`` weights) is read from cache anyway, and there the
    prefetch cost more than the update."""
    return (W.shape[1] * W.itemsize >= 64
            or W.shape[0] * W.shape[1] * W.itemsize > PREFETCH_BYTES)


@njit(cache=True, nogil=True, inline="always")
def sgd_rows(W, rows, G, lr, n=-1):
    """``W[rows[i], :] -= lr * G[i, :]`` for i in batch order (duplicates add up).

    ``n``: how many leading entries of ``rows``/``G`` to apply (-1: all), so a caller
    with fixed-capacity buffers never slices (a slice costs reference counting)."""
    a = W.dtype.type(lr)
    b = rows.shape[0] if n < 0 else n
    d = W.shape[1]
    pf = prefetched(W)
    if d == 1:
        for i in range(b):
            if pf and i + 16 < b:
                prefetch(W, rows[i + 16], 0)
            W[np.uint64(rows[i]), 0] -= a * G[i, 0]
        return
    if pf:
        for i in range(min(16, b)):
            prefetch_row(W, rows[i])
    for i in range(b):
        if pf and i + 16 < b:
            prefetch_row(W, rows[i + 16])
        r = rows[i]
        for j in range(d):
            W[r, j] -= a * G[i, j]


@njit(cache=True, nogil=True, inline="always")
def momentum_rows(W, M, rows, G, lr, mu, gscale=1.0, n=-1):
    """Heavy-ball momentum on the touched rows only ("lazy" sparse momentum).

    For each i in batch order, with ``r = rows[i]``::

        M[r] = mu * M[r] + G[i]
        W[r] = W[r] - lr * M[r]

    ``gscale`` scales the gradient on its way in (``M[r] = mu * M[r] + gscale * G[i]``;
    1.0 is exact): the staleness-aware rule damps a stale gradient this way.
    ``M`` has W's shape. Rows not in the batch keep their buffer undecayed (the
    semantics of lazy sparse optimisers, e.g. torch's SparseAdam); a duplicated row
    takes one momentum step per occurrence. ``n`` as in :func:`sgd_rows`.
    """
    a = W.dtype.type(lr)
    m = W.dtype.type(mu)
    s = W.dtype.type(gscale)
    b = rows.shape[0] if n < 0 else n
    d = W.shape[1]
    pf = prefetched(W)
    if d == 1:
        for i in range(b):
            if pf and i + 8 < b:
                prefetch(W, rows[i + 8], 0)
                prefetch(M, rows[i + 8], 0)
            r = np.uint64(rows[i])
            v = m * M[r, 0] + s * G[i, 0]
            M[r, 0] = v
            W[r, 0] -= a * v
        return
    if pf:
        for i in range(min(8, b)):
            prefetch_row(W, rows[i])
            prefetch_row(M, rows[i])
    for i in range(b):
        if pf and i + 8 < b:
            prefetch_row(W, rows[i + 8])
            prefetch_row(M, rows[i + 8])
        r = rows[i]
        for j in range(d):
            v = m * M[r, j] + s * G[i, j]
            M[r, j] = v
            W[r, j] -= a * v
