"""numba kernels of hogkit, installed as ``hogkit.kernels``. Pure functions on arrays
and scalars; nothing here imports hogkit."""
