"""Process bodies for tests/test_blocks.py (spawned children import this module)."""

from __future__ import annotations

import time


def cas_increments(handle, count):
    """Attach the store, say ready (``w[1] += 1``), wait for the go (``w[2]``), then add
    1 to ``w[0]`` ``count`` times, each by a CAS loop (``kernels._intrinsics.cas``):
    the final ``w[0]`` is exact only if the CAS is atomic across processes."""
    from numba import njit

    from hogkit.kernels._intrinsics import cas
    from hogkit.state.store import ParamStore

    @njit(nogil=True)
    def bump(w, j, n):
        for _ in range(n):
            while True:
                old = w[j]
                if cas(w, j, old, old + 1) == old:
                    break

    s = ParamStore.attach(handle)
    w = s["w"]
    bump(w, 0, 0)                   # compile before saying ready
    bump(w, 1, 1)
    deadline = time.monotonic() + 60
    while w[2] == 0 and time.monotonic() < deadline:
        pass
    bump(w, 0, count)
    s.close()
