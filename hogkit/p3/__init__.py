"""The P3 wing: time, not convergence.

``propagation`` (schedules: fifo, slicing, priority, p3), ``profiles`` (per-layer
parameters and compute times of a ``torch.nn.Module``), ``comm`` (the discrete-event
communication model, ``simulate_comm``), ``live`` (the live check of the model over a
paced pipe, ``run_live``). Nothing here imports the training side.

Nothing is imported here (``profiles`` and ``live`` load torch); the public names are on
:mod:`hogkit` (``Schedule``, ``Profile``, ``Network``, ``simulate_comm``).
"""
