"""The run plan: one validated, picklable description of a run, built once.

Both front doors start here. ``train`` (live processes) is *plan → supervise →
collect*; ``simulate`` (virtual time) is *plan → simulate → collect*; the command line
builds its knobs and calls one of them. :func:`make_plan` checks every knob the two
share, with the same defaults and the same messages, and :meth:`RunPlan.simulable`
refuses, in one place, what the simulator cannot model. :meth:`RunPlan.config` is how
a run describes itself in ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.validation import check_choice, check_float, check_int

__all__ = ["EVENTS", "EVENTS_FILE_PER_S", "RunPlan", "make_plan", "resolve_workload",
           "check_out", "config_of", "split_steps", "EVAL_EVERY_LIVE_S"]

#: ``events=``: which updates a live run writes to ``events.jsonl`` ("sampled": at most
#: :data:`EVENTS_FILE_PER_S` a second of run time, evenly spread; the histograms count
#: every update whatever this says)
EVENTS = ("sampled", "all", "none")
EVENTS_FILE_PER_S = 400

#: ``eval_every="auto"`` on a live run: a loss evaluation every this many wall seconds
#: (the simulator's "auto" is ``evals`` points evenly spaced in updates)
EVAL_EVERY_LIVE_S = 0.5


@dataclass(frozen=True)
class RunPlan:
    """What to run (see :func:`make_plan`; every field is checked there)."""

    workload: object            # a Workload object (resolved from its name)
    workers: int
    policy: object              # default Async()
    rule: object                # default SGD(workload.default_lr)
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
    lane: str = "batch"         # "auto" until the engine is chosen, then "batch"|"sample"
    replication: object = None  # a Replication ("auto" until the workload is built)

    @property
    def local(self):
        """The workers' replica and merges (:func:`~hogkit.engine.replication.local_plan`:
        LocalSGD's phases or ``replication="worker"``), or None: steps write the shared
        copy."""
        from hogkit.engine.replication import local_plan
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
        if self.lane == "sample":
            raise InvalidArgument("lane='sample': the simulator models whole steps (a "
                                  "read at START, an update at FINISH); use lane='batch'")
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
                **extra}


def rule_from_lr(rule, lr):
    """``rule``, or plain SGD at ``lr`` when only ``lr`` is given (``train(lr=0.1)``,
    as ``hogkit run --lr 0.1``); both given is refused, with the fix."""
    if lr is None:
        return rule
    if rule is not None:
        raise InvalidArgument(f"lr={lr!r} with rule={rule!r}: the rule carries its own "
                              f"lr; give one of them (e.g. rule=SGD(lr={lr!r}, "
                              f"momentum=0.9), or lr={lr!r} alone for plain SGD)")
    from hogkit.rules.core import SGD
    return SGD(lr=lr)


def make_plan(workload="mf", *, workers=2, policy=None, rule=None, density=None,
              batch=None, steps=None, seconds=None, seed=0, nonfinite="raise",
              stragglers=None, eval_every="auto", shards=1, out=None,
              workload_options=None, keep_params=True, time_unit="wall time",
              max_workers=4096, events="sampled", spawn=False, lane="auto",
              replication="shared") -> RunPlan:
    """Check and resolve the knobs ``train`` and ``simulate`` share (their docstrings
    describe them); nothing is built or spawned. ``time_unit`` names what ``seconds``
    and ``eval_every`` count in messages; ``spawn``: the workload goes to worker
    processes, so it must pickle."""
    from hogkit.policy import Async
    from hogkit.rules.core import SGD

    wl = resolve_workload(workload, workload_options, need_lr=rule is None,
                          need_batch=batch is None, spawn=spawn)
    workers = check_int("workers", workers, min_value=1, max_value=max_workers,
                        fix="use workers=1 for a sequential baseline")
    steps, seconds = _check_budget(steps, seconds, workers, time_unit)
    seed = check_int("seed", seed, min_value=0)
    shards = check_int("shards", shards, min_value=1, max_value=1 << 16,
                       fix="use shards=1 for one global update counter")
    check_choice("nonfinite", nonfinite, ("raise", "skip"))
    batch, global_batch, epoch_steps = _resolve_batch(batch, wl, workers)
    policy = Async() if policy is None else policy
    rule = SGD(lr=wl.default_lr) if rule is None else rule
    _check_knob("policy", policy, ("wait",), "hogkit.policy (SSP, BSP(), Async(), DSSP, "
                "LocalSGD)")
    _check_knob("rule", rule, ("init", "apply"), "hogkit.rules.core (SGD, StalenessAware, ...)")
    if density is not None:
        _check_knob("density", density, ("init", "filter"), "hogkit.rules.density.Density")
    if stragglers is not None and not isinstance(stragglers, Mapping):
        raise InvalidType(f"stragglers={stragglers!r} must be a dict {{rank: delay model}}")
    stragglers = dict(stragglers or {})
    for r, model in stragglers.items():
        check_int("straggler rank", r, min_value=0, max_value=workers - 1,
                  fix=f"ranks run from 0 to workers-1 = {workers - 1}")
        _check_knob(f"stragglers[{r}]", model, ("start",), "hogkit.engine.delays (Slowdown, "
                    "Pauses, Load)")
    if eval_every is not None and eval_every != "auto":
        eval_every = check_float("eval_every", eval_every, min_value=0.0, exclude_min=True,
                                 fix=f'{time_unit} between loss evaluations, "auto" or None')
    if not isinstance(keep_params, bool):
        raise InvalidType(f"keep_params={keep_params!r} must be a bool")
    out = check_out(out)
    check_choice("events", events, EVENTS)
    from hogkit.engine.step import LANES
    check_choice("lane", lane, LANES)
    from hogkit.engine.replication import check_with_policy, parse_replication
    replication = parse_replication(replication)
    check_with_policy(replication, policy, shards)
    return RunPlan(workload=wl, workers=workers, policy=policy, rule=rule, density=density,
                   batch=batch, global_batch=global_batch, epoch_steps=epoch_steps,
                   steps=steps, seconds=seconds, seed=seed, nonfinite=nonfinite,
                   stragglers=stragglers, eval_every=eval_every, shards=shards,
                   out=out, keep_params=keep_params, events=events, lane=lane,
                   replication=replication)


# --------------------------------------------------------------------------- pieces

def resolve_workload(workload, options, *, need_lr=True, need_batch=True, spawn=False):
    """A workload object from a registry name (with ``options``) or an object that
    follows the Workload contract (checked: ``need_lr`` / ``need_batch`` when its
    default lr / batch will be used)."""
    from hogkit import workloads
    if isinstance(workload, str):
        return workloads.get(workload, **(options or {}))
    if options:
        raise InvalidArgument("workload_options only apply when workload is given by name")
    from hogkit.workloads.base import check_workload
    return check_workload(workload, need_lr=need_lr, need_batch=need_batch, spawn=spawn)


def check_out(out):
    """``out`` as a str, checked without creating anything: an existing folder, or a
    path whose nearest existing parent is a folder this process may write in."""
    import os
    import tempfile
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
    """``(steps, seconds)`` checked: at least one given, steps a total over all workers."""
    if steps is None and seconds is None:
        raise InvalidArgument(f"give steps= (total iterations) or seconds= ({time_unit}), "
                              f"or both; the run stops at whichever comes first")
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
    if batch is None:
        return wl.default_batch, 0, 0
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
