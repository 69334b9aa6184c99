"""A deterministic simulator of Hogwild! training in virtual time, and a replayer of
update races.

**Why.** Hogwild! runs are not reproducible, and two cores cannot show what 64
workers do. :func:`simulate` runs the same workloads, rules, density filters and
policies as :func:`hogkit.train`, in one process, with N virtual workers whose
compute times come from a model (:mod:`hogkit.delays`). Same seed ⇒ bit-identical
results; the worker count is not bounded by the cores.

**What is modelled** (discrete events in virtual time, a heap of one pending event
per worker; the live worker loop of :mod:`hogkit.worker_loop` step for step):

- ``START`` at time t: the policy check (``policy.may_proceed`` semantics: SSP(s)
  with DONE workers excluded from the minimum; BSP = SSP(0); Async = SSP(∞)). A
  worker that may not proceed *blocks* until another worker's finish event changes
  the clocks; blocked workers are re-checked after every finish in rank order.
  Otherwise the worker **reads**: the gradient is computed at once, on the
  parameters exactly as of this event (an exact snapshot: nothing else happens at
  the same instant), with the worker's own ``workload.setup`` context and RNG
  ``default_rng([seed, rank])`` (as a live worker), and the clock vector and the
  clock lag (``own iterations − min``) are recorded.
- ``FINISH`` at ``t + step time`` (:class:`hogkit.delays.StepTimes`): the
  non-finite guard, the density filter, then ``rule.apply(..., staleness=gap)``
  with **gap = updates applied by others between the read and this apply** (exact),
  then the clocks tick and the event is recorded in a :class:`~hogkit.reader.
  StalenessLog` over private arrays (so summaries have the live format).
- Ties: events are ordered by ``(time, kind, seq)``, ``FINISH`` before ``START``
  (updates that finish at t are visible to reads at t) and ``seq`` a global counter
  (FIFO among equal times; initially ranks in order). With zero compute time every
  update is applied before the next read: round-robin sequential SGD.
- :class:`~hogkit.policy.DSSP`: the controller :func:`hogkit.policy.dssp_extra` on
  virtual times: a worker's interval is its latest iteration time (finish to
  finish, waits included; the first from t = 0); grant semantics as ``DSSP.wait``.
- :class:`~hogkit.policy.LocalSGD` (``overlap=False``): private replicas, a merge
  ``shared += Δ/W`` at the finish of every h-th step (its gap = merges by others
  since the worker's last pull), then a pull. ``overlap=True`` is not simulated.

**What is not modelled**: element-level races *inside* one apply (an apply is
atomic in virtual time; :func:`replay` models those explicitly), torn reads,
memory/cache contention and OS scheduling (compute times do not grow with the
worker count), the cost of the policy wait itself, and adaptive batch sizing.

**Engines.** ``engine="python"`` is the general event loop (any workload, rule,
density, policy). ``engine="fused"`` runs the loop, the logreg/mf gradient and the
SGD / staleness-aware sparse apply in one numba kernel (``hogkit.kernels.sim``;
2.6x / 5.6x / 9x the general engine at batch 64 / 16 / 4 on logreg with 64 workers:
52k / 200k / 440k updates/s, bound by the gradient's reads of the data, see
``benchmarks/simulate.py``); it is picked automatically (``engine="auto"``) for logreg/mf +
``SGD``/``StalenessAware`` without momentum + an SSP-family policy + no density,
and gives bit-identical results to the general engine.

**Races.** :func:`replay` runs an explicit schedule of element-level steps (vector
reads, non-atomic read-modify-writes) on a table, so lost updates and torn reads
can be replayed exactly; :mod:`hogkit.testing` generates such schedules.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from hogkit.clocks import DONE, RUNNING
from hogkit.delays import CHUNK, StepTimes, step_times
from hogkit.knobs import check_budget, config_of, resolve_workload, split_steps
from hogkit.errors import InvalidArgument, InvalidType, NonFiniteGradient
from hogkit.policy import DSSP, SSP, LocalSGD, clock_lag, dssp_extra, local_delta, merge
from hogkit.reader import StalenessLog
from hogkit.run import Run
from hogkit.validation import check_choice, check_float, check_int

__all__ = ["simulate", "parse_delays",
           "strip_wall", "fit_delays", "compare_gaps", "agreement", "Step", "ReadRecord",
           "Replay", "replay", "interleave", "fused_supported"]

from hogkit.delays import parse_delays  # noqa: E402  (re-exported for the CLI)

_FINISH, _START = 0, 1
#: Wall-clock figures: the only parts of a simulated summary that vary between runs.
_WALL_KEYS = ("wall_s", "updates_per_s", "engine_wall_s", "engine_updates_per_s")


# --------------------------------------------------------------------------- helpers







def _environment():
    from hogkit.report import environment
    env = environment()
    env.pop("time", None)          # the only field that changes between equal runs
    env["start_method"] = None     # one process
    return env


def strip_wall(summary: dict) -> dict:
    """``summary`` without the wall-clock figures (``wall_s``, ``updates_per_s``,
    ``engine_wall_s``, ``engine_updates_per_s``): what must be identical between two
    simulations with the same seed."""
    return {k: v for k, v in summary.items() if k not in _WALL_KEYS}


def fused_supported(workload, rule, policy, density) -> Optional[str]:
    """None when the fused numba engine can run this combination, else the reason."""
    from hogkit.rules import SGD, StalenessAware
    from hogkit.workloads.logreg import SparseLogReg
    from hogkit.workloads.mf import MatrixFactorization
    if type(workload) not in (SparseLogReg, MatrixFactorization):
        return f"workload {getattr(workload, 'name', workload)!r} (fused: logreg, mf)"
    if type(rule) not in (SGD, StalenessAware) or rule.momentum:
        return f"rule {rule!r} (fused: SGD or StalenessAware without momentum)"
    if type(policy) is not SSP:
        return f"policy {policy!r} (fused: Async, BSP, SSP)"
    if density is not None:
        return "a density filter (fused: none)"
    return None


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


def simulate(workload="mf", *, workers=8, policy=None, rule=None, density=None, batch=None,
             delays=None, stragglers=None, steps=None, seconds=None, seed=0,
             nonfinite="raise", eval_every=None, evals=20, engine="auto", out=None,
             workload_options=None, keep_params=True) -> Run:
    """Simulate a Hogwild! run of ``workers`` virtual workers; returns a :class:`Run`.

    Arguments as :func:`hogkit.train` (``workload``, ``policy``, ``rule``,
    ``density``, ``batch`` (an int), ``steps`` = total iterations split evenly over
    the workers, ``seed``, ``nonfinite``, ``stragglers``, ``out``), plus:

    delays : compute-time model: ``None`` (``Constant(1e-3)``), a string for
        :func:`parse_delays` (``"lognormal:1e-3:0.5,straggler:3:4"``), or a
        ``Constant``/``LogNormal``/``StepTimes`` from :mod:`hogkit.delays`.
    seconds : a budget in **virtual** seconds: no worker starts an iteration at or
        after it. ``steps`` and/or ``seconds`` must be given.
    eval_every : virtual seconds between loss evaluations; default: ``evals`` points
        evenly spaced in applied updates (or in time when only ``seconds`` is given).
    engine : ``"auto"`` | ``"fused"`` | ``"python"`` (see the module docstring).

    The result has ``simulated=True``; ``wall_s`` is the real time the simulation
    took, ``extra["virtual_time_s"]`` the simulated span, and ``loss_curve`` times are
    virtual. Everything except ``wall_s``/``updates_per_s`` is a function of the
    arguments (:func:`strip_wall`), and ``run.checksum()`` of the final parameters.
    """
    from hogkit.policy import Async
    from hogkit.rules import SGD

    t_wall = time.perf_counter()
    wl = resolve_workload(workload, workload_options)
    W = check_int("workers", workers, min_value=1, max_value=1 << 20,
                  fix="use workers=1 for a sequential baseline")
    steps, seconds = check_budget(steps, seconds, W, time_unit="virtual seconds")
    seed = check_int("seed", seed, min_value=0)
    check_choice("nonfinite", nonfinite, ("raise", "skip"))
    check_choice("engine", engine, ("auto", "fused", "python"))
    if batch is None:
        batch = wl.default_batch
    elif isinstance(batch, bool) or not isinstance(batch, (int, np.integer)):
        raise InvalidType(f"batch={batch!r} must be an int (samples per worker per step); "
                          f"the simulator does not model adaptive batch sizing")
    batch = check_int("batch", batch, min_value=1)
    policy = Async() if policy is None else policy
    if not isinstance(policy, (SSP, DSSP, LocalSGD)):
        raise InvalidType(f"policy={policy!r} must be Async(), BSP(), SSP(s), DSSP(lo, hi) "
                          f"or LocalSGD(h) from hogkit.policy")
    if isinstance(policy, LocalSGD) and policy.overlap:
        raise InvalidArgument(f"{policy!r}: the simulator does not model overlapped merges; "
                              f"use LocalSGD({policy.h}) (overlap=False)")
    rule = SGD(lr=wl.default_lr) if rule is None else rule
    times = step_times(delays, stragglers)
    times.arrays(W)          # checks straggler ranks against W
    if eval_every is not None:
        eval_every = check_float("eval_every", eval_every, min_value=0.0, exclude_min=True,
                                 fix="virtual seconds between loss evaluations")
    evals = check_int("evals", evals, min_value=1)

    why = fused_supported(wl, rule, policy, density)
    if engine == "fused" and why is not None:
        raise InvalidArgument(f"engine='fused' cannot run {why}; use engine='python' or "
                              f"'auto'")
    use_fused = engine == "fused" or (engine == "auto" and why is None)

    config = {"workload": wl.name, "workload_config": config_of(wl), "workers": W,
              "policy": config_of(policy), "rule": config_of(rule),
              "density": config_of(density), "batch": batch, "steps": steps,
              "seconds": seconds, "seed": seed, "nonfinite": nonfinite,
              "stragglers": {}, "delays": times.config(), "environment": _environment()}

    params, data = wl.build(seed)
    initial_loss = float(wl.loss(params, data))
    quotas = split_steps(steps, W) if steps is not None else [1 << 62] * W
    log = StalenessLog({k: np.zeros(shape, dt) for k, (shape, dt)
                        in StalenessLog.specs(W, ring=1).items()})
    if eval_every is None:
        if steps is not None:
            eval_updates = max(1, math.ceil(steps / evals))
        else:
            eval_every = seconds / evals
            eval_updates = math.inf
    else:
        eval_updates = math.inf
    S = _Setup(wl=wl, W=W, params=params, data=data, rule=rule, policy=policy,
               density=density, batch=batch, quotas=quotas,
               t_stop=seconds if seconds is not None else math.inf, times=times, seed=seed,
               nonfinite=nonfinite, log=log, eval_every=eval_every,
               eval_updates=eval_updates,
               curve=[{"t": 0.0, "updates": 0, "loss": initial_loss}])
    t_loop = time.perf_counter()
    res = _run_fused(S) if use_fused else _Python(S).run()
    loop_s = time.perf_counter() - t_loop
    final_loss = float(wl.loss(params, data))
    total = int(res["updates"].sum())
    t_end = float(res["t_end"])
    S.curve.append({"t": t_end, "updates": total, "loss": final_loss})
    per_worker = []
    for r in range(W):
        st = log.summary(r)
        last = float(res["last"][r])
        per_worker.append({
            "rank": r, "updates": int(res["updates"][r]),
            "iterations": int(res["iterations"][r]),
            "wait_fraction": round(float(res["wait"][r]) / last, 4) if last > 0 else 0.0,
            "nonfinite_skipped": int(res["skipped"][r]),
            "staleness": {"update_gap": st["gap"], "clock_lag": st["lag"]}})
    summ = log.summary()
    iterations = int(res["iterations"].sum())
    wall = time.perf_counter() - t_wall
    run = Run(config=config, workers=W, updates=total, wall_s=wall,
              initial_loss=initial_loss, final_loss=final_loss,
              staleness={"update_gap": summ["gap"], "clock_lag": summ["lag"]},
              per_worker=per_worker, loss_curve=S.curve,
              params=params if keep_params else None, simulated=True,
              extra={"events_dropped": 0,
                     "nonfinite_skipped": int(res["skipped"].sum()),
                     "samples": iterations * batch,
                     "virtual_time_s": t_end,
                     "virtual_updates_per_s": total / t_end if t_end > 0 else 0.0,
                     "engine": "fused" if use_fused else "python",
                     "engine_wall_s": round(loop_s, 4),
                     "engine_updates_per_s": round(total / loop_s, 1) if loop_s > 0 else 0.0})
    if isinstance(policy, DSSP):
        run.extra["dssp_grants"] = {str(r): int(n) for r, n in sorted(res["grants"].items())}
    if out is not None:
        import os
        from hogkit.report import plot_run, write_summary
        os.makedirs(out, exist_ok=True)
        run.out = os.fspath(out)
        write_summary(run, out)
        plot_run(run.summary(), out)
    return run


# --------------------------------------------------------------------------- general engine

class _Python:
    """The general event loop (any workload, rule, density, SSP/DSSP/LocalSGD)."""

    def __init__(self, S):
        from hogkit.kernels.sim import step_time
        self.S, self.step_time = S, step_time
        W = S.W
        self.local = isinstance(S.policy, LocalSGD)
        self.dssp = isinstance(S.policy, DSSP)
        self.upd = [0] * W
        self.it = [0] * W
        self.state = [RUNNING] * W
        self.started = [0] * W
        self.oread = [0] * W
        self.lag = [0] * W
        self.blocked = [False] * W
        self.bound_w = [0] * W
        self.wait_since = [0.0] * W
        self.wait = [0.0] * W
        self.last = [0.0] * W
        self.prev = [0.0] * W
        self.skipped = [0] * W
        self.pending = [None] * W
        self.bad = [False] * W
        self.extra = [None] * W
        self.released = [False] * S.W   # DSSP: woken from a block, proceed once
        self.grants = {}
        self.total = 0
        self.seq = 0
        self.heap = []
        self.speed, self.amp, self.period = S.times.arrays(W)
        self.streams = [S.times.stream(S.seed, r) for r in range(W)]
        self.rngs = [np.random.default_rng([S.seed, r]) for r in range(W)]
        self.keep_read = bool(getattr(S.rule, "needs_read", False))
        if self.local:
            self.replica = [{k: v.copy() for k, v in S.params.items()} for _ in range(W)]
            self.base = [{k: v.copy() for k, v in S.params.items()} for _ in range(W)]
            own = self.replica
        else:
            own = [S.params] * W
        self.ctx = [S.wl.setup(own[r], S.data, rank=r, seed=S.seed) for r in range(W)]
        self.rstate = [S.rule.init(own[r]) for r in range(W)]
        self.dstate = [S.density.init(own[r]) if S.density is not None else None
                       for r in range(W)]
        self.own = own
        self.bound = S.policy.bound if isinstance(S.policy, SSP) else None

    def _push(self, t, kind, w):
        heapq.heappush(self.heap, (t, kind, self.seq, w))
        self.seq += 1

    def _proceed(self, w, t):
        """The policy check at a START; sets self.bound_w[w] when it blocks."""
        lag = clock_lag(self.it, self.state, w)
        if not self.dssp:
            if self.local or lag <= self.bound:
                return True
            self.bound_w[w] = self.bound
            return False
        p = self.S.policy
        if self.released[w]:      # as DSSP.wait: once released, go, and decide afresh next time
            self.released[w] = False
            self.extra[w] = None
            return True
        if lag <= p.s_lo:
            self.extra[w] = None
            return True
        if self.extra[w] is None:
            r = self._decide(w, t)
            self.extra[w] = r
            self.grants[r] = self.grants.get(r, 0) + 1
        b = p.s_lo + self.extra[w]
        if lag <= b:
            return True
        self.bound_w[w] = b
        return False

    def _decide(self, w, t):
        """DSSP's controller on virtual times (as ``DSSP._decide``)."""
        it, st = self.it, self.state
        running = [q for q in range(self.S.W) if q == w or st[q] != DONE]
        c = it[w]
        if any(it[q] > c for q in running):
            return 0
        lo = min(it[q] for q in running)
        slow = [q for q in running if q != w and it[q] == lo]
        if not slow:
            return 0
        best = None
        for q in slow:
            if it[q] == 0:
                return 0                              # no timing yet: behave as SSP(s_lo)
            iv, hb = self.last[q] - self.prev[q], self.last[q]
            if iv <= 0:
                return 0
            nxt = hb + iv
            if best is None or nxt > best[0]:
                best = (nxt, hb, iv)
        own = self.last[w] - self.prev[w] if it[w] > 0 else 0.0
        return dssp_extra(t, own, best[1], best[2], self.S.policy.s_hi - self.S.policy.s_lo)

    def _wake(self, t):
        for q in range(self.S.W):
            if self.blocked[q] and clock_lag(self.it, self.state, q) <= self.bound_w[q]:
                self.blocked[q] = False
                self.wait[q] += t - self.wait_since[q]
                if self.dssp:
                    self.released[q] = True           # proceeds without a new decision
                self._push(t, _START, q)

    def _pull(self, w):
        S = self.S
        for k, v in S.params.items():
            self.replica[w][k][...] = v
            self.base[w][k][...] = v
        self.oread[w] = self.total - self.upd[w]
        self.lag[w] = clock_lag(self.it, self.state, w)

    def _merge(self, w, k, t):
        S = self.S
        gap = self.total - self.upd[w] - self.oread[w]
        for name, shared in S.params.items():
            merge(shared, local_delta(self.replica[w][name], self.base[w][name]),
                  workers=S.W)
        self.upd[w] += 1
        self.total += 1
        S.log.record(w, step=k, gap=gap, lag=self.lag[w], t_ns=int(t * 1e9))
        self._pull(w)

    def _eval(self, t):
        S = self.S
        S.curve.append({"t": t, "updates": self.total, "loss": float(S.wl.loss(S.params, S.data))})

    def run(self):
        from hogkit.rules import grads_finite
        S = self.S
        W = S.W
        eval_t = S.eval_every if S.eval_every is not None else math.inf
        eval_u = S.eval_updates
        for r in range(W):
            self._push(0.0, _START, r)
        heap = self.heap
        while heap:
            t, kind, _, w = heap[0]
            if t >= eval_t:
                self._eval(eval_t)
                eval_t += S.eval_every
                continue
            heapq.heappop(heap)
            if kind == _START:
                if t >= S.t_stop:
                    self.state[w] = DONE
                    if self.local and self._pending(w):
                        self._merge(w, self.it[w], t)
                    self._wake(t)
                    continue
                if not self._proceed(w, t):
                    self.blocked[w] = True
                    self.wait_since[w] = t
                    continue
                k = self.started[w]
                if not self.local:
                    self.oread[w] = self.total - self.upd[w]
                    self.lag[w] = clock_lag(self.it, self.state, w)
                grads = S.wl.gradient(self.ctx[w], self.rngs[w], S.batch,
                                      keep_read=self.keep_read)
                self.pending[w] = grads
                self.bad[w] = not grads_finite(grads)
                base, pause = self.streams[w].at(k)
                dt = self.step_time(base, self.speed[w], self.amp[w], self.period[w], t,
                                    pause)
                self.started[w] = k + 1
                self._push(t + dt, _FINISH, w)
                continue
            k = self.it[w]
            grads, self.pending[w] = self.pending[w], None
            if self.bad[w]:
                if S.nonfinite == "raise":
                    raise NonFiniteGradient.at(f"virtual worker {w}", k,
                                               f" (virtual time {t:.6g} s)")
                self.skipped[w] += 1
            else:
                if S.density is not None:
                    grads = S.density.filter(grads, self.dstate[w], step=k)
                if not grads:
                    pass   # held back (temporal density): nothing written, not an update
                elif not self.local:
                    tau = self.total - self.upd[w] - self.oread[w]
                    S.rule.apply(S.params, grads, self.rstate[w], staleness=tau, worker=w)
                    self.upd[w] += 1
                    self.total += 1
                    S.log.record(w, step=k, gap=tau, lag=self.lag[w], t_ns=int(t * 1e9))
                else:
                    S.rule.apply(self.replica[w], grads, self.rstate[w], staleness=0,
                                 worker=w)
            if self.local and S.policy.merges_after(k):
                self._merge(w, k, t)
            self.it[w] = k + 1
            self.prev[w], self.last[w] = self.last[w], t
            if k + 1 >= S.quotas[w]:
                if self.local and self._pending(w):
                    self._merge(w, k + 1, t)
                self.state[w] = DONE
            else:
                self._push(t, _START, w)
            self._wake(t)
            if self.total >= eval_u:
                self._eval(t)
                eval_u += S.eval_updates
        return {"updates": np.array(self.upd), "iterations": np.array(self.it),
                "wait": np.array(self.wait), "last": np.array(self.last),
                "skipped": np.array(self.skipped), "t_end": max(self.last),
                "grants": self.grants}

    def _pending(self, w):
        return any(not np.array_equal(self.replica[w][k], self.base[w][k])
                   for k in self.replica[w])


