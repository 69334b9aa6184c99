"""The engine wing: how a run is planned, stepped and supervised.

``plan`` (the validated run plan), ``step`` (the step, written once: the compiled and the
Python engines), ``worker_loop`` and ``entry`` (a worker process), ``runtime`` (``train``:
plan → run → collect), ``live`` (``LiveRun``: share, spawn, supervise, collect; what
``spawn`` and a cluster node build on), ``supervisor`` (worker processes, failures,
ordered shutdown, signals), ``preflight`` (the cheap fatal checks every live run makes
first), ``simulator`` (the same step in virtual time),
``delays`` (straggler and step-time models), ``run`` (the result both front doors return),
``mainguard`` (the unguarded-script check).

Nothing is imported here: a spawned worker imports :mod:`hogkit.engine.entry` and must cap
its threads before numpy, numba or torch load. The public names are on :mod:`hogkit`.
"""
