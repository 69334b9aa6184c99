"""The non-finite guard and the index-range scan: read-only checks run on every update
before anything of it is written."""

from numba import njit

from ._intrinsics import FASTMATH


@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def finite_prefix(values, m):
    """True when the first ``m`` elements of the flat float array ``values`` are free of
    NaN and inf.

    ``x - x`` is 0 for a finite x and NaN for NaN or ±inf, so the sum of those terms is
    0 exactly when every element is finite. Reassociation lets the sum vectorise (~0.07
    ns an element here, 2.5x the integer exponent-max scan this replaced); without the
    ``nnan``/``ninf`` fast-math flags the compiler may not fold ``x - x`` to 0, and
    without ``nsz`` it may not fold ``s + (x - x)`` to ``s`` (``rowvec.grad_rows``'s
    in-register check relies on both). No early exit: non-finite values are the rare
    case.
    """
    acc = values.dtype.type(0)
    for i in range(m):
        x = values[i]
        acc += x - x
    return acc == 0


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def all_finite(values):
    """True when every element of the flat float32/float64 array ``values`` is finite."""
    return finite_prefix(values, values.shape[0])


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def all_finite_each(arrays):
    """True when every array of the tuple ``arrays`` (flat, one float dtype) is finite:
    the guard of a whole update in one call."""
    for p in range(len(arrays)):
        if not all_finite(arrays[p]):
            return False
    return True


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def index_bounds(rows):
    """``(min, max)`` of a non-empty 1-D integer array in one pass."""
    lo = rows[0]
    hi = rows[0]
    for i in range(1, rows.shape[0]):
        r = rows[i]
        if r < lo:
            lo = r
        if r > hi:
            hi = r
    return lo, hi