# --------------------------------------------------------------------------- fused engine

def _run_fused(S):
    """Drive ``hogkit.kernels.sim.run_events`` (same semantics as :class:`_Python`)."""
    from hogkit.kernels import sim as K
    from hogkit.workloads.logreg import SparseLogReg
    W, C, B = S.W, CHUNK, S.batch
    ctxs = [S.wl.setup(S.params, S.data, rank=r, seed=S.seed) for r in range(W)]
    c0 = ctxs[0]
    if isinstance(S.wl, SparseLogReg):
        cap = B * c0.max_nnz
        dt = c0.w.dtype
        lg = (c0.w, c0.indptr, c0.indices, c0.values, c0.y, np.zeros((W, cap), dt),
              np.zeros((W, cap), np.int64), np.zeros((W, cap), dt))
        mf, n, reg, scale = None, c0.n, c0.reg, 1.0 / B
    else:
        K_ = c0.P.shape[1]
        dt = c0.P.dtype
        mf = (c0.P, c0.Q, c0.u, c0.i, c0.r,
              np.zeros((W, B, K_), dt), np.zeros((W, B, K_), dt),
              np.zeros((W, B), np.int64), np.zeros((W, B), np.int64),
              np.zeros((W, B, K_), dt), np.zeros((W, B, K_), dt))
        lg, n, reg, scale = None, c0.n, c0.reg, 1.0
    # The fused engine draws each step's samples itself; this must mirror the
    # workload's gradient() (test_simulate checks fused == python bit for bit).
    draw = K.draw_blocks if hasattr(c0, "offsets") else K.draw_samples
    del ctxs
    samples = np.zeros((W, C, B), np.int64)
    base = np.zeros((W, C))
    pause = np.zeros((W, C))
    speed, amp, period = S.times.arrays(W)
    times = (base, pause, speed, amp, period)
    streams = [S.times.stream(S.seed, r) for r in range(W)]
    rngs = [np.random.default_rng([S.seed, r]) for r in range(W)]
    log = (S.log.gap_hist, S.log.lag_hist, S.log.stats, S.log.events, S.log.cursor)
    ist = np.zeros((W, K.NI), np.int64)
    fst = np.zeros((W, K.NF), np.float64)
    gi = np.zeros(3, np.int64)
    ist[:, K.I_STATE] = RUNNING
    ist[:, K.I_QUOTA] = S.quotas
    ist[:, K.I_KIND] = K.START
    ist[:, K.I_SEQ] = np.arange(W)
    gi[K.G_SEQ] = W
    rule = S.rule
    from hogkit.rules import StalenessAware
    bound = S.policy.bound
    cfg = np.zeros(K.NC)
    cfg[K.C_LR] = rule.lr
    cfg[K.C_AWARE] = 1.0 if isinstance(rule, StalenessAware) else 0.0
    cfg[K.C_BOUND] = math.inf if bound == math.inf else float(bound)
    cfg[K.C_EVAL_T] = S.eval_every if S.eval_every is not None else math.inf
    cfg[K.C_EVAL_U] = S.eval_updates
    cfg[K.C_T_STOP] = S.t_stop
    cfg[K.C_SKIP] = 1.0 if S.nonfinite == "skip" else 0.0
    cfg[K.C_REG] = reg
    cfg[K.C_SCALE] = scale

    def loss_point(t):
        S.curve.append({"t": t, "updates": int(gi[K.G_TOTAL]),
                        "loss": float(S.wl.loss(S.params, S.data))})

    while True:
        code = K.run_events(lg, mf, samples, times, log, ist, fst, gi, cfg)
        if code == K.R_DONE:
            break
        if code == K.R_REFILL:
            w = int(gi[K.G_WHO])
            draw(rngs[w], n, B, samples[w])
            base[w], pause[w] = streams[w].fill(C)
            ist[w, K.I_FILLED] += C
        elif code == K.R_EVAL_T:
            loss_point(float(cfg[K.C_EVAL_T]))
            cfg[K.C_EVAL_T] += S.eval_every
        elif code == K.R_EVAL_U:
            loss_point(float(fst[:, K.F_LAST].max()))
            cfg[K.C_EVAL_U] += S.eval_updates
        else:
            w = int(gi[K.G_WHO])
            raise NonFiniteGradient.at(f"virtual worker {w}", int(ist[w, K.I_ITER]),
                                       f" (virtual time {fst[w, K.F_T]:.6g} s)")
    return {"updates": ist[:, K.I_UPD].copy(), "iterations": ist[:, K.I_ITER].copy(),
            "wait": fst[:, K.F_WAIT].copy(), "last": fst[:, K.F_LAST].copy(),
            "skipped": ist[:, K.I_SKIPPED].copy(), "t_end": float(fst[:, K.F_LAST].max()),
            "grants": {}}


