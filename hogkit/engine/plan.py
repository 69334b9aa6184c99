"""The run plan: one validated, picklable description of a run, built once.

Every front door starts here. ``train`` (live processes) is *plan → supervise →
collect*; ``simulate`` (virtual time) is *plan → simulate → collect*; a cluster run
makes one plan per node; the command line and a sweep build their knobs and call one
of them. :func:`make_plan` checks every knob they share, with the same messages, and
fills what the caller left out from the workload's one set of defaults, the same way
for every door; :meth:`RunPlan.simulable` refuses, in one place, what the simulator
cannot model. :meth:`RunPlan.config` is how a run describes itself in
``summary.json``, what the defaults chose included (``"chosen"``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from hogkit import workloads
from hogkit.engine.replication import check_with_policy, local_plan, parse_replication
from hogkit.engine.settings import EVENTS, Engine, Outputs, Workers
from hogkit.engine.step import choose_engine, lane_support, resolve_lane
from hogkit.errors import InvalidArgument, InvalidType
from hogkit.policy import Async
from hogkit.rules.core import SGD
from hogkit.validation import check_choice, check_float, check_int
from hogkit.workloads.base import Defaults, check_workload

__all__ = ["EVENTS", "EVENTS_FILE_PER_S", "RunPlan", "make_plan", "resolve_workload",
           "check_out", "config_of", "split_steps", "EVAL_EVERY_LIVE_S", "MODES",
           "defaults_of"]

#: what a live run writes to ``events.jsonl`` at most, a second (``events="sampled"``)
EVENTS_FILE_PER_S = 400
#: ``make_plan(mode=...)``: a live run, a cluster node's run, a simulation
MODES = ("live", "node", "sim")

#: ``eval_every="auto"`` on a live run: a loss evaluation every this many wall seconds
#: (the simulator's "auto" is ``evals`` points evenly spaced in updates)
EVAL_EVERY_LIVE_S = 0.5


@dataclass(frozen=True)
class RunPlan:
    """What to run (see :func:`make_plan`; every field is checked there)."""

    workload: object            # a Workload object (resolved from its name)
    workers: int
    policy: object              # default Async()
    rule: object                # default: the workload's (Workload.defaults)
    density: object             # None or a Density
    batch: object               # int (per worker, fixed) or a hogkit.rules.batching object
    global_batch: int           # B of a batching object; 0 for an int batch
    epoch_steps: int            # iterations per epoch (EpochBalancedBatch); 0 for an int
    steps: Optional[int]        # total iterations over all workers, or None
    seconds: Optional[float]    # budget (wall or virtual seconds), or None
    seed: int
    nonfinite: str              # "raise" | "skip"
    stragglers: dict            # {rank: delay model}
    eval_every: object          # "auto" | None (start and end only) | seconds
    shards: int
    out: Optional[str]
    keep_params: bool
    events: str = "sampled"     # what events.jsonl keeps of the updates (see EVENTS)
    stream: int = 0             # 0, or the segment number of a resumed run
    lane: str = "batch"         # "batch" | "sample" (the simulator: "batch")
    replication: object = None  # a Replication ("auto" until the workload is built)
    engine: str = "auto"        # the step engine: "compiled" | "python" (simulate: chosen
    #                             there, with the replicas resolved)
    chosen: dict = field(default_factory=dict)   # what the defaults chose, and why

    @property
    def local(self):
        """The workers' replica and merges (:func:`~hogkit.engine.replication.local_plan`:
        LocalSGD's phases or ``replication="worker"``), or None: steps write the shared
        copy."""
        return local_plan(self.policy, self.replication, self.workers)

    @property
    def worker_seed(self) -> int:
        """The seed of the workers' random streams (sampling, pacers): ``seed`` for a
        first run, a different stream for each resumed segment (which must not replay
        the minibatches it already saw); the data always come from ``seed``."""
        return self.seed if self.stream == 0 else self.seed + 1_000_003 * self.stream

    def quotas(self) -> list:
        """Each worker's share of ``steps`` (None shares without a step budget)."""
        return split_steps(self.steps, self.workers)

    def worker_batch(self) -> int:
        """A typical per-worker batch (the int, or an even share of B)."""
        return self.batch if not self.global_batch else max(1, self.global_batch //
                                                            self.workers)

    def simulable(self) -> None:
        """Raise, naming the knob and the fix, if the simulator cannot model this run."""
        if self.global_batch:
            raise InvalidType(f"batch={self.batch!r}: the simulator does not model adaptive "
                              f"batch sizing; pass an int batch (samples per worker per step)")
        if self.shards != 1:
            raise InvalidArgument(f"shards={self.shards}: the simulator does not model "
                                  f"per-shard staleness; use shards=1")
        if not callable(getattr(self.policy, "encode", None)):
            raise InvalidType(f"policy={self.policy!r}: the simulator models the policies "
                              f"that encode themselves (hogkit.policy.Policy: Async(), BSP(), "
                              f"SSP(s), DSSP(lo, hi), LocalSGD(h), BoundedDelay(K), or a "
                              f"subclass of Policy); a wait() of one's own runs live only")
        why = self.policy.simulable()
        if why is not None:
            raise InvalidArgument(why)
        only = getattr(self.workload, "needs_lane", None)
        if only:
            raise InvalidArgument(f"the simulator cannot run this: {only} (the simulator "
                                  f"models whole steps, atomic in virtual time)")

    def config(self, **extra) -> dict:
        """JSON-able description of the run, for ``summary.json`` (``extra`` appended)."""
        batch = config_of(self.batch) if self.global_batch else self.batch
        return {"workload": self.workload.name, "workload_config": config_of(self.workload),
                "workers": self.workers, "policy": config_of(self.policy),
                "rule": config_of(self.rule), "density": config_of(self.density),
                "batch": batch, "steps": self.steps, "seconds": self.seconds,
                "seed": self.seed, "nonfinite": self.nonfinite, "shards": self.shards,
                "lane": self.lane,
                **({"replication": self.replication.config()} if self.replication is not None
                   and self.replication.mode != "shared" else {}),
                "stragglers": {str(r): config_of(m) for r, m in self.stragglers.items()},
                **({"chosen": dict(self.chosen)} if self.chosen else {}),
                **extra}


