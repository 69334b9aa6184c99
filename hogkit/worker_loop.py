"""The worker loop: ``wait → read → gradient → guard → filter → apply → tick → record``.

One function, :func:`step`, is one iteration of one worker; :func:`run_worker` is the
process body the runtime spawns (through :mod:`hogkit._worker`, which caps threads
first). Everything a worker shares with others is in three shared-memory stores
attached by handle: parameters, data, and control (clocks, staleness log, and the
runtime's own per-worker counters). Every shared slot has one writer: worker ``w``
writes only row ``w`` of the control arrays; the parent writes only the stop flag
and FAILED marks.

Races here are the object of study, not bugs: the gradient reads parameters while
other workers write them (Hogwild!), and the apply kernel's read-modify-write of a
row is not atomic, so concurrent updates to one element can be lost. The reader
measures how stale each read was; the simulator (virtual time) is the deterministic
twin.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from hogkit.clocks import DONE, FAILED, IDLE, RUNNING, Clocks
from hogkit.errors import NonFiniteGradient
from hogkit.policy import LocalSGD, local_delta, merge
from hogkit.reader import Reader, StalenessLog
from hogkit.rules import grads_finite
from hogkit.store import ParamStore

#: Control arrays the runtime itself owns (besides clocks and the staleness log), each
#: row written by one worker only:
#: rt_wait_ns: time spent in policy.wait; rt_busy_ns: time in the loop in total;
#: rt_nonfinite: gradients skipped as non-finite; rt_step: the step being run now;
#: rt_samples: samples processed; rt_t0_ns / rt_t1_ns: monotonic time the worker left
#: the start barrier / finished its loop (the run's wall time excludes start-up);
#: rt_speed: (2, W) published speeds (samples/s) for the
#: adaptive batch, double-buffered by iteration parity; rt_grants: DSSP's histogram of
#: granted extra iterations, written when the worker finishes.
RT_FIELDS = ("rt_wait_ns", "rt_busy_ns", "rt_nonfinite", "rt_step", "rt_samples",
             "rt_t0_ns", "rt_t1_ns")
GRANT_BINS = 64


def runtime_specs(workers: int) -> dict:
    specs = {name: ((workers,), np.int64) for name in RT_FIELDS}
    specs["rt_speed"] = ((2, workers), np.float64)
    specs["rt_grants"] = ((workers, GRANT_BINS), np.int64)
    return specs


@dataclass
class WorkerSpec:
    """Everything one worker needs; pickled by the parent, loaded in the child."""
    rank: int
    workers: int
    seed: int
    steps: Optional[int]            # this worker's share of the steps, None = until stop
    workload: Any
    rule: Any
    policy: Any
    density: Any
    batch: Any                      # int (fixed per worker) or a hogkit.batching object
    params: Any                     # StoreHandle
    data: Any                       # StoreHandle
    control: Any                    # StoreHandle
    nonfinite: str = "raise"
    global_batch: int = 0           # B of a batching object (0 for an int batch)
    epoch_steps: int = 0            # iterations per epoch, for EpochBalancedBatch
    shards: int = 1
    wait_timeout: float = 60.0
    delay: Any = None               # a hogkit.delays model or None
    parent_pid: int = 0
    extra: dict = field(default_factory=dict)


class _Worker:
    """State of one worker between steps (private to its process)."""

    def __init__(self, spec: WorkerSpec, params, data, control):
        self.spec = spec
        self.rank = spec.rank
        self.shared = params
        self.clocks = Clocks(control)
        self.log = StalenessLog(control)
        self.shards = spec.shards
        self.param_index = {name: i for i, name in enumerate(sorted(params))}
        self.reader = Reader(self.clocks, self.log, spec.rank, shards=spec.shards > 1)
        self.control = control
        self.wait_ns = control["rt_wait_ns"]
        self.busy_ns = control["rt_busy_ns"]
        self.nonfinite = control["rt_nonfinite"]
        self.step_slot = control["rt_step"]
        self.samples = control["rt_samples"]
        self.local = _LocalPhase(spec, params) if isinstance(spec.policy, LocalSGD) else None
        # Under LocalSGD the gradient reads, and the rule writes, a private replica.
        self.params = self.local.replica if self.local is not None else params
        self.ctx = spec.workload.setup(self.params, data, rank=spec.rank, seed=spec.seed)
        self.rule_state = spec.rule.init(self.params)
        self.density_state = (spec.density.init(self.params)
                              if spec.density is not None else None)
        self.rng = np.random.default_rng([spec.seed, spec.rank])
        self.delay = spec.delay.start(spec.seed, spec.rank) if spec.delay is not None else None
        self.keep_read = bool(getattr(spec.rule, "needs_read", False))
        self.sizer = None if isinstance(spec.batch, (int, np.integer)) else spec.batch
        self.mean_reduced = getattr(spec.workload, "grad_reduction", "mean") == "mean"

    def _batch(self, k: int):
        """This iteration's batch size and gradient weight (1.0 for a fixed batch)."""
        if self.sizer is None:
            return int(self.spec.batch), 1.0
        speeds = self.control["rt_speed"][(k - 1) % 2]
        b = int(self.sizer.sizes(speeds)[self.rank])
        if not self.mean_reduced:      # summed gradients already grow with b
            return b, 1.0
        return b, self.spec.workers * b / self.spec.global_batch

    def _observe(self, k, b, compute_ns):
        sizer = self.sizer
        sizer.observe(self.rank, b, max(compute_ns, 1) * 1e-9)
        if self.spec.epoch_steps and (k + 1) % self.spec.epoch_steps == 0:
            sizer.end_epoch(self.rank)
        self.control["rt_speed"][k % 2, self.rank] = sizer.speed(self.rank)

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

    def step(self, k: int) -> bool:
        """Run iteration ``k``. Returns False if the run is stopping."""
        spec, rank, clocks = self.spec, self.rank, self.clocks
        t0 = time.perf_counter_ns()
        self.step_slot[rank] = k
        spec.policy.wait(clocks, rank, timeout=spec.wait_timeout)
        t1 = time.perf_counter_ns()
        self.wait_ns[rank] += t1 - t0
        if clocks.stopping():
            self.busy_ns[rank] += t1 - t0
            return False
        b, weight = self._batch(k)
        if self.local is None:
            self.reader.read()
        grads = spec.workload.gradient(self.ctx, self.rng, b, keep_read=self.keep_read)
        if self.delay is not None:
            self.delay.pause(time.perf_counter_ns() - t1)
        if self.sizer is not None:
            self._observe(k, b, time.perf_counter_ns() - t1)
        self.samples[rank] += b
        if not grads_finite(grads):
            if spec.nonfinite == "raise":
                raise NonFiniteGradient.at(f"worker {rank}", k)
            self.nonfinite[rank] += 1
        else:
            if weight != 1.0:
                for g in grads:
                    g.values *= weight
            if self.density_state is not None:
                grads = spec.density.filter(grads, self.density_state, step=k)
            if not grads:
                pass    # held back (temporal density): nothing written, not an update
            elif self.local is None:
                touched = self._shards_of(grads) if self.shards > 1 else None
                gap = self.reader.gap(touched) if touched is not None else self.reader.gap()
                spec.rule.apply(self.params, grads, self.rule_state, staleness=gap,
                                worker=rank)
                clocks.tick_update(rank, touched)
                self.reader.commit(k, gap)
            else:
                spec.rule.apply(self.params, grads, self.rule_state, staleness=0,
                                worker=rank)
        if self.local is not None and spec.policy.merges_after(k):
            self.merge(k)
        clocks.tick_iteration(rank)
        clocks.beat(rank)
        self.busy_ns[rank] += time.perf_counter_ns() - t0
        return True

    def merge(self, k: int) -> None:
        """LocalSGD: merge the local phase into the shared model; staleness of a merge
        = merges by other workers since this phase pulled the shared model."""
        gap = self.reader.gap()
        self.local.merge()
        self.clocks.tick_update(self.rank)
        self.reader.commit(k, gap)
        self.reader.read()

    def finish(self, k: int) -> None:
        if self.local is not None:
            if self.local.pending():
                self.merge(k)
            self.local.close()
        grants = getattr(self.spec.policy, "grants", None)
        if grants is not None:
            row = self.control["rt_grants"][self.rank]
            for r, n in grants(self.rank).items():
                row[min(int(r), GRANT_BINS - 1)] += n