# --------------------------------------------------------------------------- CLI

# --------------------------------------------------------------------------- vs reality

def fit_delays(run, *, sigma=0.0, events=None) -> StepTimes:
    """A compute-time model fitted to a real run (``hogkit.train``'s :class:`Run`).

    Each worker's mean step time is ``run.wall_s / iterations`` (virtual time for a
    simulated run; waits included, so
    under Async it is the compute time); the fastest sets the base and the others get
    ``speeds`` relative to it. Fit on a run with a time budget (``seconds=``): with a
    step count every worker runs the same number of iterations and the speeds read
    as equal. With ``events`` (the ``update`` records of
    ``events.jsonl``, or its path) the spread ``sigma`` of a log-normal base is the
    standard deviation of each worker's log step intervals (pooled); otherwise
    ``sigma`` as given (0: constant). The base keeps the mean: ``median =
    mean·exp(−sigma²/2)``. Not modelled: that real step times drift and correlate.
    """
    from hogkit.delays import Constant, LogNormal
    its = [max(int(pw["iterations"]), 1) for pw in run.per_worker]
    span = run.extra["virtual_time_s"] if run.simulated else run.wall_s
    per = [span / i for i in its]
    if events is not None:
        if isinstance(events, (str, bytes)) or hasattr(events, "__fspath__"):
            from hogkit.report import read_events
            events = read_events(events)
        logs = []
        for r in range(len(its)):
            t = np.array(sorted(e["t_ns"] for e in events
                                if e.get("type", "update") == "update" and e["rank"] == r),
                         dtype=np.float64)
            d = np.diff(t)
            d = d[d > 0]
            if len(d) > 2:
                ld = np.log(d)
                logs.append(ld - ld.mean())
        if logs:
            sigma = float(np.concatenate(logs).std())
    sigma = check_float("sigma", sigma, min_value=0.0)
    fastest = min(per)
    base = (Constant(fastest) if sigma == 0.0
            else LogNormal(median=fastest * math.exp(-sigma * sigma / 2), sigma=sigma))
    return StepTimes(base=base, speeds=tuple(p / fastest for p in per))