def make_plan(workload="mf", *, workers=2, policy=None, rule=None, density=None,
              batch=None, steps=None, seconds=None, seed=0, engine=None, outputs=None,
              mode="live") -> RunPlan:
    """Check and resolve the knobs every front door shares (``train``'s docstring says
    what each is) into one :class:`RunPlan`; nothing is built or spawned. ``mode``:
    ``"live"`` (:func:`~hogkit.engine.runtime.train`: worker processes, so the
    workload must pickle), ``"node"`` (a cluster node's: the same, whole steps) or
    ``"sim"`` (:func:`~hogkit.engine.simulator.simulate`: virtual workers and
    seconds; the engine is chosen there, with the replicas resolved).

    What the caller leaves out comes from the workload's one set of defaults
    (:meth:`~hogkit.workloads.base.Workload.defaults`): the rule, the batch, the budget
    and, where the engine and knobs allow it, the lane; :attr:`RunPlan.chosen` says
    what was taken and, where a run cannot follow the defaults (the simulator models
    the batch lane), what differs and why."""
    check_choice("mode", mode, MODES)
    live = mode != "sim"
    where = {"live": "train()", "node": "a cluster run", "sim": "simulate()"}[mode]
    wk, en, outs = Workers.of(workers), Engine.of(engine), Outputs.of(outputs)
    _refuse_for(mode, wk, en, where)
    time_unit = "wall time" if live else "virtual seconds"
    wl = resolve_workload(workload, need_lr=rule is None, need_batch=batch is None,
                          spawn=live)
    d = defaults_of(wl)
    n = check_int("workers", wk.n, min_value=1, max_value=4096 if live else 1 << 20,
                  fix="use workers=1 for a sequential baseline")
    chosen = {}
    sized = getattr(wl, "for_workers", lambda _n: wl)(n)
    if sized is not wl:
        chosen["workload"] = _sized_note(wl, sized, n)
        wl = sized
    if rule is None:
        rule = d.rule if d.rule is not None else SGD(lr=d.lr)
        chosen["rule"] = "default"
    seed = check_int("seed", seed, min_value=0)
    policy = Async() if policy is None else policy
    _check_knob("policy", policy, ("wait",), "hogkit.policy (SSP, BSP(), Async(), DSSP, "
                "LocalSGD)")
    _check_knob("rule", rule, ("init", "apply"), "hogkit.rules (SGD, GapAware, Adam, ...)")
    if density is not None:
        _check_knob("density", density, ("init", "filter"), "hogkit.rules.density.Density")
    if batch is not None:
        _resolve_batch(batch, wl, n)                 # checked before the lane reads it
    stragglers = _check_stragglers(wk, n)
    out = check_out(outs.folder)
    replication = parse_replication(en.replication)
    check_with_policy(replication, policy, en.shards)
    kind, lane = _engine_and_lane(mode, en, wl, d, rule=rule, density=density,
                                  batch=d.batch_for(d.lane) if batch is None else batch,
                                  policy=policy, stragglers=stragglers, where=where)
    if batch is None:
        batch = d.batch_for(lane)
        chosen["batch"] = "default"
    if steps is None and seconds is None:
        steps = max(n, d.steps_at(batch if isinstance(batch, (int, np.integer))
                                  else d.batch))
        chosen["steps"] = "default"
    steps, seconds = _check_budget(steps, seconds, n, time_unit)
    batch, global_batch, epoch_steps = _resolve_batch(batch, wl, n)
    if en.lane == "auto" and d.lane != lane:
        chosen["lane"] = _lane_note(mode, wl, d, rule, density, batch, en.shards, kind,
                                    batch_taken="batch" in chosen)
    if chosen:
        chosen["why"] = d.why
    return RunPlan(workload=wl, workers=n, policy=policy, rule=rule, density=density,
                   batch=batch, global_batch=global_batch, epoch_steps=epoch_steps,
                   steps=steps, seconds=seconds, seed=seed, nonfinite=en.nonfinite,
                   stragglers=stragglers, eval_every=outs.eval_every, shards=en.shards,
                   out=out, keep_params=outs.keep_params, events=outs.events, lane=lane,
                   replication=replication, engine=kind, chosen=chosen)


