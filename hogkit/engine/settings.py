"""The knobs that travel together, as three small objects a user builds once and reuses.

The front doors (``train``, ``simulate``, ``hogkit.cluster.train``, ``spawn``) take the
training's own knobs by name (workload, workers, policy, rule, density, batch, the
budget, seed) and group the rest:

- :class:`Workers`: the worker processes (or a simulation's virtual workers): how many,
  how fast (stragglers; the simulator's step times) and how they are supervised
  (timeouts, grace, restarts). ``workers=4`` is ``Workers(4)``.
- :class:`Engine`: how the steps run: the step engine (``"auto"`` | ``"compiled"`` |
  ``"python"``, one vocabulary for live runs and the simulator), the lane, replicas,
  per-shard clocks, what a non-finite update does, the simulator's rule state.
  ``engine="python"`` is ``Engine("python")``.
- :class:`Outputs`: what a run writes and keeps: the results folder, the events file,
  checkpoints, a resume, loss evaluations, the progress display, the final
  parameters. ``outputs="runs/x"`` is ``Outputs("runs/x")``.

Each checks its fields when it is made (the value, the constraint, the fix), and is a
frozen dataclass: equal settings are equal objects, and ``dataclasses.replace`` makes a
variant. A field that applies to one kind of run only (``delays`` to the simulator,
``on_failure`` to a live run) is refused by the others, by name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Optional

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.parse import parse_delays, parse_stragglers
from hogkit.validation import check_choice, check_float, check_int

__all__ = ["Workers", "Engine", "Outputs", "ENGINES", "LANES", "EVENTS"]

#: ``Engine.kind``: the compiled step core wherever it can run the knobs ("auto"), it
#: or a refusal ("compiled"), or the Python reference step ("python")
ENGINES = ("auto", "compiled", "python")
#: ``Engine.lane``: "batch" (the exact minibatch step), "sample" (per-sample Hogwild!:
#: each sample's update applied at once, on the compiled core), "auto" (the workload's
#: default lane where the run allows it, else "batch")
LANES = ("auto", "batch", "sample")
#: ``Outputs.events``: which updates a live run writes to ``events.jsonl`` ("sampled":
#: at most ``plan.EVENTS_FILE_PER_S`` a second, evenly spread; the histograms count
#: every update whatever this says)
EVENTS = ("sampled", "all", "none")


def _default_fields(obj) -> dict:
    """``{field: value}`` of the fields of ``obj`` that differ from their defaults."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)
            if getattr(obj, f.name) != f.default}


