"""numba kernels of hogkit, installed as ``hogkit.kernels``. Pure functions on arrays
and scalars; nothing here imports hogkit.

One module per family, every kernel ``@njit(cache=True, nogil=True)``, checked by
nobody but its caller (``hogkit.rules``, ``hogkit.density``):

- ``sparse``: ``sgd_rows``, ``momentum_rows`` (row updates, duplicates add up);
- ``dense``: ``sgd_flat``, ``momentum_flat`` (axpy over a flat buffer);
- ``delayed``: staleness-aware, DC-ASGD (constant, adaptive), Gap-Aware, each
  ``*_flat`` and ``*_rows``;
- ``density``: fold / select (top-k, threshold, random) / split of an update;
- ``guard``: ``all_finite``;
- ``_intrinsics``: ``prefetch`` and ``sqrt`` (LLVM intrinsics numba does not expose).

``hogkit.rules.warmup()`` compiles all of them for float32 and float64.
"""