def _refuse_for(mode, wk, en, where):
    """Refuse the settings that do not apply to ``mode``'s runs, by name."""
    if mode != "sim":
        wk.refuse("delays", where=where)
        if en.rule_state is not None:
            raise InvalidArgument(f"Engine(rule_state=...) does not apply to {where}: a "
                                  f"live run keeps the state the rule declares "
                                  f"(rule.shared_state); drop it")
    else:
        wk.refuse("wait_timeout", "grace", "on_failure", "max_restarts", where=where)


def _engine_and_lane(mode, en, wl, d, *, rule, density, batch, policy, stragglers,
                     where):
    """``(engine, lane)`` of the run: the engine ``en`` asks for where it can run the
    knobs (the simulator chooses its own, with the replicas resolved), and the lane
    (``en.lane``; "auto": the workload's default lane where the run allows it). The
    simulator and a cluster node run whole steps: the batch lane."""
    kind, lane = en.kind, "batch"
    if mode != "sim":
        kind = choose_engine(en.kind, wl, rule=rule, density=density, batch=batch,
                             shards=en.shards, policy=policy, stragglers=stragglers)
    if mode == "live":
        lane = resolve_lane(en.lane, wl, rule=rule, density=density, batch=batch,
                            shards=en.shards, engine=kind)
    elif en.lane == "sample":
        raise InvalidArgument(f"lane='sample' does not apply to {where}: "
                              f"{_WHOLE_STEPS[mode]}; use lane='batch' or 'auto'")
    return kind, lane


