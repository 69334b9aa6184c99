"""Dense update kernels over a flat buffer (axpy-style).

Every array is 1-D, C-contiguous and of one float dtype; a parameter of any shape is
passed as its flat view (``p.reshape(-1)``, no copy). The loop walks the buffer in
blocks of 4096 elements: the inner loop runs over *slices* of the block, a plain
stride-1 axpy that LLVM vectorises (indexing the whole arrays with ``i`` in
``range(lo, hi)`` did not vectorise: 36 µs against 5 µs for 32k float32), and a concurrent Hogwild! reader sees the buffer change block by block
(Recht et al., NIPS 2011: element updates are not atomic; with one writer the result
is deterministic).

Scalars are cast to the buffer's dtype once per call, so float32 stays float32.
Nothing here checks shapes: ``hogkit.rules.core`` does. Each kernel states its own
fast-math flags (``delayed.py`` says why): the rule updates the step core's
:data:`~hogkit.kernels._intrinsics.FASTMATH`, the merge none (numpy's arithmetic).
"""

from numba import njit

from ._intrinsics import FASTMATH


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def sgd_flat(w, g, lr):
    """``w -= lr * g`` element-wise."""
    a = w.dtype.type(lr)
    n = w.shape[0]
    for lo in range(0, n, 4096):
        ws = w[lo:lo + 4096]        # slices: the inner loop vectorises (see module doc)
        gs = g[lo:lo + 4096]
        for j in range(ws.shape[0]):
            ws[j] -= a * gs[j]


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def momentum_flat(w, m, g, lr, mu, gscale=1.0):
    """Heavy-ball momentum: ``m = mu * m + gscale * g; w -= lr * m`` element-wise
    (``gscale`` 1.0 is exact; the staleness-aware rule damps a stale gradient with it)."""
    a = w.dtype.type(lr)
    b = w.dtype.type(mu)
    s = w.dtype.type(gscale)
    n = w.shape[0]
    for lo in range(0, n, 4096):
        ws = w[lo:lo + 4096]
        ms = m[lo:lo + 4096]
        gs = g[lo:lo + 4096]
        for j in range(ws.shape[0]):
            v = b * ms[j] + s * gs[j]
            ms[j] = v
            ws[j] -= a * v


@njit(cache=True, nogil=True, fastmath=False)
def merge_flat(shared, replica, base, workers):
    """A local phase's merge in one pass: ``shared += (replica − base) / workers``, then
    ``replica = base =`` the value that add left in ``shared`` (element by element: a
    concurrent merge of another worker landing between two elements is kept in
    ``shared`` and seen at the next pull). In float32 throughout for float32 buffers,
    as numpy computes ``shared += (replica - base) / W``."""
    w = shared.dtype.type(workers)
    n = shared.shape[0]
    for lo in range(0, n, 4096):
        ss = shared[lo:lo + 4096]
        rs = replica[lo:lo + 4096]
        bs = base[lo:lo + 4096]
        for j in range(ss.shape[0]):
            v = ss[j] + (rs[j] - bs[j]) / w
            ss[j] = v
            rs[j] = v
            bs[j] = v
