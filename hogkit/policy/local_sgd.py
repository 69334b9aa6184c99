"""Local SGD's arithmetic (the :class:`hogkit.policy.LocalSGD` policy says *when* to
merge; this says *what* a merge writes): a worker's change over its local phase, and
the racy merge of the average change into the shared parameters. The live worker loop
and the simulator both call these.
"""

from __future__ import annotations

import numpy as np

from hogkit.validation import check_array, check_int

__all__ = ["local_delta", "merge"]


def local_delta(replica, base) -> np.ndarray:
    """``Δ = replica − base``: a worker's change over one local phase (a new array)."""
    check_array("replica", replica, dtype=(np.float32, np.float64), contiguous=False)
    check_array("base", base, dtype=replica.dtype, shape=replica.shape, contiguous=False)
    return np.subtract(replica, base)


def merge(shared, delta, *, workers) -> None:
    """``shared += delta / workers`` in place (the average change of W workers).

    Racy by design: a lock-free read-modify-write of each element; two workers merging
    into one element at the same instant can lose one add (Hogwild accepts this).
    """
    W = check_int("workers", workers, min_value=1, fix="pass the number of workers")
    check_array("shared", shared, dtype=(np.float32, np.float64), contiguous=False,
                writeable=True)
    check_array("delta", delta, dtype=(np.float32, np.float64), shape=shared.shape,
                contiguous=False)
    np.add(shared, delta / W if W != 1 else delta, out=shared, casting="same_kind")
