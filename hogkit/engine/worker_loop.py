"""The worker process body: attach, run the step until done or stopped, finish.

:func:`run_worker` is what the runtime spawns (through :mod:`hogkit.engine.entry`, which caps
threads first). Everything a worker shares with others is in three shared-memory stores
attached by handle: parameters, data, and control (clocks, staleness log, and the
runtime's per-worker counters). Every shared slot has one writer: worker ``w`` writes
only row ``w`` of the control arrays; the parent writes only the stop flag and FAILED
marks.

A worker runs one of the two engines of :mod:`hogkit.engine.step`:

- **compiled**: :class:`~hogkit.engine.step.CompiledStep` runs chunks of whole steps in the
  compiled core; between chunks this loop beats the heartbeat, adapts the chunk to
  about 16 ms (the stop flag is read every step inside; a heartbeat and a check for
  the parent's death every chunk), and
  handles what the core hands back: a policy wait (the policy's ``wait_bound``: the
  same admission kernel with backoff, liveness and timeout, :mod:`hogkit.policy.base`),
  a local-SGD merge, a long straggler pause, a non-finite gradient. The core is built
  from the policy's contract (``encode()``, ``local_steps``, ``timing``), never from
  its class;
- **python**: :class:`~hogkit.engine.step.PythonStep` one step at a time (torch workloads,
  per-shard staleness, adaptive batch sizes).

Races here are the object of study, not bugs: the gradient reads parameters while
other workers write them (Hogwild!), and the apply's read-modify-write of a row is not
atomic, so concurrent updates to one element can be lost. The reader measures how
stale each read was; the simulator (virtual time) is the deterministic twin.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from hogkit.state import worker_state
from hogkit.state.clocks import DONE, FAILED, IDLE, RUNNING, Clocks
from hogkit.errors import NonFiniteGradient
from hogkit.kernels import clock as _kc
from hogkit.kernels import layout as _kl
from hogkit.engine.local_phase import LocalPhase
from hogkit.state.reader import Reader, StalenessLog
from hogkit.state.store import ParamStore

#: the compiled loop returns to Python about this often (heartbeat, parent check, the
#: published worker state); the stop flag is read inside, every step. Each return costs
#: more than its ~12 µs of dispatch: the factor rows the Python code pushed out of the
#: core's cache are fetched again. At 1 ms a chunk, mf's per-sample lane ran ~9 % slower
#: than in one call; at 16 ms, within 1 % (in-process, medians of 7 rounds)
CHUNK_NS = 16_000_000
#: ring events per second per worker the compiled loop aims at (a sample of the
#: updates; the histograms count every update)
EVENTS_PER_S = 20_000


def runtime_specs(workers: int) -> dict:
    """The runtime's own control arrays: ``rt`` (W, RT) int64 counters (one writer per
    row; columns ``hogkit.kernels.step.RT_*``), ``rt_speed`` (2, W) published speeds for
    adaptive batches (double-buffered by iteration parity) and ``rt_grants`` (W, 64),
    DSSP's histogram of granted extra iterations, written when the worker finishes."""
    return {"rt": ((workers, _kl.RT), np.int64),
            "rt_speed": ((2, workers), np.float64),
            "rt_grants": ((workers, _kc.GRANT_BINS), np.int64)}


def control_specs(workers: int, shards: int = 1, gate: int = 0, **log) -> dict:
    """Every array of a run's control store: clocks, staleness log (``log``: its ring
    and bins) and the runtime's counters.

    ``gate`` extra clock rows belong to no process here: a node of a cluster run
    (:mod:`hogkit.cluster`) has one, whose iteration count its agent sets to the
    slowest remote node's clock, so the admission test every worker already runs
    (SSP, BSP, DSSP) bounds it against the other nodes too, and the clock lag it
    records is the lag across the cluster. Its update count stays 0: the update gap
    a worker records is the gap within its node."""
    rows = workers + gate
    return {**Clocks.specs(rows, shards), **StalenessLog.specs(rows, **log),
            **runtime_specs(workers)}


def clock_counts_all(slots, workers: int) -> bool:
    """Whether every writer of the parameters ticks the update clock ``slots``: not on
    a cluster node, whose agent merges the other nodes' rows without a tick (its gate
    rows, :func:`control_specs`). Then a step with gap 0 is fresh, and DC-ASGD and
    Gap-Aware skip measuring their gaps (``engine.step.encode_rule(clock_fresh=...)``)."""
    return slots.shape[0] == workers


