"""The non-finite guard: scan an update before anything of it is written."""

from numba import njit


@njit(cache=True, nogil=True)
def all_finite(values):
    """True when every element of the flat array ``values`` is finite.

    Scans in blocks of 1024 and stops at the first block holding a NaN or an inf:
    within a block ``acc += x - x`` stays exactly 0 while every ``x`` is finite and
    becomes NaN as soon as one is not (no branch in the inner loop).
    """
    n = values.shape[0]
    zero = values.dtype.type(0)
    for lo in range(0, n, 1024):
        hi = min(lo + 1024, n)
        acc = zero
        for i in range(lo, hi):
            x = values[i]
            acc += x - x
        if acc != zero:
            return False
    return True