def _hist(run_or_summary):
    st = (run_or_summary.staleness if isinstance(run_or_summary, Run)
          else run_or_summary["staleness"])
    gap = st["update_gap"]
    h = {int(k): int(v) for k, v in gap["histogram"].items()}
    return h, float(gap["mean"])


def compare_gaps(a, b) -> dict:
    """Compare two runs' update-gap distributions (Runs or summaries):
    ``{"tv": total-variation distance in [0, 1], "mean_a", "mean_b", "mean_ratio"
    (a/b), "p_a", "p_b" (normalised histograms)}``. Overflow bins compare as values."""
    ha, ma = _hist(a)
    hb, mb = _hist(b)
    na, nb = sum(ha.values()), sum(hb.values())
    if not na or not nb:
        raise InvalidArgument(f"both runs need updates to compare (got {na} and {nb})")
    keys = sorted(set(ha) | set(hb))
    pa = {k: ha.get(k, 0) / na for k in keys}
    pb = {k: hb.get(k, 0) / nb for k in keys}
    tv = 0.5 * sum(abs(pa[k] - pb[k]) for k in keys)
    return {"tv": tv, "mean_a": ma, "mean_b": mb,
            "mean_ratio": ma / mb if mb else (math.inf if ma else 1.0), "p_a": pa, "p_b": pb}