def _check_stragglers(wk, n) -> dict:
    """``{rank: delay model}`` of ``wk``, each rank below ``n`` and each model one."""
    stragglers = dict(wk.stragglers or {})
    for r, model in stragglers.items():
        check_int("straggler rank", r, min_value=0, max_value=n - 1,
                  fix=f"ranks run from 0 to workers-1 = {n - 1}")
        _check_knob(f"stragglers[{r}]", model, ("start",), "hogkit.engine.delays (Slowdown, "
                    "Pauses, Load)")
    return stragglers


def _sized_note(wl, sized, n):
    """What ``for_workers`` changed of the workload for ``n`` workers (the summary's
    ``chosen["workload"]``)."""
    was, now = wl.config(), sized.config()
    changed = ", ".join(f"{k}={now[k]!r}" for k in now if now[k] != was.get(k))
    return f"{changed} for {n} workers ({type(wl).__name__}.for_workers)"


#: why a door runs the batch lane only
_WHOLE_STEPS = {"sim": "the simulator models whole steps (a read, then an update)",
                "node": "a cluster node runs whole steps"}


def _lane_note(mode, wl, d, rule, density, batch, shards, kind, *, batch_taken):
    """Why a run takes the batch lane where the workload's default is the per-sample
    lane, and what it keeps (the summary's ``chosen["lane"]``); ``batch_taken``: the
    batch is the default's (the batch lane's own where the two lanes' differ)."""
    if mode in _WHOLE_STEPS:
        why = _WHOLE_STEPS[mode]
    else:
        why = lane_support(wl, rule=rule, density=density, batch=batch, shards=shards,
                           engine=kind) or "the run's knobs"
    same = "the same rule"
    if batch_taken:
        same += (" and batch" if d.batch_for("batch") == d.batch_for(d.lane) else
                 f"; a step of {d.batch_for('batch')} samples, the batch lane's minibatch "
                 f"(the {d.lane} lane's: {d.batch_for(d.lane)})")
    return f"batch: {why}; {wl.name}'s default lane is {d.lane!r}, with {same}"


def defaults_of(wl):
    """The workload's :class:`~hogkit.workloads.base.Defaults` (a duck-typed workload
    without ``defaults()``: from its ``default_*`` attributes)."""
    fn = getattr(wl, "defaults", None)
    if callable(fn):
        return fn()
    return Defaults(rule=None, lr=getattr(wl, "default_lr", 0.0),
                    batch=getattr(wl, "default_batch", 1),
                    lane=getattr(wl, "default_lane", "batch"),
                    steps=getattr(wl, "default_steps", 10_000),
                    sample_batch=getattr(wl, "default_sample_batch", None))


# --------------------------------------------------------------------------- pieces

def resolve_workload(workload, *, need_lr=True, need_batch=True, spawn=False):
    """A workload object from a registry name (its defaults: ``hogkit.workload(name,
    **options)`` for others) or an object that follows the Workload contract (checked:
    ``need_lr`` / ``need_batch`` when its default lr / batch will be used)."""
    if isinstance(workload, str):
        return workloads.get(workload)
    return check_workload(workload, need_lr=need_lr, need_batch=need_batch, spawn=spawn)


