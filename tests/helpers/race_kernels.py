"""Update functions for the real-process race tests (spawned workers import them)."""

import numpy as np
from numba import njit


@njit
def add_row(W, r, g, times):
    """``times`` non-atomic ``W[r] += g``, element by element."""
    for _ in range(times):
        for j in range(W.shape[1]):
            W[r, j] += g[j]


def _in_worker():
    import multiprocessing
    return multiprocessing.current_process().name != "MainProcess"


def raises(W, r):
    """Indexes row ``r`` in a worker process only (the parent's reference run passes)."""
    W[r if _in_worker() else 0, 0] = 1.0


def dies(W, r):
    """Kills its own worker process (the parent's reference run passes)."""
    import os
    if _in_worker():
        os._exit(3)
    W[0, 0] = 1.0


def bad_index(W, r):
    """Plain Python (numpy checks the index): fails for a row past the table."""
    W[r, 0] += 1.0