def agreement(real, workload, *, policy=None, rule=None, batch=None, sigma=0.0,
              events=None, seed=0, engine="auto") -> dict:
    """Simulate the twin of a real run and compare their update gaps.

    ``real``: the :class:`Run` of ``hogkit.train`` (same ``workload``, ``policy``,
    ``rule``, ``batch`` as given here). The twin has the same workers and total
    iterations and delays from :func:`fit_delays`. Returns :func:`compare_gaps`
    (``a`` = simulated, ``b`` = real) plus ``"delays"`` (the fitted model's config)
    and ``"simulated"`` (the twin's summary).
    """
    times = fit_delays(real, sigma=sigma, events=events)
    steps = sum(int(pw["iterations"]) for pw in real.per_worker)
    sim = simulate(workload, workers=real.workers, policy=policy, rule=rule, batch=batch,
                   delays=times, steps=steps, seed=seed, engine=engine, keep_params=False)
    out = compare_gaps(sim, real)
    out["delays"] = times.config()
    out["simulated"] = sim.summary()
    return out


# --------------------------------------------------------------------------- races: replay

from typing import NamedTuple  # noqa: E402

STEP_KINDS = ("read", "load", "store", "add")


class Step(NamedTuple):
    """One atomic step of a race schedule (see :func:`replay`).

    ``kind``: ``"read"`` (worker copies ``row`` into its current vector read),
    ``"load"`` (worker loads ``row`` into a private register: the first half of a
    non-atomic read-modify-write), ``"store"`` (worker writes ``register + value``
    back: the second half; the compute is private and folded into it), ``"add"``
    (an atomic ``row += value``, e.g. under a lock or with np.add.at semantics).
    ``value``: the delta of a store/add (a scalar or a ``(width,)`` array).
    """

    kind: str
    worker: int
    row: int
    value: object = None