def check_out(out):
    """``out`` as a str, checked without creating anything: an existing folder, or a
    path whose nearest existing parent is a folder this process may write in."""
    if out is None:
        return None
    if not isinstance(out, (str, os.PathLike)):
        raise InvalidType(f"out={out!r} must be a folder path (str or os.PathLike) or None")
    path = os.path.abspath(os.fspath(out))
    if os.path.exists(path) and not os.path.isdir(path):
        raise InvalidArgument(f"out={out!r} exists and is not a folder; give a folder for "
                              f"the results")
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    try:                         # a probe, removed at once (root passes os.access)
        os.rmdir(tempfile.mkdtemp(prefix=".hogkit-probe-", dir=parent))
    except OSError as e:
        raise InvalidArgument(f"out={out!r}: cannot create the results folder there "
                              f"({parent!r}: {e.strerror or e}); give a folder you can "
                              f"write to") from None
    return os.fspath(out)


def _check_knob(name, obj, methods, where):
    """``obj`` has the callable ``methods`` of its kind (policy, rule, density...)."""
    missing = [m for m in methods if not callable(getattr(obj, m, None))]
    if missing:
        raise InvalidType(f"{name}={obj!r} has no {', '.join(m + '()' for m in missing)}; "
                          f"pass an object from {where}")


def _check_budget(steps, seconds, workers, time_unit):
    """``(steps, seconds)`` checked: steps a total over all workers."""
    if steps is not None:
        steps = check_int("steps", steps, min_value=workers,
                          fix=f"steps is the total over all workers; give at least {workers}")
    if seconds is not None:
        seconds = check_float("seconds", seconds, min_value=0.0, exclude_min=True,
                              fix=f"a budget in {time_unit}")
    return steps, seconds


def _resolve_batch(batch, wl, workers):
    """``(batch, global_batch, epoch_steps)``: an int batch is per worker and fixed
    (global_batch 0); a hogkit.rules.batching object sizes each worker's share per iteration."""
    if isinstance(batch, (int, np.integer)) and not isinstance(batch, bool):
        return check_int("batch", batch, min_value=1), 0, 0
    if not all(hasattr(batch, a) for a in ("sizes", "observe", "speed", "global_batch")):
        raise InvalidType(f"batch={batch!r} must be an int (samples per worker per "
                          f"step) or a hogkit.rules.batching object (FixedBatch, AdaptiveBatch, "
                          f"EpochBalancedBatch)")
    if getattr(batch, "min_batch", 1) < 1:
        raise InvalidArgument(f"{batch!r} has min_batch={batch.min_batch}: a worker could "
                              f"get an empty batch; use min_batch >= 1 with the runtime")
    B = int(batch.global_batch(workers))
    if B < workers:
        raise InvalidArgument(f"global batch B={B} is smaller than workers={workers}; "
                              f"every worker needs at least one sample per step")
    n = int(getattr(wl, "n_samples", 0) or 0)
    return batch, B, max(1, n // B) if n else 100


def split_steps(steps, workers):
    """Each worker's share of ``steps`` (the first ``steps % workers`` get one more);
    ``None`` shares when there is no step budget."""
    if steps is None:
        return [None] * workers
    return [steps // workers + (1 if r < steps % workers else 0) for r in range(workers)]


def config_of(obj):
    """JSON-able settings of a knob: its ``config()``, its dataclass fields, or repr."""
    if obj is None:
        return None
    if hasattr(obj, "config"):
        return obj.config()
    if dataclasses.is_dataclass(obj):
        return {"name": type(obj).__name__, **dataclasses.asdict(obj)}
    return repr(obj)


def eval_interval(plan, *, live, evals=20):
    """``(every_seconds, every_updates)`` for ``plan.eval_every``: a number is seconds;
    None evaluates only at the start and the end; "auto" is
    :data:`EVAL_EVERY_LIVE_S` live, and ``evals`` points evenly spaced in updates
    (in time with only a ``seconds`` budget) in the simulator."""
    e = plan.eval_every
    if e is None:
        return math.inf, math.inf
    if e != "auto":
        return float(e), math.inf
    if live:
        return EVAL_EVERY_LIVE_S, math.inf
    evals = check_int("evals", evals, min_value=1)
    if plan.steps is not None:
        return math.inf, max(1, math.ceil(plan.steps / evals))
    return plan.seconds / evals, math.inf