@dataclass
class WorkerSpec:
    """Everything one worker needs; pickled by the parent, loaded in the child: the
    run's :class:`~hogkit.engine.plan.RunPlan` and this worker's part of it."""
    rank: int
    plan: Any                       # hogkit.engine.plan.RunPlan (workload, knobs, seed...)
    steps: Optional[int]            # this worker's share of the steps, None = until stop
    params: Any                     # StoreHandle
    data: Any                       # StoreHandle
    control: Any                    # StoreHandle
    state: Any = None               # StoreHandle of hogkit.state.worker_state's store, or None
    step0: int = 0                  # this worker's iterations in earlier segments
    engine: str = "python"          # "compiled" | "python" (decided by the parent)
    wait_timeout: float = 60.0
    parent_pid: int = 0

    @property
    def delay(self):
        """This worker's straggler model, or None."""
        return self.plan.stragglers.get(self.rank)

    def run(self) -> None:
        """The process body (:func:`run_worker`)."""
        run_worker(self)


class _Worker:
    """State of one worker (private to its process)."""

    def __init__(self, spec: WorkerSpec, params, data, control, wviews=None):
        from hogkit.engine.step import PythonStep
        self.spec = spec
        self.rank = spec.rank
        self.shared = params
        self.control = control
        self.clocks = Clocks(control)
        self.log = StalenessLog(control)
        self.rt = control["rt"][spec.rank]
        self.shards = spec.plan.shards
        self.param_index = {name: i for i, name in enumerate(sorted(params))}
        self.reader = Reader(self.clocks, self.log, spec.rank, shards=spec.plan.shards > 1)
        # a replica and its merges: LocalSGD's, or replication="worker" (plan.local)
        self.lp = spec.plan.local
        self.local = (LocalPhase(params, self.lp.divisor, self.lp.overlap, self.lp.cost)
                      if self.lp is not None else None)
        self.merged = 0            # this worker's steps merged (or pulled) so far
        # Under LocalSGD the gradient reads, and the rule writes, a private replica.
        self.params = self.local.replica if self.local is not None else params
        self.ctx = spec.plan.workload.setup(self.params, data, rank=spec.rank,
                                            seed=spec.plan.worker_seed)
        # rule and density state, stream and cursor outlive the process (a restart, a
        # resume): bound to, and restored from, hogkit.state.worker_state's store
        self.wviews = wviews
        rule, density = spec.plan.rule, spec.plan.density
        if wviews is not None:
            self.rule_state = worker_state.bind(wviews, spec.rank, "rule")
            self.density_state = (worker_state.bind(wviews, spec.rank, "density")
                                  if density is not None else None)
        else:
            self.rule_state = rule.init(self.params)
            self.density_state = density.init(self.params) if density is not None else None
        self.rng = np.random.default_rng([spec.plan.worker_seed, spec.rank])
        cursor = getattr(self.ctx, "cursor", None)
        self.cursor = cursor if isinstance(cursor, np.ndarray) else None
        worker_state.restore(wviews, spec.rank, rng=self.rng, cursor=self.cursor)
        self.core = None                  # the compiled step (prepare_compiled)
        self.counts = None                # its Gap-Aware counts, published with the stream
        self.delay = (spec.delay.start(spec.plan.worker_seed, spec.rank)
                      if spec.delay is not None else None)
        self.sizer = None if isinstance(spec.plan.batch, (int, np.integer)) else spec.plan.batch
        self.mean_reduced = getattr(spec.plan.workload, "grad_reduction", "mean") == "mean"
        self.timing = bool(getattr(spec.plan.policy, "timing", False))
        self.step = None                  # the Python engine's step (python_step)
        if spec.engine != "compiled":     # the compiled one is built by prepare_compiled
            self.step = PythonStep(
                spec.plan.workload, self.ctx, rank=spec.rank, rule=rule,
                rule_state=self.rule_state, density=density,
                density_state=self.density_state, reader=self.reader, clocks=self.clocks,
                params=self.params, nonfinite=spec.plan.nonfinite,
                shard_of=self._shards_of if self.shards > 1 else None, step0=spec.step0,
                clock_fresh=clock_counts_all(self.clocks.slots, spec.plan.workers),
                shared_state=rule.shared_state)

    # ------------------------------------------------------------------ Python engine
    def _batch(self, k: int):
        """This iteration's batch size and gradient weight (1.0 for a fixed batch)."""
        if self.sizer is None:
            return int(self.spec.plan.batch), 1.0
        speeds = self.control["rt_speed"][(k - 1) % 2]
        b = int(self.sizer.sizes(speeds)[self.rank])
        if not self.mean_reduced:      # summed gradients already grow with b
            return b, 1.0
        return b, self.spec.plan.workers * b / self.spec.plan.global_batch

    def _observe(self, k, b, compute_ns):
        """Feed the sizer this iteration's speed and publish its prediction. The load
        input (NARX's exogenous signal) is the worker's straggler load now (1.0 without
        one): the iteration just measured ran under it, and with a load that varies
        over seconds the next millisecond-long iteration runs under about the same."""
        sizer = self.sizer
        load = self.delay.load() if self.delay is not None else 1.0
        sizer.observe(self.rank, b, max(compute_ns, 1) * 1e-9, load=load)
        if self.spec.plan.epoch_steps and (k + 1) % self.spec.plan.epoch_steps == 0:
            sizer.end_epoch(self.rank)
        self.control["rt_speed"][k % 2, self.rank] = sizer.speed(self.rank, load=load)

    def _shards_of(self, grads):
        """Shard ids an update touches: row r of an n-row parameter p is in shard
        ``index(p)·S + r·S // n`` - S contiguous row ranges per parameter, with a
        counter of their own (the clocks hold S x number-of-parameters shards).
        ``None`` (every shard) as soon as one gradient is dense."""
        parts = []
        S = self.shards
        for g in grads:
            if g.rows is None:
                return None
            n = self.shared[g.name].shape[0]
            # int64 first: rows * S overflows int32 for large tables
            ids = g.rows.astype(np.int64, copy=False) * S // n
            parts.append(ids + self.param_index[g.name] * S)
        return np.concatenate(parts) if parts else None

    def python_step(self, k: int) -> bool:
        """Run iteration ``k`` on the Python engine. Returns False if the run is stopping."""
        spec, rank, clocks, rt = self.spec, self.rank, self.clocks, self.rt
        t0 = time.perf_counter_ns()
        clocks.step[rank] = k
        spec.plan.policy.wait(clocks, rank, timeout=spec.wait_timeout)
        t1 = time.perf_counter_ns()
        rt[_kl.RT_WAIT] += t1 - t0
        if clocks.stopping():
            rt[_kl.RT_BUSY] += t1 - t0
            return False
        b, weight = self._batch(k)
        grads, finite = self.step.compute(self.rng, b, read=self.local is None)
        rt[_kl.RT_SAMPLES] += b
        if not finite:
            if spec.plan.nonfinite == "raise":
                raise NonFiniteGradient.at(f"worker {rank}", k)
            rt[_kl.RT_NONFINITE] += 1
        elif self.step.apply(grads, k, local=self.local is not None, weight=weight) < 0:
            rt[_kl.RT_HELD] += 1
        if self.delay is not None:
            self.delay.pause(time.perf_counter_ns() - t1)
        if self.sizer is not None:     # the speed a straggler shows includes its pause
            self._observe(k, b, time.perf_counter_ns() - t1)
        if self.local is not None and self.lp.merges_after(k):
            self.merge(k, k + 1)
        clocks.tick_iteration(rank, beat=True)
        rt[_kl.RT_BUSY] += time.perf_counter_ns() - t0
        return True

    # ------------------------------------------------------------------ compiled engine
    def prepare_compiled(self) -> None:
        """Build the compiled step and load its machine code (a call for 0 steps), before
        the start barrier: loading a cached core takes a few hundred ms, which must not
        count as training time nor skew the first steps' staleness."""
        from hogkit.engine.step import CompiledStep, encode_pacer, lane_lr_scale
        spec, rank, clocks = self.spec, self.rank, self.clocks
        self.core = CompiledStep(
            self.ctx, rank=rank, batch=int(spec.plan.batch), rule=spec.plan.rule,
            rule_state=self.rule_state, density=spec.plan.density,
            density_state=self.density_state, slots=clocks.slots, rt=self.control["rt"],
            stop=clocks.stop, log=self.log.arrays(), rng=self.rng, policy=spec.plan.policy,
            grants=self.control["rt_grants"][rank],
            quota=-1 if spec.steps is None else spec.steps, nonfinite=spec.plan.nonfinite,
            pacer=encode_pacer(spec.delay, spec.plan.worker_seed, rank), step0=spec.step0,
            lane=spec.plan.lane, lane_lr_scale=lane_lr_scale(spec.plan),
            local_h=self.lp.h if self.lp is not None else 0, merge=self._core_merge(),
            clock_fresh=clock_counts_all(clocks.slots, spec.plan.workers),
            shared_state=spec.plan.rule.shared_state)
        if spec.plan.rule.state.counts:
            self.counts = (self.ctx.names, self.core.rule.K, self.rule_state)
        self.core.run(0)

    def _core_merge(self):
        """What the compiled core needs to merge each local phase itself (None: it
        returns MERGE and :meth:`merge` runs here): not with an overlapped or paced
        merge (a thread, a sleep), nor with per-shard clocks (the core ticks the whole
        clock only)."""
        lp = self.lp
        if lp is None or lp.overlap or lp.cost > 0 or self.shards > 1:
            return None
        names = self.ctx.names
        return (tuple(self.local.shared[n] for n in names),
                tuple(self.local.base[n] for n in names), lp.divisor, lp.count_steps)

    def _sync_phase(self, into_core):
        """Hand the local phase's read (others' updates, clock lag, steps merged) from
        the reader to the core's ``io`` (``into_core``), or back: the core's merges
        update it, and only the core merges while it runs."""
        io = self.core.io
        if into_core:
            io[_kl.IO_OTHERS] = self.reader.others_read()
            io[_kl.IO_LAG] = self.reader.lag
            io[_kl.IO_MERGED] = self.merged
        else:
            self.reader.set_read(io[_kl.IO_OTHERS], io[_kl.IO_LAG])
            self.merged = int(io[_kl.IO_MERGED])

    def compiled_loop(self) -> int:
        """Run this worker's steps on the compiled engine (on the local-SGD replica
        when there is one: ``ctx`` was set up on it); returns the worker's iterations
        so far, a restarted worker's predecessors' included: the global step index
        :meth:`finish`'s last merge counts from, as the merges and ``_python_loop`` do
        (the steps run in this process alone left a restarted replica's last phase
        uncounted). Where the core merges the phases, it holds the phase's read for the
        whole loop: handed over once before it, taken back once after (for
        :meth:`finish`'s last merge)."""
        in_core = bool(self.core.cfg[_kl.MERGE_CORE])
        if in_core:
            self._sync_phase(True)
        try:
            self._chunks()
            return int(self.clocks.iterations[self.rank])
        finally:
            if in_core:
                self._sync_phase(False)

    def _chunks(self) -> None:
        """:meth:`compiled_loop`'s chunks of steps, and what each return asks for."""
        spec, rank, clocks, rt = self.spec, self.rank, self.clocks, self.rt
        policy, core = spec.plan.policy, self.core
        core.pacer[3] = time.monotonic_ns()          # a Load pacer's t = 0: the start
        rt[_kl.RT_STRIDE] = 1
        parent = spec.parent_pid
        chunk = 8
        while True:
            t0 = time.perf_counter_ns()
            code = core.run(chunk)
            self.publish()                     # ~every 16 ms (a publish is ~10 µs);
                                               # finish() publishes the exact end
            t1 = time.perf_counter_ns()
            rt[_kl.RT_BUSY] += t1 - t0
            if not self.timing:
                clocks.beat(rank)
            if parent and os.getppid() != parent:
                break                          # orphaned: PDEATHSIG normally kills us first
            if code == _kl.CHUNK:
                _set_stride(core, rt, core.done, t1 - t0)
                chunk = _next_chunk(chunk, t1 - t0)
            elif code in (_kl.STOPPED, _kl.QUOTA_DONE):
                break
            elif code == _kl.BLOCKED:         # the policy's wait, on the core's bound
                policy.wait_bound(clocks, rank, int(core.adm[_kc.A_WAIT]),
                                  timeout=spec.wait_timeout)
                rt[_kl.RT_WAIT] += time.perf_counter_ns() - t1
                if clocks.stopping():
                    break
                core.release()
            elif code == _kl.MERGE:
                k = int(clocks.iterations[rank])
                self.merge(k, k + 1)
                clocks.tick_iteration(rank, beat=self.timing)
            elif code == _kl.NONFINITE:
                raise NonFiniteGradient.at(f"worker {rank}", int(clocks.step[rank]))
            if code in (_kl.PAUSE, _kl.MERGE) and core.io[_kl.IO_PAUSE_NS] > 0:
                from hogkit.engine.delays import wait_ns     # a straggler's long pause: sleep
                wait_ns(int(core.io[_kl.IO_PAUSE_NS]))
            rt[_kl.RT_BUSY] += time.perf_counter_ns() - t1

    # ------------------------------------------------------------------ both
    def publish(self) -> None:
        """This worker's stream, cursor and core step counts to the state store."""
        worker_state.publish(self.wviews, self.rank, rng=self.rng, cursor=self.cursor,
                             counts=self.counts)

    def merge(self, k: int, done: int) -> None:
        """Merge the local phase into the shared model (LocalSGD, replicas); ``done``:
        this worker's steps so far. The staleness of a merge = the update counts others
        added since this phase pulled the shared model: a merge adds one (LocalSGD) or
        its phase's steps (``replication="worker"``: the gap then counts updates)."""
        gap = self.reader.gap()
        self.local.merge()
        self.clocks.tick_update(self.rank, count=max(0, done - self.merged)
                                if self.lp.count_steps else 1)
        self.merged = done
        self.reader.commit(k, gap)
        self.reader.read()

    def finish(self, k: int) -> None:
        self.publish()
        if self.local is not None:
            if self.local.pending():
                self.merge(k, k)
            self.local.close()
        grants = getattr(self.spec.plan.policy, "grants", None)
        if grants is not None:
            row = self.control["rt_grants"][self.rank]
            for r, n in grants(self.rank).items():
                row[min(int(r), _kc.GRANT_BINS - 1)] += n
        if self.delay is not None:
            self.rt[_kl.RT_COMPUTE] += self.delay.compute_ns
            self.rt[_kl.RT_PAUSED] += self.delay.paused_ns


