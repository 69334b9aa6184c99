"""``train()``: a supervised Hogwild! run on real processes over shared memory.

The front door: *plan → run → collect*. :func:`train` checks every setting and makes
the plan (:func:`~hogkit.engine.plan.make_plan`), picks the step engine
(:func:`choose_engine`), and hands both to a :class:`~hogkit.engine.live.LiveRun`, which
shares the stores, spawns and supervises the workers (:mod:`hogkit.engine.supervisor`)
and collects the :class:`~hogkit.engine.run.Run`. A resumed run starts from its
checkpoint with the budget that is left (:mod:`hogkit.state.resume`).

Over several machines, the same training is :func:`hogkit.cluster.train` (Ray).
"""

from __future__ import annotations

import dataclasses
import os
import warnings

from hogkit.engine.live import LiveRun
from hogkit.engine.mainguard import check_main_guard
from hogkit.engine.plan import make_plan, resolve_workload, rule_from_lr
from hogkit.engine.run import Run
from hogkit.engine.step import compiled_support, resolve_lane
from hogkit.errors import EngineNotice, InvalidArgument
from hogkit.state.resume import check_compatible, load_state, remaining
from hogkit.validation import check_choice, check_float, check_int

__all__ = ["train", "choose_engine", "ENGINES"]

ENGINES = ("auto", "compiled", "python")


def train(workload="mf", *, workers=2, policy=None, rule=None, density=None, batch=None,
          steps=None, seconds=None, seed=0, nonfinite="raise", stragglers=None,
          eval_every="auto", out=None, progress=None, wait_timeout=60.0, grace=2.0,
          workload_options=None, keep_params=True, shards=1, engine="auto",
          events="sampled", checkpoint_every="auto", resume=None, on_failure="stop",
          max_restarts=3, lane="auto", lr=None, replication="shared") -> Run:
    """Train ``workload`` with ``workers`` processes sharing one parameter store.

    workload : ``"mf"``, ``"logreg"``, ``"mlp"``, ... (:mod:`hogkit.workloads`; its
        constructor takes ``workload_options``) or an object with
        ``build/setup/gradient/loss``. ``workers``: worker processes (≥ 1).
    policy : consistency policy, default ``Async()`` (Hogwild!). ``rule``: update rule,
        default ``SGD(lr=workload.default_lr)``; ``lr`` alone: ``SGD(lr)``. ``density``:
        a ``Density`` filter on each update before the rule. ``batch``: samples per
        gradient, default ``workload.default_batch``. ``seed``: data, model, sampling.
    steps, seconds : stop after ``steps`` iterations in total (split evenly over the
        workers) and/or after ``seconds`` of wall time, whichever comes first.
    nonfinite : ``"raise"`` (the run stops with the worker's rank and step) or ``"skip"``
        (the update is dropped and counted); nothing non-finite reaches the parameters.
    stragglers : ``{rank: delay model}`` from :mod:`hogkit.engine.delays`.
    eval_every : seconds between loss evaluations on the live parameters; "auto"
        (every 0.5 s), or None (only at the start and the end).
    out : folder for ``summary.json``, ``events.jsonl``, ``loss.csv``, plots and
        ``checkpoint.npz``; None writes nothing. ``keep_params``: the final parameters
        in ``Run.params``. ``progress``: a tqdm bar (None: when stderr is a terminal).
    events : what ``events.jsonl`` keeps of the staleness events: ``"sampled"`` (at most
        400 a second, evenly spread), ``"all"`` (tens of MB a minute), ``"none"``; the
        histograms and the summary count every update (``summary["events"]``).
    shards : per-shard staleness (docs/algorithms.md §1): with S > 1 a sparse update's
        gap counts only others' updates to its S row ranges; dense ones touch all.
    engine : ``"auto"`` (the compiled step core wherever it can run the workload and
        knobs, else the Python step with a one-line notice), ``"compiled"`` (refuse what
        it cannot run) or ``"python"`` (the reference); the summary says which ran.
    lane : ``"batch"`` (the exact minibatch step: a step's gradient from its start
        values, then applied), ``"sample"`` (per-sample Hogwild! on the compiled core:
        each sample's update applied at once; ``batch`` samples make one step for the
        clocks, the policy and the staleness record, docs/algorithms.md) or ``"auto"``
        (the workload's ``default_lane`` where the knobs allow it, else "batch"). A
        workload whose gradient is a batch mean steps ``lr / batch`` per sample; with
        no ``batch`` the lane takes the workload's ``default_lane_batch`` (mf: 4,096).
    checkpoint_every : seconds between fuzzy checkpoints into ``out/checkpoint.npz``;
        "auto": 60 when ``out`` is given; None: only the quiesced one at the end.
    on_failure : ``"stop"`` (the first worker that dies ends the run with
        :class:`WorkerFailed`) or ``"restart"``: a dead worker is replaced by a fresh
        process that goes on from the shared clocks, at most ``max_restarts`` times
        (each in the events and ``summary["restarts"]``); a hung worker still stops it.
    resume : the results folder of an earlier run of the same workload, options,
        workers and shards: go on from its checkpoint with the budget that is left
        (``steps``/``seconds`` count the whole run); results go there unless ``out``.
    replication : ``"shared"`` (one copy, Hogwild!), ``"worker[:K]"`` (a replica per
        worker, its change added every K=16 steps; Async) or ``"auto"`` (replication.py).
    wait_timeout : seconds a policy wait, the start barrier or a silent worker may take
        before the run fails. ``grace``: seconds between stop flag, SIGTERM and SIGKILL.

    Raises InvalidArgument / InvalidType for bad settings (before anything is spawned),
    WorkerFailed when a worker dies or raises (rank, signal or exit code, traceback),
    Interrupted on SIGINT/SIGTERM; the workers are stopped and no segment is left.
    """
    check_main_guard("hogkit.train()")
    supervision = _supervision(wait_timeout, grace, on_failure, max_restarts)
    resumed = None if resume is None else load_state(resume)
    if resume is not None and out is None:
        out = os.fspath(resume)
    plan = make_plan(workload, workers=workers, policy=policy, rule=rule_from_lr(rule, lr),
                     density=density, batch=batch, steps=steps, seconds=seconds, seed=seed,
                     nonfinite=nonfinite, stragglers=stragglers, eval_every=eval_every,
                     shards=shards, out=out, workload_options=workload_options, lane=lane,
                     keep_params=keep_params, events=events, spawn=True,
                     replication=replication)
    checkpoint_every = _checkpoint_every(checkpoint_every, plan)
    engine = choose_engine(engine, plan.workload, rule=plan.rule, density=plan.density,
                           batch=plan.batch, shards=plan.shards, policy=plan.policy,
                           stragglers=plan.stragglers)
    plan = _with_lane(plan, engine, batch_given=batch is not None,
                      rule_given=rule is not None or lr is not None,
                      by_name=workload if isinstance(workload, str) else None,
                      options=workload_options)
    live = _live_run(plan, engine, resume, resumed, checkpoint_every=checkpoint_every,
                     **supervision)
    return live.run(progress)


