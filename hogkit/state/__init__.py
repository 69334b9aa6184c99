"""The state wing: what lives in shared memory and on disk.

``store`` (``ParamStore``: one segment, named zero-copy views), ``clocks`` (per-worker
single-writer counters), ``reader`` (read → gap → commit, and the ``StalenessLog``),
``worker_state`` (each worker's private rule, density and sampler state), ``checkpoint``
(the file format and its atomic write), ``resume`` (periodic checkpoints and resume).

Nothing is imported here (workers import these modules before numpy when they start);
the public names are on :mod:`hogkit`.
"""
