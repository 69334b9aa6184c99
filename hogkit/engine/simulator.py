"""A deterministic simulator of Hogwild! training in virtual time.

**Why.** Hogwild! runs are not reproducible, and two cores cannot show what 64
workers do. :func:`simulate` runs the same workloads, rules, density filters and
policies as :func:`hogkit.train`, in one process, with N virtual workers whose
compute times come from a model (:mod:`hogkit.engine.delays`). Same seed ⇒ bit-identical
results; the worker count is not bounded by the cores.

**What is modelled** (discrete events in virtual time, one pending event per worker;
the event loop is ``hogkit.kernels.sim.run_events``):

- ``START`` at time t: the policy's admission test, ``hogkit.kernels.clock.admit`` on
  the policy's own encoding (``policy.encode()``), the state machine the live engines
  run: SSP(s) with DONE workers excluded from the minimum, BSP = SSP(0), Async =
  SSP(∞), DSSP's grant from each worker's last finish and latest iteration time,
  BoundedDelay's update lead. A worker that may not proceed *blocks* until another
  worker's finish changes the clocks; blocked workers are re-checked after every
  finish in rank order and released then (a released worker starts without a new
  check, as after a live wait). Otherwise the worker **reads**: the first half of the step (sample,
  clock vector, gradient, guard) runs at once, on the parameters exactly as of this
  event (an exact snapshot: nothing else happens at the same instant), with the
  worker's own context and RNG (as a live worker).
- ``FINISH`` at ``t + step time`` (:class:`hogkit.engine.delays.StepTimes`): the second half
  (density, gap, rule, tick) with **gap = updates applied by others between the read
  and this apply** (exact), recorded in a :class:`~hogkit.state.reader.StalenessLog` over
  private arrays (so summaries have the live format).
- Ties: events are ordered by ``(time, kind, seq)``, ``FINISH`` before ``START``
  (updates that finish at t are visible to reads at t) and ``seq`` a global counter
  (FIFO among equal times; initially ranks in order). With zero compute time every
  update is applied before the next read: round-robin sequential SGD.
- a policy with ``local_steps`` h (:class:`~hogkit.policy.LocalSGD`,
  ``overlap=False``): private replicas, a merge
  ``shared += Δ/W`` at the finish of every h-th step (its gap = merges by others
  since the worker's last pull), then a pull. ``overlap=True`` is not simulated.
  ``replication="worker:K"`` is the same with ``shared += Δ`` every K steps and a merge
  counted as its K steps (its gap = others' steps merged since the pull).

**What is not modelled**: element-level races *inside* one apply (an apply is
atomic in virtual time; :mod:`hogkit.races` models those explicitly), torn reads,
memory/cache contention and OS scheduling (compute times do not grow with the
worker count), the cost of the policy wait itself, and adaptive batch sizing.

**Engines** (the same event loop, two implementations of the step, as in
:mod:`hogkit.engine.step`; the same words as a live run's): ``engine="compiled"`` runs
the compiled step core's halves inside the loop (the *fused* engine: compiled
workloads, ``mf``, ``logreg``, a user's own; every rule, density and policy but local
SGD and replicas); ``engine="python"`` hands each half back to the Python reference
step (any workload, local SGD, replicas). ``engine="auto"`` takes the compiled one
where it can. Both give bit-identical results (``tests/test_simulate.py``).

**Defaults** are the workload's one set, as :func:`hogkit.train` takes them
(:func:`~hogkit.engine.plan.make_plan`): the same rule, batch and order; the simulator
models the batch lane, and a summary whose workload defaults to the per-sample lane
says so (``config["chosen"]["lane"]``).

Calibration against real runs lives in :mod:`hogkit.calibrate`; replaying
element-level races in :mod:`hogkit.races`.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from hogkit.engine.delays import CHUNK, StepTimes, step_times
from hogkit.engine.local_phase import LocalPhase
from hogkit.engine.plan import eval_interval, make_plan
from hogkit.engine.replication import resolve_auto
from hogkit.engine.run import Run, note_skipped
from hogkit.engine.settings import Engine, Outputs, Workers
from hogkit.engine.step import (PythonStep, compiled_support, encode_density,
                                encode_rule)
from hogkit.errors import InvalidArgument, NonFiniteGradient
from hogkit.kernels import clock as _kc
from hogkit.kernels import layout as L
from hogkit.kernels import sim as K
from hogkit.kernels.step import cacheable
from hogkit.report import environment, write_outputs
from hogkit.state.clocks import RUNNING, Clocks
from hogkit.state.reader import Reader, StalenessLog
from hogkit.workloads.base import metrics_of

__all__ = ["simulate", "strip_wall", "fused_supported"]

#: Wall-clock figures: the only parts of a simulated summary that vary between runs.
_WALL_KEYS = ("wall_s", "updates_per_s", "engine_wall_s", "engine_updates_per_s",
              "engine_setup_s")


def _environment():
    env = environment()
    env.pop("time", None)          # the only field that changes between equal runs
    env["start_method"] = None     # one process
    return env


def strip_wall(summary: dict) -> dict:
    """``summary`` without the wall-clock figures (``wall_s``, ``updates_per_s``,
    ``engine_wall_s``, ``engine_updates_per_s``, ``engine_setup_s``): what must be
    identical between two simulations with the same seed."""
    return {k: v for k, v in summary.items() if k not in _WALL_KEYS}


def fused_supported(workload, rule, policy, density, batch=None, local=None) -> Optional[str]:
    """None when the fused engine can run this combination, else the reason
    (``local``: the run's :attr:`~hogkit.engine.plan.RunPlan.local` phase)."""
    if getattr(policy, "local_steps", 0):
        return f"policy {policy!r} (local SGD runs on the Python engine)"
    if local is not None:
        return "replication='worker' (replicas run on the Python engine)"
    return compiled_support(workload, rule=rule, density=density, policy=policy,
                            batch=workload.default_batch if batch is None else batch)


# --------------------------------------------------------------------------- simulate

@dataclass
class _Setup:
    wl: object
    W: int
    params: dict
    data: dict
    rule: object
    policy: object
    density: object
    batch: int
    quotas: list
    t_stop: float
    times: StepTimes
    seed: int
    nonfinite: str
    log: StalenessLog
    eval_every: Optional[float]
    eval_updates: float
    curve: list = field(default_factory=list)
    local: object = None        # the workers' replica and merges (RunPlan.local), or None
    shared_state: bool = False  # one rule state for all workers (a server's)


def simulate(workload="mf", *, workers=2, policy=None, rule=None, density=None, batch=None,
             steps=None, seconds=None, seed=0, engine=None, outputs=None) -> Run:
    """Simulate a Hogwild! run of ``workers`` virtual workers; returns a :class:`Run`.

    Arguments as :func:`hogkit.train`, with the same defaults; what differs:

    workers : virtual workers (any number), or
        :class:`~hogkit.engine.settings.Workers`: ``delays`` (the compute time a step
        takes: ``None``, ``Constant(1e-3)``; a string such as
        ``"lognormal:1e-3:0.5,straggler:3:4"``; a model of :mod:`hogkit.engine.delays`)
        and ``stragglers``.
    seconds : a budget in **virtual** seconds: no worker starts an iteration at or
        after it.
    engine : ``"auto"`` | ``"compiled"`` | ``"python"`` (the module docstring), or
        :class:`~hogkit.engine.settings.Engine`, whose ``rule_state`` is the simulator's:
        ``"worker"`` (each worker's rule state its own) or ``"shared"`` (one state, a
        parameter server's: one momentum buffer, Gap-Aware's second moment and step
        counts as Barkai et al. keep them on the server); None: as a live run keeps it.
    outputs : as ``train``'s; ``eval_every`` counts virtual seconds, and "auto" is
        ``evals`` points evenly spaced in applied updates (in time when only
        ``seconds`` is given).

    What the simulator cannot model (adaptive batches, per-shard staleness, a policy
    of your own, overlapped local-SGD merges) is refused by
    :meth:`hogkit.engine.plan.RunPlan.simulable`. The result has ``simulated=True``;
    ``wall_s`` is the real time the simulation took, ``extra["virtual_time_s"]`` the
    simulated span, and ``loss_curve`` times are virtual. Everything except
    ``wall_s``/``updates_per_s`` is a function of the arguments (:func:`strip_wall`),
    and ``run.checksum()`` of the final parameters.
    """
    t_wall = time.perf_counter()
    wk, en, outs = Workers.of(workers), Engine.of(engine), Outputs.of(outputs)
    plan = make_plan(workload, workers=wk, policy=policy, rule=rule, density=density,
                     batch=batch, steps=steps, seconds=seconds, seed=seed, engine=en,
                     outputs=outs, mode="sim")
    plan.simulable()
    rule_state = en.rule_state
    if rule_state is None:
        rule_state = "shared" if getattr(plan.rule, "shared_state", False) else "worker"
    times = step_times(wk.delays, plan.stragglers)
    times.arrays(plan.workers)          # checks straggler ranks against W
    every, every_updates = eval_interval(plan, live=False, evals=outs.evals)
    use_fused = _use_fused(en.kind, plan)         # refused before anything is built
    wl = plan.workload
    params, data = wl.build(plan.seed)
    plan, chosen = resolve_auto(plan, params, data)
    if plan.local is not None and chosen is not None:     # auto took replicas
        use_fused = _use_fused(en.kind, plan)
    config = plan.config(stragglers={}, delays=times.config(), environment=_environment())
    if chosen is not None:
        config["replication"] = chosen
    if rule_state != ("shared" if getattr(plan.rule, "shared_state", False) else "worker"):
        config["rule_state"] = rule_state
    initial_loss = float(wl.loss(params, data))
    W = plan.workers
    quotas = plan.quotas() if plan.steps is not None else [1 << 62] * W
    log = StalenessLog({k: np.zeros(shape, dt) for k, (shape, dt)
                        in StalenessLog.specs(W, ring=1).items()})
    S = _Setup(wl=wl, W=W, params=params, data=data, rule=plan.rule, policy=plan.policy,
               density=plan.density, batch=plan.batch, quotas=quotas,
               t_stop=plan.seconds if plan.seconds is not None else math.inf, times=times,
               seed=plan.seed, nonfinite=plan.nonfinite, log=log,
               eval_every=None if every == math.inf else every, eval_updates=every_updates,
               curve=[{"t": 0.0, "updates": 0, "loss": initial_loss}], local=plan.local,
               shared_state=rule_state == "shared")
    t_setup = time.perf_counter()
    res = _run_fused(S) if use_fused else _run_python(S)
    res["setup_s"] = time.perf_counter() - t_setup - res["loop_s"]
    return _collect(plan, S, res, config, initial_loss, use_fused,
                    time.perf_counter() - t_wall)


def _use_fused(engine, plan) -> bool:
    """Whether ``engine`` ("auto" | "compiled" | "python") runs ``plan`` on the fused
    engine (the compiled step core in the event loop); "compiled" where it cannot is
    refused, naming why."""
    why = fused_supported(plan.workload, plan.rule, plan.policy, plan.density, plan.batch,
                          local=plan.local)
    if engine == "compiled" and why is not None:
        raise InvalidArgument(f"engine='compiled' cannot run this: {why}; use "
                              f"engine='python' or engine='auto'")
    return engine == "compiled" or (engine == "auto" and why is None)


def _collect(plan, S, res, config, initial_loss, use_fused, wall) -> Run:
    """The simulated run's result (the same shape as a live run's); written to
    ``plan.out`` when given."""
    W, log = plan.workers, S.log
    final_loss = float(S.wl.loss(S.params, S.data))
    total = int(res["updates"].sum())
    t_end, loop_s = float(res["t_end"]), res["loop_s"]
    S.curve.append({"t": t_end, "updates": total, "loss": final_loss})
    per_worker = []
    for r in range(W):
        st = log.summary(r)
        last = float(res["last"][r])
        per_worker.append({
            "rank": r, "updates": int(res["updates"][r]),
            "iterations": int(res["iterations"][r]),
            "samples": int(res["iterations"][r]) * plan.batch,
            "wait_fraction": round(float(res["wait"][r]) / last, 4) if last > 0 else 0.0,
            "nonfinite_skipped": int(res["skipped"][r]),
            "held_back": int(res["held"][r]),
            "staleness": {"update_gap": st["gap"], "clock_lag": st["lag"]}})
    summ = log.summary()
    iterations = int(res["iterations"].sum())
    run = Run(config=config, workers=W, updates=total, wall_s=wall,
              initial_loss=initial_loss, final_loss=final_loss,
              staleness={"update_gap": summ["gap"], "clock_lag": summ["lag"]},
              per_worker=per_worker, loss_curve=S.curve,
              params=S.params if plan.keep_params else None, simulated=True,
              extra={"events_dropped": 0,
                     "nonfinite_skipped": int(res["skipped"].sum()),
                     "samples": iterations * plan.batch,
                     "virtual_time_s": t_end,
                     "virtual_updates_per_s": total / t_end if t_end > 0 else 0.0,
                     "engine": "compiled" if use_fused else "python",
                     "engine_wall_s": round(loop_s, 4),
                     "engine_updates_per_s": round(total / loop_s, 1) if loop_s > 0 else 0.0,
                     "engine_setup_s": round(res["setup_s"], 4),
                     "metrics": metrics_of(S.wl, S.params, S.data)})
    note_skipped(run)
    if plan.policy.timing:          # DSSP: its controller's grants
        run.extra["dssp_grants"] = {str(r): int(n) for r, n in sorted(res["grants"].items())}
    if plan.out is not None:
        write_outputs(run, plan.out)
    return run


# --------------------------------------------------------------------------- engines

def _loop_state(S):
    """The event loop's arrays (``hogkit.kernels.sim``), the same for both engines."""
    W = S.W
    slots = np.zeros((W, _kc.SLOT), np.int64)
    slots[:, _kc.STATE] = RUNNING
    slots[:, _kc.BEAT] = 1                      # virtual t = 0 (ns + 1; 0 is "never")
    ist = np.zeros((W, L.NI), np.int64)
    ist[:, L.I_QUOTA] = S.quotas
    ist[:, L.I_KIND] = L.START
    ist[:, L.I_SEQ] = np.arange(W)
    ist[:, L.I_ADM:L.I_ADM + _kc.NADM] = _kc.admission_state()
    fst = np.zeros((W, L.NF))
    gi = np.zeros(L.NG + L.queue_slots(W), np.int64)
    gi[L.G_SEQ] = W
    cfg = np.zeros(L.NC)
    cfg[L.C_EVAL_T] = S.eval_every if S.eval_every is not None else math.inf
    cfg[L.C_EVAL_U] = S.eval_updates
    cfg[L.C_T_STOP] = S.t_stop
    cfg[L.C_SKIP] = 1.0 if S.nonfinite == "skip" else 0.0
    cfg[L.C_KEEP] = 1.0 if getattr(S.rule, "needs_read", False) else 0.0
    cfg[L.C_BATCH] = S.batch
    K.build_queue(ist, fst, gi)                 # every worker's START at t = 0
    speed, amp, period = S.times.arrays(W)
    times = (np.zeros((W, CHUNK)), np.zeros((W, CHUNK)), speed, amp, period)
    streams = [S.times.stream(S.seed, r) for r in range(W)]
    policy = (S.policy.encode(), np.zeros(_kc.GRANT_BINS, np.int64))
    return {"slots": slots, "ist": ist, "fst": fst, "gi": gi, "cfg": cfg, "policy": policy,
            "times": times, "streams": streams}


def _drive(S, st, run, args, on_step=None, overlap=False):
    """Call the event loop until it is done, serving what it hands back; the result's
    ``loop_s`` times the loop from its first call, the kernel loaded (the engine's
    time: the set-up before it is not in it), to the last evaluation point's loss.

    ``overlap`` (the fused engine): each evaluation point's loss is taken on a copy of
    the parameters in a thread of its own while the loop goes on, so a second core
    takes it off the loop's path (the loop and the compiled loss kernels release the
    GIL). The same values: the copy is the parameters at that point, as the loop left
    them. One evaluation at a time: a point waits for the one before it, so at most one
    copy is alive. The Python engine evaluates in line (its steps and a torch loss
    share the workload's state)."""
    ist, fst, gi, cfg = st["ist"], st["fst"], st["gi"], st["cfg"]
    base, pause = st["times"][0], st["times"][1]
    if hasattr(run, "compile"):               # a dispatcher (not under NUMBA_DISABLE_JIT)
        run.compile(tuple(run.typeof_pyval(a) for a in args))   # load now, not in the loop
    pool = ThreadPoolExecutor(1, thread_name_prefix="hogkit-eval") if overlap else None
    pending = []                              # (curve point, future), in order
    t_loop = time.perf_counter()

    def loss_point(t):
        point = {"t": t, "updates": int(gi[L.G_TOTAL]), "loss": None}
        S.curve.append(point)
        if pool is None:
            point["loss"] = float(S.wl.loss(S.params, S.data))
            return
        settle(len(pending))
        snap = {k: v.copy() for k, v in S.params.items()}
        pending.append((point, pool.submit(S.wl.loss, snap, S.data)))

    def settle(n):
        for point, f in pending[:n]:
            point["loss"] = float(f.result())
        del pending[:n]

    try:
        while True:
            code = run(*args)
            w = int(gi[L.G_WHO])
            if code == L.R_DONE:
                break
            if code == L.R_REFILL:
                base[w], pause[w] = st["streams"][w].fill(CHUNK)
                ist[w, L.I_FILLED] += CHUNK
            elif code == L.R_EVAL_T:
                loss_point(float(cfg[L.C_EVAL_T]))
                cfg[L.C_EVAL_T] += S.eval_every
            elif code == L.R_EVAL_U:
                loss_point(float(fst[:, L.F_LAST].max()))
                cfg[L.C_EVAL_U] += S.eval_updates
            elif code == L.R_NONFINITE:
                raise NonFiniteGradient.at(f"virtual worker {w}",
                                           int(st["slots"][w, _kc.ITER]),
                                           f" (virtual time {fst[w, L.F_T]:.6g} s)")
            else:
                on_step(code, w)
        settle(len(pending))
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    slots = st["slots"]
    return {"updates": slots[:, _kc.UPD].copy(), "iterations": slots[:, _kc.ITER].copy(),
            "wait": fst[:, L.F_WAIT].copy(), "last": fst[:, L.F_LAST].copy(),
            "skipped": ist[:, L.I_SKIPPED].copy(), "held": ist[:, L.I_HELD].copy(),
            "t_end": float(fst[:, L.F_LAST].max()),
            "grants": {r: int(n) for r, n in enumerate(st["policy"][1]) if n},
            "loop_s": time.perf_counter() - t_loop}


def _log_arrays(S):
    return (S.log.gap_hist, S.log.lag_hist, S.log.stats, S.log.events)


def _run_fused(S):
    """The fused engine: the step core's halves inside the event loop."""
    st = _loop_state(S)
    W = S.W
    ctxs = [S.wl.setup(S.params, S.data, rank=r, seed=S.seed) for r in range(W)]
    for c in ctxs:
        c.grow(S.batch)
    names, params = ctxs[0].names, ctxs[0].params
    caps = [int(g.shape[0]) for g in ctxs[0].G]
    rules = [encode_rule(S.rule, S.rule.init(S.params), names, params, clock_fresh=True,
                         shared=S.shared_state)
             for _ in range(1 if S.shared_state else W)]
    dens = [encode_density(S.density, S.density.init(S.params) if S.density else None,
                           names, params, caps) for _ in range(W)]
    cursors = np.stack([c.cursor for c in ctxs])
    rngs = (K.typed_list([np.random.default_rng([S.seed, r]) for r in range(W)])
            if ctxs[0].parts.uses_rng else None)
    step = L.FusedStep(
        wl=ctxs[0].parts.arrays, rngs=rngs, cursors=cursors, params=params,
        wbufs=_stack_bufs(ctxs), rule=rules[0].cfg,
        wrule=_stack([(r.S1, r.S2, r.K) for r in rules]),  # one when shared: all use it
        dens=dens[0].cfg, wdens=_stack([d.D for d in dens]), mask=dens[0].mask)
    run = K.run_events if cacheable(type(step.wl)) else K.run_events_uncached
    return _drive(S, st, run, (step, _event_loop(S, st)), overlap=True)


def _event_loop(S, st):
    """The event loop's :class:`~hogkit.kernels.layout.EventLoop` (both engines)."""
    return L.EventLoop(slots=st["slots"], log=_log_arrays(S), times=st["times"],
                       ist=st["ist"], fst=st["fst"], gi=st["gi"], cfg=st["cfg"],
                       policy=st["policy"])


def _stack(trees):
    """One tree (nested tuples of arrays, the same shapes in each) of per-worker stacks:
    every array with a leading worker axis (``kernels.sim.pick`` takes worker w's)."""
    if isinstance(trees[0], tuple):
        return tuple(_stack([t[i] for t in trees]) for i in range(len(trees[0])))
    return np.stack(trees)


def _stack_bufs(ctxs):
    """The workers' step buffers ``(G, R, RD, cnt, idx, GF, scratch)`` as stacks, each
    worker's ``G`` still a view of its flat ``GF`` (the kernels write one, read the
    other)."""
    bufs = [c.bufs() for c in ctxs]
    R, RD, cnt, idx, GF, scratch = _stack([b[1:] for b in bufs])
    G = tuple(f.reshape((len(bufs),) + g.shape) for f, g in zip(GF, bufs[0][0]))
    return (G, R, RD, cnt, idx, GF, scratch)


def _run_python(S):
    """The Python engine: the same event loop, the reference step's halves in Python."""
    st = _loop_state(S)
    W, slots, ist, fst, gi = S.W, st["slots"], st["ist"], st["fst"], st["gi"]
    views = {"clk_slots": slots, "clk_shard_updates": np.zeros((W, 1), np.int64),
             "clk_stop": np.zeros(8, np.int64)}
    clocks = Clocks(views)
    lp = S.local
    local = lp is not None
    phases = [LocalPhase(S.params, lp.divisor) for _ in range(W)] if local else None
    merged = [0] * W                       # each worker's steps merged so far
    replicas = [ph.replica for ph in phases] if local else [S.params] * W
    readers = [Reader(clocks, S.log, r) for r in range(W)]
    steps = []
    one_state = S.rule.init(S.params) if S.shared_state else None
    for r in range(W):
        ctx = S.wl.setup(replicas[r], S.data, rank=r, seed=S.seed)
        steps.append(PythonStep(S.wl, ctx, rank=r, rule=S.rule,
                                rule_state=(one_state if one_state is not None
                                            else S.rule.init(replicas[r])),
                                density=S.density,
                                density_state=(S.density.init(replicas[r])
                                               if S.density is not None else None),
                                reader=readers[r], clocks=clocks, params=replicas[r],
                                nonfinite=S.nonfinite, clock_fresh=True,
                                shared_state=S.shared_state))
    for rd in readers:
        rd.read()
    rngs = [np.random.default_rng([S.seed, r]) for r in range(W)]
    pending = [None] * W

    def merge_local(w, k, t, done):
        gap = readers[w].gap()             # as the live worker's merge: gap, merge and
        phases[w].merge()                  # pull, tick, record, read
        n = max(0, done - merged[w]) if lp.count_steps else 1
        clocks.tick_update(w, count=n)
        merged[w] = done
        readers[w].commit(k, gap, t_ns=int(K.vt_ns(t)))
        gi[L.G_TOTAL] += n
        readers[w].read()

    def pending_local(w):
        return phases[w].pending()

    def on_step(code, w):
        t = float(fst[w, L.F_T])
        if code == L.R_BEGIN:
            grads, ok = steps[w].compute(rngs[w], S.batch, read=not local)
            pending[w] = grads
            ist[w, L.I_BAD] = 0 if ok else 1
            return
        if code == L.R_RETIRE:
            if local and pending_local(w):
                merge_local(w, int(slots[w, _kc.ITER]), t, int(slots[w, _kc.ITER]))
            return
        k = int(slots[w, _kc.ITER])                      # R_END
        grads, pending[w] = pending[w], None
        gap = steps[w].apply(grads, k, local=local, t_ns=int(K.vt_ns(t)))
        if gap < 0:
            ist[w, L.I_HELD] += 1
        elif not local:
            gi[L.G_TOTAL] += 1
        if local and lp.merges_after(k):
            merge_local(w, k, t, k + 1)
        if local and k + 1 >= S.quotas[w] and pending_local(w):
            merge_local(w, k + 1, t, k + 1)

    return _drive(S, st, K.run_events, (None, _event_loop(S, st)), on_step)


