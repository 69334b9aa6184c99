"""Where the workers' writes go: one shared copy of the model, or a replica per worker.

DimmWitted (Zhang and Ré, 2014) names the choice *model replication*: PerMachine (one
copy every core writes: Hogwild!) or PerCore (a replica per core, merged now and then).
On a model whose every step writes a large share of its cache lines (``logreg``'s 80 kB
vector with Zipf features, a small dense model), a shared copy turns every write into
a cache-line transfer between cores, and two workers ran at 0.39-0.46x one
(``benchmarks/RESULTS.md``, "Dense models"); replicas ran at 1.9-2.1x.

``replication=`` on :func:`hogkit.train` and :func:`hogkit.simulate`:

- ``"shared"`` (the default): every step writes the shared copy (Hogwild!);
- ``"worker"`` or ``"worker:K"``: each worker steps on its own replica and adds its
  change whole into the shared copy every K steps (default
  :data:`DEFAULT_MERGE_EVERY`), then pulls the shared copy back:
  ``shared += replica − base; replica = base = shared``. Every sample's update reaches
  the shared model at full weight, as under Hogwild!, written in bulk; between merges
  no two workers write one cache line;
- ``"auto"``: ``"worker"`` where it can run (two or more workers, the Async policy, a
  workload that is not a torch model) and two workers' concurrent steps both write at
  least :data:`AUTO_OVERLAP` of the model's 64-byte lines (:func:`write_overlap`,
  measured on a few steps of the workload before the run), else ``"shared"``.

Replicas buy samples a second, not always loss: each merge adds a phase's change made
from a base the other replicas' changes also start from, so on weights every worker
moves (logreg's hot features) the sum overshoots by up to W times the step a single
worker would take. On logreg at its default lr (2), merges every 16 steps held the
loss; every 64 steps it blew up in some seeds (``benchmarks/RESULTS.md``).

The staleness record under ``"worker"``: a merge adds the K steps of its phase to the
worker's update counter, so the gap recorded at a merge counts the *updates* (steps)
other workers merged into the shared copy since this replica was pulled: what the
phase's steps did not see, the largest gap any step of the phase had. One record per
merge (a step inside a phase reads only its own replica).

The local phase itself (a replica, its merges) is the machinery of
:class:`~hogkit.policy.LocalSGD` (:mod:`hogkit.engine.local_phase`); :func:`local_plan`
says, for a policy and a replication together, whether a worker keeps a replica and how
it merges, so the live worker, the step core and the simulator ask one place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.validation import check_int

__all__ = ["Replication", "LocalPlan", "parse_replication", "local_plan", "resolve_auto",
           "write_overlap", "REPLICATIONS", "DEFAULT_MERGE_EVERY", "AUTO_OVERLAP"]

#: the spellings ``replication=`` takes
REPLICATIONS = ("shared", "worker", "worker:K", "auto")
#: steps between a replica's merges when "worker" names no K: on logreg at its default
#: lr, 16 held the loss in every seed where 64 blew up in some (benchmarks/RESULTS.md)
DEFAULT_MERGE_EVERY = 16
#: "auto" takes replicas when two workers' concurrent steps both write at least this
#: share of the model's 64-byte lines (:func:`write_overlap`). Measured
#: (``benchmarks/dense_replication.json``): logreg 0.25-0.26 and 0.61 with uniform
#: features, mf's hot preset in the sweep 0.83, where replicas ran 1.3-1.5x one worker
#: and the shared copy 0.4-0.7x; mf's hot preset in the block order 0.005-0.098, where
#: the shared copy ran faster (1.48x against 1.31x)
AUTO_OVERLAP = 0.15


@dataclass(frozen=True)
class Replication:
    """A replication choice: ``mode`` "shared" | "worker" | "auto", and for the
    replicas the steps between merges."""

    mode: str = "shared"
    merge_every: int = DEFAULT_MERGE_EVERY

    @property
    def replicas(self) -> bool:
        return self.mode == "worker"

    def config(self) -> dict:
        if self.mode == "shared":
            return {"mode": "shared"}
        return {"mode": self.mode, "merge_every": self.merge_every}

    def __str__(self):
        return "shared" if self.mode == "shared" else f"{self.mode}:{self.merge_every}"


def parse_replication(value) -> Replication:
    """A :class:`Replication` from ``"shared"``, ``"worker"``, ``"worker:K"``,
    ``"auto"``, ``"auto:K"`` (K: the merge period if auto picks replicas) or a
    Replication."""
    if isinstance(value, Replication):
        value = str(value) if value.mode == "shared" else f"{value.mode}:{value.merge_every}"
    if not isinstance(value, str):
        raise InvalidType(f"replication={value!r} must be a string: one of {REPLICATIONS}")
    mode, sep, k = value.strip().partition(":")
    if mode not in ("shared", "worker", "auto") or (mode == "shared" and sep):
        raise InvalidArgument(f"replication={value!r}: expected one of {REPLICATIONS} "
                              f"(shared: one copy every worker writes, Hogwild!; worker: a "
                              f"replica per worker merged into it every K steps)")
    if not sep:
        return Replication(mode)
    try:
        every = int(k)
    except ValueError:
        raise InvalidArgument(f"replication={value!r}: K must be a whole number of steps "
                              f"between merges, e.g. 'worker:256'") from None
    return Replication(mode, check_int("replication's merge period K", every, min_value=1,
                                       fix="use worker:1 to merge after every step"))


def check_with_policy(replication: Replication, policy, shards: int) -> None:
    """Refuse, naming the fix, the combinations replicas do not run with ("auto" never
    refuses: it keeps the shared copy there, :func:`resolve_auto`)."""
    if replication.mode != "worker":
        return
    if getattr(policy, "local_steps", 0):
        raise InvalidArgument(f"replication={str(replication)!r} with policy={policy!r}: "
                              f"local SGD already keeps a replica per worker; use one of "
                              f"them (LocalSGD(h, merge='sum') is replication='worker:h' "
                              f"with a merge counted as one update)")
    if not _is_async(policy):
        raise InvalidArgument(f"replication='worker' with policy={policy!r}: a replica's "
                              f"steps reach the others only at its merges, so a bound on "
                              f"clock lag would not bound what a read misses; use the "
                              f"Async policy with replicas, or replication='shared'")
    if shards != 1:
        raise InvalidArgument(f"replication={str(replication)!r} with shards={shards}: a "
                              f"merge writes every shard; use shards=1")


def _is_async(policy) -> bool:
    from hogkit.policy import Async
    return type(policy) is Async


@dataclass(frozen=True)
class LocalPlan:
    """A worker's replica and its merges: ``h`` steps a phase, a merge adds
    ``(replica − base) / divisor``, ``overlap`` (LocalSGD's), and ``count_steps``: a
    merge adds its phase's steps to the update counter (replication) or one (LocalSGD)."""

    h: int
    divisor: int
    overlap: bool = False
    count_steps: bool = False
    cost: float = 0.0           # a merge takes cost x its phase's wall time (LocalSGD)

    def merges_after(self, step) -> bool:
        """True when iteration ``step`` (0-based) ends a phase."""
        return (step + 1) % self.h == 0


def local_plan(policy, replication, workers):
    """The :class:`LocalPlan` of a run, or None when every step writes the shared copy:
    LocalSGD's phases, or the replicas of ``replication="worker"``."""
    h = int(getattr(policy, "local_steps", 0) or 0)
    if h:
        f = getattr(policy, "merge_divisor", None)
        return LocalPlan(h, int(f(workers)) if f is not None else workers,
                         bool(getattr(policy, "overlap", False)),
                         cost=float(getattr(policy, "cost", 0.0) or 0.0))
    if replication is not None and replication.replicas:
        return LocalPlan(int(replication.merge_every), 1, False, True)
    return None


def _lines(params, grads) -> np.ndarray:
    """The 64-byte lines (numbered across the parameters in name order) ``grads``
    write: a sparse gradient its rows' lines, a dense one all of its parameter's."""
    out, offset = [], 0
    for name in sorted(params):
        p = params[name]
        n = max(1, -(-int(p.nbytes) // 64))
        for g in grads:
            if g.name != name:
                continue
            if g.rows is None:
                out.append(offset + np.arange(n))
                continue
            width = p.itemsize * int(np.prod(p.shape[1:], dtype=np.int64))
            rows = np.unique(np.asarray(g.rows, np.int64))
            first, last = (rows * width) // 64, (rows * width + width - 1) // 64
            span = int((last - first).max(initial=0)) + 1
            lines = first[:, None] + np.arange(span)[None, :]
            out.append(offset + lines[lines <= last[:, None]])
        offset += n
    return np.unique(np.concatenate(out)) if out else np.zeros(0, np.int64)


def write_overlap(workload, params, data, batch, *, seed=0, steps=8) -> float:
    """The median share of the model's 64-byte lines that two workers' concurrent
    steps of ``batch`` samples both write: the lines that would travel between their
    cores on a shared copy. Workers 0 and 1 each take ``steps`` steps of the workload's
    gradient on private copies (their own sampling: a block order's workers write
    disjoint rows); nothing shared is touched."""
    total = sum(max(1, -(-int(v.nbytes) // 64)) for v in params.values())
    walks = []
    for rank in (0, 1):
        scratch = {k: np.array(v, copy=True) for k, v in params.items()}
        ctx = workload.setup(scratch, data, rank=rank, seed=seed)
        rng = np.random.default_rng([seed, rank])
        walks.append([_lines(scratch, workload.gradient(ctx, rng, batch, keep_read=False))
                      for _ in range(steps)])
    shares = [len(np.intersect1d(a, b, assume_unique=True)) / total
              for a, b in zip(*walks)]
    return float(np.median(shares))


def resolve_auto(plan, params, data):
    """``(plan, config or None)``: ``plan`` with ``replication="auto"`` decided on the
    built model, and what was measured, for the run's config. Replicas where they can
    run (two or more workers, Async, one shard, no LocalSGD), the workload is not a torch
    model (a torch model's step is compute: ``mlp`` ran faster on the shared copy) and two
    workers' steps both write at least :data:`AUTO_OVERLAP` of the model's lines
    (:func:`write_overlap`); else the shared copy."""
    rep = plan.replication
    if rep is None or rep.mode != "auto":
        return plan, None
    overlap = None
    if (plan.workers >= 2 and _is_async(plan.policy) and plan.shards == 1
            and not getattr(plan.workload, "needs_torch", False)):
        overlap = write_overlap(plan.workload, params, data, plan.worker_batch(),
                                seed=plan.seed)
    mode = "worker" if overlap is not None and overlap >= AUTO_OVERLAP else "shared"
    chosen = Replication(mode, rep.merge_every)
    return (dataclasses.replace(plan, replication=chosen),
            {**chosen.config(), "chosen_by": "auto",
             "write_overlap": None if overlap is None else round(overlap, 4)})
