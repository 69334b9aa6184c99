"""``train()``: a supervised Hogwild! run on real processes over shared memory.

The front door: *plan → run → collect*. :func:`train` checks every setting and makes
the plan (:func:`~hogkit.engine.plan.make_plan`: the defaults, the step engine, the
lane), and hands it to a :class:`~hogkit.engine.live.LiveRun`, which
shares the stores, spawns and supervises the workers (:mod:`hogkit.engine.supervisor`)
and collects the :class:`~hogkit.engine.run.Run`. A resumed run starts from its
checkpoint with the budget that is left (:mod:`hogkit.state.resume`).

Over several machines, the same training is :func:`hogkit.cluster.train` (Ray).
"""

from __future__ import annotations

import dataclasses
import os

from hogkit.engine.live import LiveRun
from hogkit.engine.mainguard import check_main_guard
from hogkit.engine.plan import make_plan
from hogkit.engine.run import Run
from hogkit.engine.settings import Outputs, Workers
from hogkit.state.resume import check_compatible, load_state, remaining

__all__ = ["train"]


def train(workload="mf", *, workers=2, policy=None, rule=None, density=None, batch=None,
          steps=None, seconds=None, seed=0, engine=None, outputs=None) -> Run:
    """Train ``workload`` with ``workers`` processes sharing one parameter store.

    workload : ``"mf"``, ``"logreg"``, ``"mlp"``, ``"rnn"`` (:mod:`hogkit.workloads`;
        ``hogkit.workload(name, **options)`` for its settings) or an object with
        ``build/setup/gradient/loss``. ``workers``: processes (≥ 1), or
        :class:`~hogkit.engine.settings.Workers` (stragglers, timeouts, restarts).
    policy : consistency policy, default ``Async()`` (Hogwild!). ``rule``: update rule
        (``hogkit.rules``), default the workload's. ``density``: a ``Density`` filter on
        each update before the rule. ``batch``: samples a step, default the workload's.
    steps, seconds : stop after ``steps`` iterations in total (split evenly over the
        workers) and/or after ``seconds`` of wall time, whichever comes first; neither:
        the workload's default budget. ``seed``: data, model, sampling.
    engine : ``"auto"`` | ``"compiled"`` | ``"python"``, or
        :class:`~hogkit.engine.settings.Engine` (the lane, replicas, per-shard clocks,
        non-finite updates): how the steps run; the summary says which ran.
    outputs : a results folder, or :class:`~hogkit.engine.settings.Outputs` (events,
        checkpoints, a resume, loss evaluations, progress, the final parameters).

    What is left out comes from the workload's one set of defaults, the same for every
    way in (``hogkit run``, ``simulate``, a sweep); ``summary()["config"]["chosen"]``
    says what was taken and why. Raises InvalidArgument / InvalidType for bad settings
    (before anything is spawned), WorkerFailed when a worker dies or raises (rank,
    signal or exit code, traceback), Interrupted on SIGINT/SIGTERM; the workers are
    stopped and no segment is left.
    """
    check_main_guard("hogkit.train()")
    outs, wk = Outputs.of(outputs), Workers.of(workers)
    resumed = None if outs.resume is None else load_state(outs.resume)
    if outs.resume is not None and outs.folder is None:
        outs = dataclasses.replace(outs, folder=outs.resume)
    plan = make_plan(workload, workers=wk, policy=policy, rule=rule, density=density,
                     batch=batch, steps=steps, seconds=seconds, seed=seed, engine=engine,
                     outputs=outs, mode="live")
    live = _live_run(plan, outs.resume, resumed, checkpoint_every=outs.checkpoint_seconds,
                     wait_timeout=wk.wait_timeout, grace=wk.grace,
                     on_failure=wk.on_failure, max_restarts=wk.max_restarts)
    return live.run(outs.progress)


def _live_run(plan, resume, resumed, **options) -> LiveRun:
    """The :class:`LiveRun` of ``plan``; a resumed one (``resumed``: what
    :func:`~hogkit.state.resume.load_state` read from ``resume``) runs what is left of
    the budget, and its config keeps the whole run's."""
    budget = (plan.steps, plan.seconds)
    if resumed is not None:
        _, state, meta = resumed
        check_compatible(meta, plan.config())
        left_steps, left_seconds = remaining(plan.steps, plan.seconds, state)
        plan = dataclasses.replace(plan, steps=left_steps, seconds=left_seconds,
                                   stream=state.segment + 1)
    live = LiveRun(plan, plan.engine, **options,
                   resume=None if resumed is None else (os.fspath(resume), *resumed[1:]))
    live.config.update(steps=budget[0], seconds=budget[1])
    if resumed is not None:
        live.config["segments"] = plan.stream + 1
    return live