@dataclass(frozen=True)
class ReadRecord:
    """One vector read: the rows a worker read in consecutive ``read`` steps.

    ``versions[i]``: how many stores row ``rows[i]`` had seen when it was read;
    ``values``: what was read, ``(len(rows), width)``; ``positions``: schedule
    indices of the steps; ``torn``: True when no single instant had every row at the
    version read (the read is not a snapshot: some write fell between its steps).
    """

    worker: int
    rows: tuple
    versions: tuple
    values: np.ndarray
    positions: tuple
    torn: bool


@dataclass
class Replay:
    """What :func:`replay` returns: the final ``table``, every vector read, and the
    lost updates (``lost`` in total; ``lost_at``: ``(position, worker, row, n)`` for
    each store that overwrote ``n`` stores by others since its load)."""

    table: np.ndarray
    reads: list
    versions: np.ndarray
    lost: int
    lost_at: list

    @property
    def torn(self) -> int:
        """Number of torn vector reads."""
        return sum(r.torn for r in self.reads)


def _check_step(pos, step, n, width):
    if not isinstance(step, tuple) or len(step) not in (3, 4):
        raise InvalidType(f"schedule[{pos}]={step!r} must be a Step(kind, worker, row, "
                          f"value) from hogkit.simulator")
    step = Step(*step)
    check_choice(f"schedule[{pos}].kind", step.kind, STEP_KINDS)
    check_int(f"schedule[{pos}].worker", step.worker, min_value=0)
    check_int(f"schedule[{pos}].row", step.row, min_value=0, max_value=n - 1,
              fix=f"the table has {n} rows")
    if step.kind in ("store", "add"):
        if step.value is None:
            raise InvalidArgument(f"schedule[{pos}]: a {step.kind} needs value= (the delta "
                                  f"to add), got None")
        v = np.asarray(step.value, dtype=np.float64)
        if v.ndim > 1 or (v.ndim == 1 and v.shape[0] != width):
            raise InvalidArgument(f"schedule[{pos}].value has shape {v.shape}; expected a "
                                  f"scalar or ({width},) for a table of width {width}")
    return step


