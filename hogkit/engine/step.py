"""The step, written once, run by two engines.

A step is ``read clocks → gradient → guard → density → gap → rule → tick → record``
(the policy admits it first; a straggler's pacing follows it). Two implementations
of that one definition exist, and they compute the same numbers:

- :class:`CompiledStep` drives the compiled step core (``hogkit.kernels.step``): many
  whole steps per call, for workloads whose gradient is a numba kernel (``mf``,
  ``logreg``, a user's own compiled workload). It is the default wherever it can run.
- :class:`PythonStep` is the reference: the same pieces called one by one from
  Python (the workload's ``gradient``, ``Density.filter``, ``rule.apply``, the
  ``Reader``), for torch workloads and for knobs the core does not run (per-shard
  staleness, adaptive batch sizes).

Both encode the knobs the same way (:func:`encode_rule`, :func:`encode_density`),
call the same rule and density kernels, and the workloads' Python ``gradient`` calls
the very kernels the core inlines; so for one worker both paths draw the same samples,
record the same staleness and end with the same parameters
(``tests/test_step.py``). The simulator reuses them too: its fused engine calls the
core's ``begin``/``end`` halves, its general engine the :class:`PythonStep` halves.

:func:`compiled_support` says whether the compiled engine can run a combination of
knobs (and why not), so ``train`` can fall back with a one-line notice.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping

import numpy as np

from hogkit.errors import EngineNotice, InvalidArgument, user_stacklevel
from hogkit.kernels import clock as _kc
from hogkit.kernels import guard as _kg
from hogkit.kernels import density as _kd
from hogkit.kernels import layout as _kl
from hogkit.kernels import step as _ks
from hogkit.rules.base import Rule
from hogkit.validation import check_array, check_choice
from hogkit.workloads.base import as_rows

__all__ = ["CompiledStep", "PythonStep", "compiled_support", "choose_engine", "lane_support",
           "resolve_lane", "lane_lr_scale", "LANES", "ENGINES", "encode_rule",
           "encode_density", "encode_pacer"]

#: ``lane=``: "batch" (the exact minibatch step), "sample" (per-sample Hogwild!: each
#: sample's update applied at once, on the compiled core), "auto" (the workload's
#: ``default_lane`` where the run allows it, else "batch")
LANES = ("auto", "batch", "sample")
#: ``engine=``: "auto" (the compiled step core where it can run the knobs), "compiled",
#: "python" (the reference), for live runs and the simulator alike
ENGINES = ("auto", "compiled", "python")


# --- which engine can run what ---------------------------------------------------------

def compiled_support(workload, *, rule, density, batch, shards=1, policy=None,
                     stragglers=None) -> str | None:
    """None when the compiled step core can run this combination, else the reason
    (one line, for the fallback notice)."""
    if not callable(getattr(workload, "compiled", None)):
        return f"workload {getattr(workload, 'name', workload)!r} has no compiled part"
    if getattr(workload, "needs_torch", False):
        return f"workload {workload.name!r} computes its gradient with torch"
    if type(workload).compiled is _base_compiled():
        return f"workload {getattr(workload, 'name', workload)!r} has no compiled part"
    if not isinstance(batch, (int, np.integer)):
        return f"batch={batch!r} (adaptive batch sizes run on the Python path)"
    if shards != 1:
        return f"shards={shards} (per-shard staleness runs on the Python path)"
    if not isinstance(rule, Rule):
        return f"rule {rule!r} is not a hogkit rule (hogkit.rules.base.Rule)"
    if density is not None and not hasattr(density, "code"):
        return f"density {density!r} is not a hogkit.Density"
    if policy is not None and not callable(getattr(policy, "encode", None)):
        return (f"policy {policy!r} does not encode itself (hogkit.policy.Policy): its "
                f"wait() runs in Python")
    for r, model in (stragglers or {}).items():
        if getattr(model, "pacer", None) is None:
            return f"straggler model {model!r} has no compiled pacer"
    return None


def choose_engine(engine, wl, *, rule, density, batch, shards=1, policy=None,
                  stragglers=None):
    """``"compiled"`` or ``"python"`` for ``engine`` = "auto" | "compiled" | "python":
    "auto" takes the compiled step core when it can run the knobs and says in one line
    (a :class:`~hogkit.errors.EngineNotice` warning, at the caller's line outside
    hogkit) why not when it cannot."""
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
                      stacklevel=user_stacklevel())
    return "python"


def lane_support(workload, *, rule, density, batch, shards=1, engine="compiled"):
    """None when the per-sample lane can run this combination, else the reason (one
    line). The lane runs on the compiled core only; it applies each sample at once, so
    knobs defined on a whole step's update (density, per-shard staleness, adaptive
    batches) and a rule that scales by the update gap (staleness-aware: a sample's own
    gap is ~0, and the core reads the clocks once per step) do not apply."""
    if engine != "compiled":
        return (f"engine={engine!r} (the per-sample lane runs on the compiled step core)")
    if density is not None:
        return ("density thins a whole step's update; the per-sample lane applies each "
                "sample at once")
    if not isinstance(batch, (int, np.integer)):
        return f"batch={batch!r} (adaptive batch sizes run on the batch lane)"
    if shards != 1:
        return f"shards={shards} (per-shard staleness is measured per step)"
    if getattr(rule, "gap_scaled", False):
        return (f"rule {type(rule).__name__} scales each update by its gap, which the "
                f"per-sample lane does not measure per sample")
    return None


def resolve_lane(lane, workload, *, rule, density, batch, shards=1, engine="compiled"):
    """``"batch"`` or ``"sample"`` for ``lane`` (one of :data:`LANES`): "auto" is the
    workload's ``default_lane`` where :func:`lane_support` allows it; "sample" is
    refused with the reason when it does not."""
    check_choice("lane", lane, LANES)
    only = getattr(workload, "needs_lane", None)     # e.g. logreg's lock baselines
    why = lane_support(workload, rule=rule, density=density, batch=batch, shards=shards,
                       engine=engine) if lane != "batch" or only else None
    if only and (lane == "batch" or why is not None):
        raise InvalidArgument(f"lane={lane!r} cannot run this: {only}" +
                              (f" (here: {why})" if why else ""))
    if lane == "batch":
        return "batch"
    if lane == "sample" and why is not None:
        raise InvalidArgument(f"lane='sample' cannot run this: {why}; use lane='batch' (the "
                              f"exact minibatch step) or drop that setting")
    if lane == "auto" and (why is not None
                           or getattr(workload, "default_lane", "batch") != "sample"):
        return "batch"
    return "sample"


def lane_lr_scale(plan) -> float:
    """What the per-sample lane multiplies the lr by: ``1 / batch`` for a workload whose
    gradient is a batch mean (its lr is a step's; a sample then steps its share), else 1."""
    if plan.lane != "sample" or getattr(plan.workload, "grad_reduction", "mean") != "mean":
        return 1.0
    return 1.0 / int(plan.batch)


def _base_compiled():
    from hogkit.workloads.base import Workload
    return Workload.compiled


# --- encodings shared by both engines -------------------------------------------------

def _empty_rows(p):
    return np.empty((0, p.shape[1]), p.dtype)


def encode_rule(rule, state, names, params2d, *, clock_fresh=False, shared=False):
    """The core's :class:`~hogkit.kernels.layout.RuleArgs` from a rule and its ``init``
    state: its kernels' configuration, per parameter (in ``names`` order) its 2-D
    state views, empty where unused; ``K`` the step counts (a fresh array: the core
    keeps its own). The state is checked here, once: the kernels do no checking. A
    per-row first state (``rule.state.per_row``: row-wise AdaGrad, RMSProp) is
    ``(rows, 1)``.

    ``clock_fresh``: every writer of the parameters ticks the update clock the core
    reads (the simulator; one machine's workers, not a cluster node, whose agent
    writes the other nodes' rows untold), so a step whose gap is 0 is fresh and
    DC-ASGD and Gap-Aware need not measure their gaps (``kernels.step.apply_update``).
    ``shared``: the state is every worker's (the rule's update count ``t`` then counts
    every worker's updates, else the worker's own)."""
    spec = rule.state
    s1n, s2n, has_k = spec.first, spec.second, spec.counts

    def slot(name, n, p, one_column=False):
        key = f"{name}/{n}"
        a = state.get(key) if isinstance(state, Mapping) else None
        if a is None:
            raise InvalidArgument(f"the rule state has no {key!r}; build it with "
                                  f"rule.init(params) for the same parameters")
        check_array(f"state[{key!r}]", a, dtype=p.dtype, min_ndim=1, writeable=True)
        a2 = as_rows(a)
        want = (p.shape[0], 1) if one_column else p.shape
        if a2.shape != want:
            raise InvalidArgument(f"state[{key!r}] has shape {a.shape}, parameter {n!r} "
                                  f"{p.shape} (as rows) needs {want}; build the state "
                                  f"with rule.init(params) for the same parameters")
        return a2

    S1 = tuple(slot(s1n, n, p, spec.per_row) if s1n else _empty_rows(p)
               for n, p in zip(names, params2d))
    S2 = tuple(slot(s2n, n, p) if s2n else _empty_rows(p) for n, p in zip(names, params2d))
    K = np.zeros(len(names), np.int64)
    if has_k:
        for i, n in enumerate(names):
            k = state.get(f"k/{n}") if isinstance(state, Mapping) else None
            K[i] = int(check_array(f"state['k/{n}']", k, dtype=np.int64, shape=(1,))[0])
    return _kl.RuleArgs(rule.kernel_cfg(), S1, S2, K, bool(clock_fresh), bool(shared))


def encode_density(density, state, names, params2d, capacity_rows):
    """The core's :class:`~hogkit.kernels.layout.DensityArgs`; ``density=None`` sends
    everything. ``mask`` has room for the largest gradient."""
    mask = np.empty(max([r * p.shape[1] for r, p in zip(capacity_rows, params2d)] + [1]),
                    np.bool_)
    if density is None:
        return _kl.DensityArgs(_kl.DensityCfg(_kd.NONE, 1.0, 0.0, False, 1, 0),
                               tuple(_empty_rows(p) for p in params2d), mask)
    D = tuple(as_rows(state[f"r/{n}"]) if density.residual else _empty_rows(p)
              for n, p in zip(names, params2d))
    cfg = _kl.DensityCfg(int(density.code), float(density.fraction),
                         float(density.threshold or 0.0), bool(density.residual),
                         int(density.every), int(density.seed))
    return _kl.DensityArgs(cfg, D, mask)


def encode_pacer(model, seed, rank):
    """``(pacer, prng)`` for the core: a straggler model's ``pacer()`` row
    ``[kind, a, b, t0_ns]`` and its private generator (the one its Python pacer
    draws from), or the no-op pacer."""
    prng = np.random.default_rng([seed, rank, 0x5EED])
    if model is None:
        return np.zeros(4), prng
    p = np.asarray(model.pacer(), np.float64).copy()
    p[3] = time.monotonic_ns()
    return p, prng


# --- the compiled engine ----------------------------------------------------------------

class CompiledStep:
    """One worker's compiled steps over shared memory.

    ``ctx``: the workload's :class:`~hogkit.workloads.base.KernelCtx` (parameter views,
    buffers, sampler cursor); ``slots``, ``rt``, ``stop``: the control arrays;
    ``log``: the :class:`~hogkit.state.reader.StalenessLog` arrays. ``policy``: a
    :class:`~hogkit.policy.Policy` (None: Async), read through its contract: its
    ``encode()`` row (``pol``), ``timing`` and ``local_steps`` (``local_h`` overrides
    it: the run's :attr:`~hogkit.engine.plan.RunPlan.local` phase); ``adm`` is this worker's
    admission state and ``grants`` its histogram row of DSSP grants
    (``hogkit.kernels.clock.admit``). ``params2d`` overrides the parameters written.
    ``merge`` = ``(shared, base, divisor, count_steps)``: a local phase (the parameters
    are the replica) merged in the core every ``local_h`` steps (:func:`_merge_views`;
    the driver keeps ``io``'s phase read in step with its reader).
    :meth:`run` returns the core's code and leaves what happened in
    ``cfg``/``io``/``rt``/``adm``.
    """

    def __init__(self, ctx, *, rank, batch, rule, rule_state, density, density_state,
                 slots, rt, stop, log, rng, policy=None, grants=None, quota=-1,
                 nonfinite="raise", record=True, stride=1, pacer=None, params2d=None,
                 step0=0, lane="batch", lane_lr_scale=1.0, local_h=None, merge=None,
                 clock_fresh=False, shared_state=False):
        self.ctx = ctx
        ctx.grow(batch) if batch > ctx.capacity else None
        self.params = tuple(params2d) if params2d is not None else ctx.params
        caps = [int(g.shape[0]) for g in ctx.G]
        if lane == "sample" and lane_lr_scale != 1.0:   # a batch-mean workload's lr
            rule = rule.scaled(lane_lr_scale)
        self.rule = encode_rule(rule, rule_state, ctx.names, self.params,
                                clock_fresh=clock_fresh, shared=shared_state)
        self.dens = encode_density(density, density_state, ctx.names, self.params, caps)
        if grants is None:
            grants = np.zeros(_kc.GRANT_BINS, np.int64)
        if policy is None:
            from hogkit.policy import Async
            policy = Async()
        self.pol = policy.encode()
        self.adm = _kc.admission_state()
        local_h = int(policy.local_steps) if local_h is None else int(local_h)
        self.ctl = (slots, rt, stop, self.pol, self.adm, grants)
        self.log = log
        self.rng = rng if ctx.parts.uses_rng else None
        self.pacer, self.prng = pacer if pacer is not None else encode_pacer(None, 0, rank)
        cfg = np.zeros(_kl.NCFG, np.int64)
        cfg[_kl.ME] = rank
        cfg[_kl.BATCH] = batch
        cfg[_kl.KEEP_READ] = int(bool(getattr(rule, "needs_read", False)))
        cfg[_kl.SKIP] = int(nonfinite == "skip")
        cfg[_kl.STRIDE] = stride
        cfg[_kl.LOCAL_H] = local_h
        cfg[_kl.QUOTA] = quota
        cfg[_kl.TIMING] = int(bool(policy.timing))
        cfg[_kl.RECORD] = int(record)
        cfg[_kl.STEP0] = step0
        # the fused SGD kernel, where the workload has one and the step is plain SGD
        cfg[_kl.FUSED] = int(ctx.sgd is not None and rule.plain_sgd
                             and self.dens.cfg.how == _kd.NONE and self.dens.cfg.every == 1
                             and local_h == 0)
        if lane == "sample":
            cfg[_kl.FUSED] = 0
            cfg[_kl.LANE] = (_kl.LANE_FUSED if _fused_lane(ctx, rule) else
                             _kl.LANE_SAMPLE)
        self.cfg = cfg
        if cfg[_kl.FUSED]:
            ctx.use_fused_scratch()
        self.io = np.zeros(_kl.NIO, np.int64)
        self.local = _merge_views(self.params, merge, cfg)
        cached = _ks.cacheable(type(ctx.parts.arrays))
        if cfg[_kl.LANE] == _kl.LANE_FUSED:  # the workload's own lane: its own loop
            self._run = _ks.run_lane_steps if cached else _ks.run_lane_steps_uncached
        else:
            self._run = _ks.run_steps if cached else _ks.run_steps_uncached

    def run(self, n):
        """Run up to ``n`` steps; returns the core's code (``hogkit.kernels.step``)."""
        ctx = self.ctx
        return self._run(n, ctx.parts.arrays, self.rng, ctx.cursor, self.params,
                         ctx.bufs(), self.rule, self.dens, self.ctl, self.log, self.cfg,
                         self.io, self.pacer, self.prng, self.local)

    @property
    def lane(self) -> str:
        """The lane that runs: "batch", "sample" (the generic per-sample lane) or
        "sample-fused" (the workload's own per-sample kernel)."""
        return {_kl.LANE_BATCH: "batch", _kl.LANE_SAMPLE: "sample",
                _kl.LANE_FUSED: "sample-fused"}[int(self.cfg[_kl.LANE])]

    @property
    def done(self) -> int:
        """Steps completed by the last :meth:`run`."""
        return int(self.io[_kl.IO_DONE])

    def release(self):
        """After a policy wait: the next step proceeds without a check (and drops a
        DSSP grant), as ``policy.wait`` returning does on the Python path."""
        self.adm[_kc.A_RELEASED] = 1



def _merge_views(params, merge, cfg):
    """The step core's ``local`` argument: per parameter a ``(shared, replica, base)``
    triple of flat views. ``merge`` = ``(shared, base, divisor, count_steps)`` (the
    local phase's arrays in ``params``' order, ``params`` the replica): the core merges
    each phase itself (``cfg[MERGE_CORE]``) when every array is C-contiguous, the
    triple of one dtype; else (and without ``merge``) ``()``, and the loop compiles
    without a merge (a run with one compiles its own loop, once per cache)."""
    if merge is None:
        return ()
    shared, base, divisor, count_steps = merge
    triples = tuple((s, p, b) for s, p, b in zip(shared, params, base))
    if not all(a.flags.c_contiguous and a.dtype == t[0].dtype for t in triples for a in t):
        return ()
    cfg[_kl.MERGE_CORE] = 1
    cfg[_kl.DIVISOR] = int(divisor)
    cfg[_kl.COUNT_STEPS] = int(bool(count_steps))
    return tuple(tuple(a.reshape(-1) for a in t) for t in triples)


def _fused_lane(ctx, rule):
    """True when the workload registered a per-sample kernel for this rule's
    configuration (``kernels.step.register``'s ``lane_kernels``)."""
    return type(rule.kernel_cfg()) in _ks.lane_rules(type(ctx.parts.arrays))


# --- the Python engine ----------------------------------------------------------------

class PythonStep:
    """One worker's steps, piece by piece (the reference path; see the module doc).

    :meth:`compute` is the first half (read the clock vector, gradient, guard),
    :meth:`apply` the second (density, gap, rule, tick, record): the simulator holds
    the result of one and calls the other later; the live loop calls them back to
    back. ``reader``: the worker's :class:`~hogkit.state.reader.Reader` (its clocks and log).

    **The lean lane.** For a compiled workload (its context a ``KernelCtx``) with a
    hogkit rule and a log, each half is one compiled call: ``compute`` runs
    ``kernels.step.python_begin`` (clock read, sample, gradient, guard) and returns
    ``grads=None`` (the gradient stays in the context's buffers); ``apply`` with
    ``grads=None`` runs ``kernels.step.python_end`` (gap, rule, tick, record) when the
    update goes to the parameters whole, and otherwise views the buffers as ``Grad``
    and takes the general path (density, adaptive-batch weights, per-shard clocks).
    A torch workload (a ``ModuleWorkload``'s context) with a hogkit rule and a log has
    a lean lane too (:class:`_TorchLane`): ``compute`` runs the workload's ``backward``
    and holds the module's ``.grad`` tensors as flat views (``grads=None``); ``apply``
    is one compiled call, ``kernels.step.dense_end`` (guard, gap, ``apply_flat`` on
    every parameter, tick, record), unless density, an adaptive-batch weight or a
    local step needs the ``Grad`` objects.
    Both lanes compute the same numbers: the same kernels, the same order.
    """

    def __init__(self, workload, ctx, *, rank, rule, rule_state, density, density_state,
                 reader, clocks, params, nonfinite="raise", shard_of=None, step0=0,
                 clock_fresh=False, shared_state=False):
        self.workload, self.ctx, self.rank = workload, ctx, rank
        self.step0 = step0          # density's step index goes on across resumed segments
        self.rule, self.rule_state = rule, rule_state
        self.density, self.density_state = density, density_state
        self.reader, self.clocks = reader, clocks
        self.params = params
        self.nonfinite = nonfinite
        self.keep_read = bool(getattr(rule, "needs_read", False))
        self.shard_of = shard_of
        self.shared_state = shared_state
        self._lane = _lane(workload, ctx, rule, rule_state, reader, params, self.keep_read,
                           clock_fresh, shared_state)

    def compute(self, rng, batch, *, read=True):
        """Read the clock vector (unless ``read=False``: a local-SGD phase reads at
        its pull) and compute a gradient; returns ``(grads, finite)`` (``grads`` is
        None on the lean lane: the gradient is in the context's buffers, or a torch
        module's ``.grad``)."""
        lane = self._lane
        if lane.__class__ is _TorchLane:
            if read:
                self.reader.read()
            ps = self.workload.backward(self.ctx, rng, batch, keep_read=self.keep_read)
            if lane.take(ps):
                return None, lane.finite()
            grads = self.workload.grads_of(self.ctx, ps, keep_read=self.keep_read)
            return grads, _finite(grads)
        if lane is not None:
            others, lag, finite = self.ctx.begin(rng, batch, self.keep_read,
                                                 lane.slots, self.rank if read else -1)
            if read:
                self.reader.set_read(others, lag)
            return None, finite
        if read:
            self.reader.read()
        grads = self.workload.gradient(self.ctx, rng, batch, keep_read=self.keep_read)
        return grads, _finite(grads)

    def apply(self, grads, step, *, local=False, weight=1.0, t_ns=None):
        """Density, gap, rule, tick, record; returns the gap, or -1 when temporal
        density held the step back (not an update). ``local``: a local-SGD replica
        step (staleness 0, nothing counted). ``weight`` scales the gradient first
        (adaptive batches); ``t_ns`` is the event's time (the simulator's virtual
        clock; default now)."""
        if grads is None:
            lane = self._lane
            if (weight == 1.0 and self.density is None and self.shard_of is None
                    and not (local and lane.__class__ is _TorchLane)):
                return lane.end(self.ctx, self.rank, step, local, self.reader,
                                -1 if t_ns is None else t_ns)
            grads = lane.grads(self.ctx, self.keep_read)
        if weight != 1.0:
            for g in grads:
                g.values *= weight
        if self.density is not None:
            grads = self.density.filter(grads, self.density_state, step=step + self.step0)
            if not grads:
                return -1
        if local:
            self.rule.apply(self.params, grads, self.rule_state, staleness=0,
                            rank=self.rank, t=self._count(local))
            return 0
        touched = self.shard_of(grads) if self.shard_of is not None else None
        gap = self.reader.gap(touched) if touched is not None else self.reader.gap()
        self.rule.apply(self.params, grads, self.rule_state, staleness=gap,
                        rank=self.rank, t=self._count(local))
        self.clocks.tick_update(self.rank, touched)
        self.reader.commit(step, gap, t_ns=t_ns)
        return gap

    def _count(self, local):
        """The rule's update count ``t`` (``kernels.step.apply_update``'s): for a state
        every worker shares, the clocks' total, this update included; else None (the
        rule counts its own steps)."""
        if local or not self.shared_state or not getattr(self.rule, "counts_updates",
                                                         False):
            return None
        return int(self.clocks.slots[:, _kc.UPD].sum()) + 1


class _Lane:
    """The lean lane's encodings, checked once (see :class:`PythonStep`)."""

    def __init__(self, ctx, rule, rule_state, reader, params, clock_fresh=False,
                 shared=False):
        params2d = tuple(as_rows(params[n]) for n in ctx.names)
        for name, p, q in zip(ctx.names, params2d, ctx.params):
            if not np.shares_memory(p, q):
                raise InvalidArgument(f"the context was set up on other parameters than "
                                      f"params[{name!r}]; set it up on the same ones")
        self.params = params2d
        self.rule = encode_rule(rule, rule_state, ctx.names, params2d,
                                clock_fresh=clock_fresh, shared=shared)
        self.K = self.rule.K
        # the step counts live in the state (rule.apply counts there too)
        self.k_state = ([rule_state[f"k/{n}"] for n in ctx.names] if rule.state.counts
                        else None)
        self.slots = reader.clocks.slots
        self.log = reader.log.arrays()

    def grads(self, ctx, keep_read):
        """The step's gradient as ``Grad`` views of the buffers (the general path)."""
        return ctx.grads(keep_read)

    def end(self, ctx, rank, step, local, reader, t_ns):
        K, ks = self.K, self.k_state
        if ks is not None:
            for i, k in enumerate(ks):
                K[i] = k[0]
        others = -1 if local else reader.others_read()
        gap = _ks.python_end(self.params, (ctx.G, ctx.R, ctx.RD, ctx.cnt), self.rule,
                             self.log, self.slots, (rank, others, reader.lag, step, t_ns))
        if ks is not None:
            for i, k in enumerate(ks):
                k[0] = K[i]
        return gap


class _TorchLane:
    """The lean lane of a torch workload (see :class:`PythonStep`): the gradient stays
    in the module's ``.grad`` tensors, viewed flat, and the whole apply half (guard,
    gap, the rule on every parameter, tick, record) is one compiled call,
    ``kernels.step.dense_end`` (the call ``hogkit.optim`` makes; ``apply_flat``, the
    kernel ``rule.apply`` runs on dense gradients, so both paths compute the same
    bits). Everything but the gradients is encoded once. A step whose gradients are
    not all dense, contiguous tensors of the parameters' dtype (a sparse embedding
    gradient, a parameter the loss did not use) takes the general path."""

    def __init__(self, ctx, rule, rule_state, reader, params, keep_read, shared=False):
        import torch

        from hogkit.workloads.module import flat_grads
        self._flat_grads = flat_grads            # bound once: take() runs every step
        names = ctx.names
        arrays = [params[n] for n in names]
        for name, a, t in zip(names, arrays, ctx.params):
            if not np.shares_memory(a, t.detach().numpy()):
                raise InvalidArgument(f"the context was set up on other parameters than "
                                      f"params[{name!r}]; set it up on the same ones")
        dtype = arrays[0].dtype
        self.torch_dtype = torch.float32 if dtype == np.float32 else torch.float64
        self.names, self.keep_read = names, keep_read
        self.params = tuple(a.reshape(-1) for a in arrays)
        enc = encode_rule(rule, rule_state, names, tuple(as_rows(a) for a in arrays),
                          shared=shared)
        self.rules = (((enc.cfg, 0, len(names)),), tuple(a.reshape(-1) for a in enc.S1),
                      tuple(a.reshape(-1) for a in enc.S2), enc.K, enc.shared)
        self.K = enc.K
        self.k_state = ([rule_state[f"k/{n}"] for n in names] if rule.state.counts
                        else None)
        empty = np.empty(0, dtype)
        self.RD = (tuple(ctx.snap[n].reshape(-1) for n in names) if keep_read
                   else tuple(empty for _ in names))
        self.slots = reader.clocks.slots
        self.log = reader.log.arrays()
        self.G, self.ps = None, None

    @classmethod
    def build(cls, ctx, rule, rule_state, reader, params, keep_read, shared=False):
        dtypes = {params[n].dtype for n in ctx.names}
        if len(dtypes) != 1 or dtypes.pop() not in (np.float32, np.float64):
            return None
        return cls(ctx, rule, rule_state, reader, params, keep_read, shared)

    def take(self, ps):
        """Hold the gradients of ``ps`` flat; False when one is missing, sparse, not
        contiguous or of another dtype (the step then takes the general path)."""
        G = self._flat_grads(ps, self.torch_dtype)
        if G is None:
            return False
        self.G, self.ps = G, ps
        return True

    def finite(self):
        return _kg.all_finite_each(self.G)

    def grads(self, ctx, keep_read):
        """The held gradients as ``Grad`` objects (the general path: density, weights,
        local steps)."""
        from hogkit.workloads.module import as_grad
        return [as_grad(n, p.grad, ctx.snap[n] if keep_read else None)
                for n, p in zip(self.names, self.ps)]

    def end(self, ctx, rank, step, local, reader, t_ns):
        K, ks = self.K, self.k_state
        if ks is not None:
            for i, k in enumerate(ks):
                K[i] = k[0]
        gap = _ks.dense_end(self.params, self.G, self.RD, self.rules, self.log, self.slots,
                            (rank, reader.others_read(), reader.lag, step, t_ns))
        if ks is not None:
            for i, k in enumerate(ks):
                k[0] = K[i]
        return gap


def _lane(workload, ctx, rule, rule_state, reader, params, keep_read=False,
          clock_fresh=False, shared=False):
    """The lean lane for this combination, or None (see :class:`PythonStep`)."""
    from hogkit.workloads.base import KernelCtx
    if reader.log is None or reader.per_shard or not isinstance(rule, Rule):
        return None
    from hogkit.workloads.module import ModuleWorkload, _Ctx
    if ctx.__class__ is _Ctx and isinstance(workload, ModuleWorkload):
        return _TorchLane.build(ctx, rule, rule_state, reader, params, keep_read, shared)
    if ctx.__class__ is not KernelCtx or type(workload).compiled is _base_compiled():
        return None
    return _Lane(ctx, rule, rule_state, reader, params, clock_fresh, shared)


def _finite(grads):
    from hogkit.validation import grads_finite
    return grads_finite(grads)