def _with_lane(plan, engine, *, batch_given, rule_given, by_name=None, options=None):
    """``plan`` with its lane resolved (:func:`~hogkit.engine.step.resolve_lane`). On
    the per-sample lane what the caller did not give takes the workload's lane
    defaults: the batch its ``default_lane_batch``, the rule its
    ``default_lane_rule()``, and a workload given by name (``by_name``, made with
    ``options``) its ``default_lane_options`` where ``options`` name none of them."""
    lane = resolve_lane(plan.lane, plan.workload, rule=plan.rule, density=plan.density,
                        batch=plan.batch, shards=plan.shards, engine=engine)
    if lane != "sample":
        return dataclasses.replace(plan, lane=lane)
    wl, rule, batch = plan.workload, plan.rule, plan.batch
    extra = getattr(wl, "default_lane_options", None) or {}
    if by_name is not None and extra and not set(extra) & set(options or {}):
        wl = resolve_workload(by_name, {**extra, **(options or {})})
    if not batch_given:
        batch = getattr(wl, "default_lane_batch", None) or batch
    if not rule_given:
        rule = getattr(wl, "default_lane_rule", lambda: None)() or rule
    plan = dataclasses.replace(plan, workload=wl, rule=rule, batch=batch, lane=lane)
    resolve_lane("sample", wl, rule=rule, density=plan.density, batch=batch,
                 shards=plan.shards, engine=engine)       # the defaults run there too
    return plan


def _supervision(wait_timeout, grace, on_failure, max_restarts) -> dict:
    """The supervisor's settings, checked."""
    check_choice("on_failure", on_failure, ("stop", "restart"))
    return {"on_failure": on_failure,
            "max_restarts": check_int("max_restarts", max_restarts, min_value=0),
            "wait_timeout": check_float("wait_timeout", wait_timeout, min_value=0.0,
                                        exclude_min=True),
            "grace": check_float("grace", grace, min_value=0.0)}


def _checkpoint_every(checkpoint_every, plan):
    """Seconds between fuzzy checkpoints, or None: "auto" is 60 when the run writes
    results, and checkpoints need a folder to go to."""
    if checkpoint_every == "auto":
        return 60.0 if plan.out is not None else None
    if checkpoint_every is None:
        return None
    checkpoint_every = check_float("checkpoint_every", checkpoint_every, min_value=0.0,
                                   exclude_min=True, fix='seconds, "auto" or None')
    if plan.out is None:
        raise InvalidArgument("checkpoint_every needs out= (the folder the checkpoints go "
                              "to)")
    return checkpoint_every


def _live_run(plan, engine, resume, resumed, **options) -> LiveRun:
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
    live = LiveRun(plan, engine, **options,
                   resume=None if resumed is None else (os.fspath(resume), *resumed[1:]))
    live.config.update(steps=budget[0], seconds=budget[1])
    if resumed is not None:
        live.config["segments"] = plan.stream + 1
    return live


def choose_engine(engine, wl, *, rule, density, batch, shards=1, policy=None,
                  stragglers=None):
    """``"compiled"`` or ``"python"`` for ``engine`` = "auto" | "compiled" | "python":
    "auto" takes the compiled step core when it can run the knobs and says in one line
    (a :class:`~hogkit.errors.EngineNotice` warning) why not when it cannot."""
    check_choice("engine", engine, ENGINES)
    if engine == "python":
        return "python"
    why = compiled_support(wl, rule=rule, density=density, batch=batch, shards=shards,
                           policy=policy, stragglers=stragglers)
    if why is None:
        return "compiled"
    if engine == "compiled":
        raise InvalidArgument(f"engine='compiled' cannot run this: {why}; use "
                              f"engine='auto' or engine='python'")
    if not getattr(wl, "needs_torch", False):     # torch workloads: Python is expected
        warnings.warn(f"hogkit: the Python step runs this: {why}", EngineNotice,
                      stacklevel=3)
    return "python"