class _LocalPhase:
    """LocalSGD's private replica and its merges (HLSGD, Zhou et al. 2020).

    Without overlap, a merge adds ``(replica − base) / W`` to the shared model and
    pulls it back: ``replica = base = shared``. With overlap, the merge runs in a
    thread while the next local phase goes on from the current replica; at the next
    merge point the worker joins it and *rebases* the steps taken meanwhile onto the
    merged model it got back: ``replica ← S + (replica − committed)``, ``base ← S``.
    The merge itself is a lock-free add (racy by design, like every Hogwild! write).
    Known limit: with overlap, the staleness recorded for a merge counts others'
    merges since the previous merge point, not since the older snapshot S the phase
    was rebased on, so it can read up to one phase low.
    """

    def __init__(self, spec, shared):
        self.shared = shared
        self.workers = spec.workers
        self.overlap = spec.policy.overlap
        self.replica = {k: v.copy() for k, v in shared.items()}
        self.base = {k: v.copy() for k, v in shared.items()}
        self.thread = None
        self.result = None
        self.error = None
        self.steps = 0

    def pending(self) -> bool:
        return any(not np.array_equal(self.replica[k], self.base[k]) for k in self.replica)

    def _merge_into_shared(self, delta):
        try:
            for name, d in delta.items():
                merge(self.shared[name], d, workers=self.workers)
            self.result = {k: v.copy() for k, v in self.shared.items()}
        except BaseException as e:  # noqa: BLE001 - re-raised in the worker by close()
            self.error = e

    def merge(self) -> None:
        if not self.overlap:
            self._merge_into_shared({k: local_delta(self.replica[k], self.base[k])
                                     for k in self.replica})
            for k, v in self.result.items():
                self.replica[k][...] = v
                self.base[k][...] = v
            return
        self.close()                      # join the previous merge, rebase onto it
        if self.result is not None:
            for k in self.replica:        # base holds the replica as last committed
                self.replica[k] += self.result[k] - self.base[k]
                self.base[k][...] = self.result[k]
        delta = {k: local_delta(self.replica[k], self.base[k]) for k in self.replica}
        for k in self.replica:            # commit: progress from here is the next delta
            self.base[k][...] = self.replica[k]
        self.thread = threading.Thread(target=self._merge_into_shared, args=(delta,),
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise RuntimeError("the overlapped LocalSGD merge failed") from error

    def pull(self) -> None:
        """Start a local phase from the shared model as it is now."""
        for k, v in self.shared.items():
            self.replica[k][...] = v
            self.base[k][...] = v


def run_worker(spec: WorkerSpec) -> None:
    """Process body: attach, loop until the steps are done or the parent says stop."""
    stores = [ParamStore.attach(h) for h in (spec.params, spec.data, spec.control)]
    try:
        params, data, control = (s.views() for s in stores)
        if spec.workload.needs_torch:
            import torch
            torch.set_num_threads(1)
        worker = _Worker(spec, params, data, control)
        clocks = worker.clocks
        clocks.set_state(spec.rank, RUNNING)
        clocks.beat(spec.rank)
        _start_barrier(clocks, spec.wait_timeout)
        control["rt_t0_ns"][spec.rank] = time.monotonic_ns()
        if worker.local is not None:
            worker.local.pull()    # the first local phase starts from the model now
        worker.reader.read()       # ...and its staleness is counted from here
        parent = spec.parent_pid
        k = 0
        while spec.steps is None or k < spec.steps:
            if not worker.step(k):
                break
            k += 1
            if k & 63 == 0 and parent and os.getppid() != parent:
                break  # orphaned: PDEATHSIG normally kills us first
        worker.finish(k)
        control["rt_t1_ns"][spec.rank] = time.monotonic_ns()
        clocks.set_state(spec.rank, DONE)
    finally:
        for s in stores:
            s.close()


def _start_barrier(clocks, timeout):
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