def _set(obj, name, value):
    object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class Workers:
    """The workers: ``n`` processes (or virtual workers in :func:`hogkit.simulate`).

    stragglers : ``{rank: delay model}`` (:mod:`hogkit.engine.delays`: ``Slowdown``,
        ``Pauses``, ``Load``) or their string forms (``"1:3"``: worker 1 three times
        slower); slows those workers down, live and simulated.
    delays : the simulator's step times: ``None`` (``Constant(1e-3)``), a string
        (``"lognormal:1e-3:0.5"``) or a model of :mod:`hogkit.engine.delays`;
        simulated runs only.
    wait_timeout : seconds a policy wait, the start barrier or a silent worker may take
        before the run fails; ``grace``: seconds between the stop flag, SIGTERM and
        SIGKILL.
    on_failure : ``"stop"`` (the first worker that dies ends the run) or ``"restart"``
        (a dead worker is replaced, at most ``max_restarts`` times); live runs.
    """

    n: int = 2
    stragglers: Optional[object] = None
    delays: Optional[object] = None
    wait_timeout: float = 60.0
    grace: float = 2.0
    on_failure: str = "stop"
    max_restarts: int = 3

    def __post_init__(self):
        _set(self, "n", check_int("workers", self.n, min_value=1,
                                  fix="use workers=1 for a sequential baseline"))
        if self.stragglers is not None:
            got = parse_stragglers(self.stragglers)
            if not isinstance(got, Mapping):
                raise InvalidType(f"stragglers={self.stragglers!r} must be a dict "
                                  f"{{rank: delay model}} or strings such as '1:3'")
            _set(self, "stragglers", dict(got) or None)
        if isinstance(self.delays, str):
            parse_delays(self.delays)                 # checked now; read by simulate()
        _set(self, "wait_timeout", check_float("wait_timeout", self.wait_timeout,
                                               min_value=0.0, exclude_min=True))
        _set(self, "grace", check_float("grace", self.grace, min_value=0.0))
        check_choice("on_failure", self.on_failure, ("stop", "restart"))
        _set(self, "max_restarts", check_int("max_restarts", self.max_restarts,
                                             min_value=0))

    def __hash__(self):
        return hash((self.n, repr(self.stragglers), repr(self.delays)))

    @classmethod
    def of(cls, value) -> "Workers":
        """``value`` as :class:`Workers`: itself, or an int (the count)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidType(f"workers={value!r} must be an int (how many) or "
                              f"hogkit.Workers(n, ...)")
        return cls(value)

    def refuse(self, *names, where):
        """Refuse the fields ``names`` where they do not apply (``where``: the front
        door), naming them."""
        got = [n for n in names if n in _default_fields(self)]
        if got:
            raise InvalidArgument(f"Workers({got[0]}=...) does not apply to {where}; drop "
                                  f"it")


@dataclass(frozen=True)
class Engine:
    """How the steps run.

    kind : ``"auto"`` (the compiled step core wherever it can run the workload and
        knobs, else the Python step with a one-line notice), ``"compiled"`` (refuse
        what it cannot run) or ``"python"`` (the reference); the same words for live
        runs and the simulator (whose compiled engine runs the step core's halves
        inside its event loop). The summary says which ran.
    lane : ``"auto"`` (the workload's default lane where the knobs allow it, else
        "batch"), ``"batch"`` (the exact minibatch step) or ``"sample"`` (per-sample
        Hogwild! on the compiled core; a batch-mean workload steps ``lr / batch`` per
        sample); the simulator models whole steps (the batch lane).
    replication : ``"shared"`` (one copy, Hogwild!), ``"worker[:K]"`` (a replica per
        worker, its change added every K=16 steps; Async) or ``"auto"``.
    shards : per-shard staleness: with S > 1 a sparse update's gap counts only others'
        updates to its S row ranges (the Python step).
    nonfinite : ``"raise"`` (the run stops with the worker's rank and step) or ``"skip"``
        (the update is dropped and counted); nothing non-finite reaches the parameters.
    rule_state : the simulator's ``"worker"`` (each worker's own) or ``"shared"`` (one
        state, a parameter server's); None: as a live run keeps it (the rule's
        ``shared_state``). Simulated runs only.
    """

    kind: str = "auto"
    lane: str = "auto"
    replication: str = "shared"
    shards: int = 1
    nonfinite: str = "raise"
    rule_state: Optional[str] = None

    def __post_init__(self):
        if self.kind == "fused":
            raise InvalidArgument("engine='fused' is spelled engine='compiled' now (one "
                                  "word for the compiled step core, live and simulated)")
        check_choice("engine", self.kind, ENGINES)
        check_choice("lane", self.lane, LANES)
        _set(self, "shards", check_int("shards", self.shards, min_value=1,
                                       max_value=1 << 16,
                                       fix="use shards=1 for one global update counter"))
        check_choice("nonfinite", self.nonfinite, ("raise", "skip"))
        if self.rule_state is not None:
            check_choice("rule_state", self.rule_state, ("worker", "shared"))

    @classmethod
    def of(cls, value) -> "Engine":
        """``value`` as :class:`Engine`: itself, None (the defaults) or a kind."""
        if isinstance(value, cls):
            return value
        if value is None:
            return cls()
        if isinstance(value, str):
            return cls(value)
        raise InvalidType(f"engine={value!r} must be 'auto', 'compiled', 'python' or "
                          f"hogkit.Engine(...)")


@dataclass(frozen=True)
class Outputs:
    """What a run writes and keeps.

    folder : ``summary.json``, ``events.jsonl``, ``loss.csv``, plots and
        ``checkpoint.npz`` go here; None writes nothing.
    events : what ``events.jsonl`` keeps of the staleness events: ``"sampled"`` (at
        most 400 a second, evenly spread), ``"all"``, ``"none"``; the histograms and
        the summary count every update.
    checkpoint_every : seconds between fuzzy checkpoints; "auto": 60 with a folder;
        None: only the quiesced one at the end.
    resume : the results folder of an earlier run of the same workload, options,
        workers and shards: go on from its checkpoint with the budget that is left;
        results go there unless ``folder`` is given.
    eval_every : seconds between loss evaluations (wall seconds live, virtual
        simulated); "auto": every 0.5 s live, ``evals`` points evenly spaced in updates
        simulated; None: only at the start and the end.
    progress : a progress display (None: when stderr is a terminal; ``"lines"``: one
        line per stage); ``keep_params``: the final parameters in ``Run.params``.
    """

    folder: Optional[str] = None
    events: str = "sampled"
    checkpoint_every: object = "auto"
    resume: Optional[str] = None
    eval_every: object = "auto"
    evals: int = 20
    progress: object = None
    keep_params: bool = True

    def __post_init__(self):
        for name in ("folder", "resume"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, (str, os.PathLike)):
                raise InvalidType(f"{'out' if name == 'folder' else name}={v!r} must be a "
                                  f"folder path (str or os.PathLike) or None")
            if v is not None:
                _set(self, name, os.fspath(v))
        check_choice("events", self.events, EVENTS)
        if self.checkpoint_every not in ("auto", None):
            _set(self, "checkpoint_every", check_float(
                "checkpoint_every", self.checkpoint_every, min_value=0.0, exclude_min=True,
                fix='seconds, "auto" or None'))
        if self.eval_every not in ("auto", None):
            _set(self, "eval_every", check_float(
                "eval_every", self.eval_every, min_value=0.0, exclude_min=True,
                fix='seconds between loss evaluations, "auto" or None'))
        _set(self, "evals", check_int("evals", self.evals, min_value=1))
        if not isinstance(self.keep_params, bool):
            raise InvalidType(f"keep_params={self.keep_params!r} must be a bool")

    @classmethod
    def of(cls, value) -> "Outputs":
        """``value`` as :class:`Outputs`: itself, None (write nothing) or a folder."""
        if isinstance(value, cls):
            return value
        if value is None:
            return cls()
        if isinstance(value, (str, os.PathLike)):
            return cls(os.fspath(value))
        raise InvalidType(f"outputs={value!r} must be a folder path, None or "
                          f"hogkit.Outputs(...)")

    @property
    def checkpoint_seconds(self) -> Optional[float]:
        """Seconds between fuzzy checkpoints, or None: "auto" is 60 with a folder."""
        if self.checkpoint_every == "auto":
            return 60.0 if self.folder is not None or self.resume is not None else None
        if self.checkpoint_every is not None and self.folder is None and \
                self.resume is None:
            raise InvalidArgument("checkpoint_every needs a results folder "
                                  "(hogkit.Outputs(folder, checkpoint_every=...))")
        return self.checkpoint_every