def replay(schedule, initial, *, atomic=False) -> Replay:
    """Run a race ``schedule`` (a sequence of :class:`Step`) on a copy of ``initial``.

    ``initial``: a 1-D ``(n,)`` or 2-D ``(n, width)`` float array (a row is the unit
    of a step; use width 1 for element granularity). Steps run one at a time in
    order, each atomically (aligned element reads never tear); everything that makes
    Hogwild! racy is explicit in the schedule:

    - a **vector read** is a worker's consecutive ``read`` steps (ended by any other
      step of that worker); other workers' writes may fall between them, and the
      record says which version of each row it saw and whether it is **torn**;
    - a **non-atomic update** is ``load`` then ``store`` by one worker; a store
      writes ``register + value``, silently overwriting any store to that row by
      another worker since its load: a **lost update**, counted in ``lost``.
      ``atomic=True`` replays each store as an atomic add at its position instead
      (the reference without lost updates). A store with no load before it raises.

    Deterministic and pure: ``initial`` is not modified.
    """
    init = np.asarray(initial)
    if init.ndim not in (1, 2) or init.dtype not in (np.float32, np.float64):
        raise InvalidArgument(f"initial must be a 1-D or 2-D float32/float64 array, got "
                              f"shape {init.shape} dtype {init.dtype}")
    flat = init.ndim == 1
    table = init.reshape(init.shape[0], -1).astype(init.dtype, copy=True)
    n, width = table.shape
    steps = [_check_step(p, s, n, width) for p, s in enumerate(schedule)]
    version = np.zeros(n, np.int64)
    starts = [[-1] for _ in range(n)]    # position at which each version began
    registers = {}                        # (worker, row) -> (values, version at load)
    open_reads = {}                       # worker -> list of (row, version, values, pos)
    done_reads = []
    lost, lost_at = 0, []

    def close(w):
        items = open_reads.pop(w, None)
        if items:
            done_reads.append((w, items))

    for pos, (kind, w, r, value) in enumerate(steps):
        if kind != "read":
            close(w)
        if kind == "read":
            open_reads.setdefault(w, []).append((r, int(version[r]), table[r].copy(), pos))
        elif kind == "load":
            registers[(w, r)] = (table[r].copy(), int(version[r]))
        elif kind == "store" and not atomic:
            if (w, r) not in registers:
                raise InvalidArgument(
                    f"schedule[{pos}]: worker {w} stores row {r} without a load before it; "
                    f"put Step('load', {w}, {r}) earlier, or use kind='add' for an atomic "
                    f"update")
            reg, v0 = registers.pop((w, r))
            clobbered = int(version[r]) - v0
            if clobbered:
                lost += clobbered
                lost_at.append((pos, w, r, clobbered))
            table[r] = reg + np.asarray(value, dtype=table.dtype)
            version[r] += 1
            starts[r].append(pos)
        else:  # add, or store with atomic=True
            if kind == "store":
                registers.pop((w, r), None)
            table[r] += np.asarray(value, dtype=table.dtype)
            version[r] += 1
            starts[r].append(pos)
    for w in list(open_reads):
        close(w)
    reads = []
    for w, items in done_reads:
        lo, hi = -2, math.inf
        for r, v, _, _ in items:
            s = starts[r][v]
            e = starts[r][v + 1] if v + 1 < len(starts[r]) else math.inf
            lo, hi = max(lo, s), min(hi, e)
        vals = np.stack([it[2] for it in items])
        reads.append(ReadRecord(worker=w, rows=tuple(it[0] for it in items),
                                versions=tuple(it[1] for it in items),
                                values=vals[:, 0] if flat else vals,
                                positions=tuple(it[3] for it in items),
                                torn=not lo < hi))
    reads.sort(key=lambda rec: rec.positions[0])
    return Replay(table=table.reshape(init.shape), reads=reads, versions=version,
                  lost=lost, lost_at=lost_at)


def interleave(programs, order):
    """Merge per-worker programs into one schedule: ``order`` lists worker ids, each
    occurrence taking that worker's next step. ``programs[w]`` is a list of
    :class:`Step` of worker w (their ``worker`` field is set to w). ``order`` must use
    every step exactly once."""
    progs = [list(p) for p in programs]
    need = [len(p) for p in progs]
    used = [0] * len(progs)
    out = []
    for pos, w in enumerate(order):
        w = check_int(f"order[{pos}]", w, min_value=0, max_value=len(progs) - 1)
        if used[w] >= need[w]:
            raise InvalidArgument(f"order[{pos}]={w}: worker {w} has only {need[w]} steps; "
                                  f"order must name each worker once per step")
        out.append(Step(*progs[w][used[w]])._replace(worker=w))
        used[w] += 1
    if used != need:
        raise InvalidArgument(f"order uses {used} steps per worker but the programs have "
                              f"{need}; name each worker once per step")
    return out