def _next_chunk(chunk, elapsed_ns):
    """Steps for the next call so that it takes about CHUNK_NS."""
    if elapsed_ns <= 0:
        return min(chunk * 2, 1 << 22)
    target = int(chunk * CHUNK_NS / elapsed_ns)
    return max(1, min(target, chunk * 4, 1 << 22))


def _set_stride(core, rt, steps, elapsed_ns):
    """Keep the event ring to about EVENTS_PER_S events a second."""
    if elapsed_ns <= 0:
        return
    rate = steps * 1e9 / elapsed_ns
    stride = max(1, int(rate // EVENTS_PER_S))
    stride = 1 << (stride.bit_length() - 1)       # a power of two: steady sampling
    core.cfg[_kl.STRIDE] = stride
    if stride > rt[_kl.RT_STRIDE]:
        rt[_kl.RT_STRIDE] = stride


def private_control():
    """``(views, clocks, log)``: one RUNNING worker's control arrays in private memory
    (a small log): for warming the kernels, and for an optimizer used outside
    :func:`hogkit.spawn` (staleness always 0)."""
    views = {k: np.zeros(shape, dtype) for k, (shape, dtype) in
             control_specs(1, ring=4, bins=4).items()}
    clocks, log = Clocks(views), StalenessLog(views)
    clocks.state[0] = RUNNING
    return views, clocks, log


def warm(workload, rule, density, params, data, seed, batch, engine="python", *,
         lane="batch", lane_lr_scale=1.0, local=False) -> None:
    """Run the engine's step on private copies (parameters, rule and density state,
    clocks, log), so every kernel a worker calls is compiled: in the parent, before
    spawning, numba compiles and caches the machine code; in a worker, before the start
    barrier, it loads it (a few hundred ms a process for the Python engine's kernels,
    which would otherwise count as training time and slow the first steps). Nothing
    shared is written (the data the workers write, ``workload.writes_data``, is
    copied); the samples come from a private rng and a private context.

    The Python engine runs one step on its lean lane and one on the general path (an
    adaptive-batch weight), the compiled engine two steps of the core; both then use
    the Reader and clock kernels the loops call around the step, and with ``local`` a
    local phase's merge (LocalSGD). ``lane`` must be the
    workers' lane: it picks which compiled loop there is to compile (a workload's own
    per-sample lane has its own, ``kernels.step.run_lane_steps``).
    """
    from hogkit.engine.step import CompiledStep, PythonStep
    views, clocks, log = private_control()
    data = {**data, **{k: data[k].copy() for k in getattr(workload, "writes_data", ())}}
    if engine in ("compiled", "python"):     # ("reader": only the kernels around it)
        scratch = {k: v.copy() for k, v in params.items()}
        ctx = workload.setup(scratch, data, rank=0, seed=seed)
        rule_state = rule.init(scratch)
        dstate = density.init(scratch) if density is not None else None
        rng = np.random.default_rng(seed)
    if engine == "compiled":
        core = CompiledStep(ctx, rank=0, batch=batch, rule=rule, rule_state=rule_state,
                            density=density, density_state=dstate, slots=clocks.slots,
                            rt=views["rt"], stop=clocks.stop, log=log.arrays(), rng=rng,
                            quota=2, nonfinite="skip", lane=lane,
                            lane_lr_scale=lane_lr_scale)
        core.run(2)
    elif engine == "python":
        step = PythonStep(workload, ctx, rank=0, rule=rule, rule_state=rule_state,
                          density=density, density_state=dstate,
                          reader=Reader(clocks, log, 0), clocks=clocks, params=scratch,
                          nonfinite="skip")
        for k, weight in ((0, 1.0), (1, 0.5)):
            grads, finite = step.compute(rng, batch)
            if finite:
                step.apply(grads, k, weight=weight)
            clocks.tick_iteration(0, beat=True)
    reader = Reader(clocks, log, 0)
    reader.read()
    reader.commit(2, reader.gap())
    clocks.tick_iteration(0, beat=True)
    if local:                                # a local phase's merge (LocalSGD)
        LocalPhase({k: v.copy() for k, v in params.items()}, 2).merge()


def run_worker(spec: WorkerSpec) -> None:
    """Process body: attach, loop until the steps are done or the parent says stop."""
    handles = (spec.params, spec.data, spec.control, spec.state)
    stores = [ParamStore.attach(h) if h is not None else None for h in handles]
    try:
        params, data, control, wviews = (s.views() if s is not None else None
                                         for s in stores)
        if spec.plan.workload.needs_torch:
            import torch
            torch.set_num_threads(1)
        worker = _Worker(spec, params, data, control, wviews)
        if spec.engine == "compiled":
            worker.prepare_compiled()
            batch = int(spec.plan.batch)
        else:
            batch = int(spec.plan.batch) if isinstance(spec.plan.batch, (int, np.integer)) else 1
        warm(spec.plan.workload, spec.plan.rule, spec.plan.density, params, data,
             spec.plan.seed, batch, "python" if spec.engine != "compiled" else "reader",
             local=worker.local is not None)
        clocks = worker.clocks
        clocks.set_state(spec.rank, RUNNING)
        clocks.beat(spec.rank)
        start_barrier(clocks, spec.wait_timeout)
        worker.rt[_kl.RT_T0] = time.monotonic_ns()
        clocks.beat(spec.rank)     # the first iteration's time is counted from here
        if worker.local is not None:
            worker.local.pull()    # the first local phase starts from the model now
            worker.merged = int(clocks.iterations[spec.rank])   # (a restart: from there)
        worker.reader.read()       # ...and its staleness is counted from here
        if spec.engine == "compiled":
            k = worker.compiled_loop()
        else:
            k = _python_loop(worker, spec)
        worker.finish(k)
        worker.rt[_kl.RT_T1] = time.monotonic_ns()
        clocks.set_state(spec.rank, DONE)
    finally:
        for s in stores:
            if s is not None:
                s.close()


def _python_loop(worker, spec):
    if worker.delay is not None:
        worker.delay.row[3] = time.monotonic_ns()   # a Load pacer's t = 0: the start,
    parent = spec.parent_pid                        # as on the compiled engine
    # from the shared clock: 0 in a fresh run, the iterations so far in a restarted
    # worker (the compiled core compares the same slot with its quota)
    k = int(worker.clocks.iterations[spec.rank])
    while spec.steps is None or k < spec.steps:
        if not worker.python_step(k):
            break
        k += 1
        if k & 63 == 0:
            worker.publish()
            if parent and os.getppid() != parent:
                break  # orphaned: PDEATHSIG normally kills us first
    return k


def start_barrier(clocks, timeout):
    """Wait until every worker has attached and set up (state ≠ IDLE), so that no
    worker runs hundreds of steps while another is still importing: the staleness
    measured is that of the training, not of process start-up. A worker that fails
    during set-up leaves IDLE (FAILED), which releases the others; the parent then
    stops the run."""
    deadline = time.monotonic() + timeout
    while (clocks.state == IDLE).any() and not clocks.stopping():
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers {np.flatnonzero(clocks.state == IDLE).tolist()} "
                               f"did not start within {timeout} s")
        time.sleep(0.001)


def mark_failed(spec: WorkerSpec) -> None:
    """Best effort: flag this worker FAILED in the shared clocks (after an exception)."""
    store = ParamStore.attach(spec.control)
    try:
        Clocks(store.views()).set_state(spec.rank, FAILED)
    finally:
        store.close()
