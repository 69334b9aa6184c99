"""``train()``: a supervised Hogwild! run on real processes over shared memory.

The parent owns everything shared: it builds the workload's data and initial
parameters, puts them in shared-memory stores (parameters, data, control), compiles
the numba kernels once (workers then load them from numba's cache), spawns the
workers with the ``spawn`` start method and capped thread pools, and supervises
them on their process sentinels. It evaluates the loss on the live parameters now
and then, drains the staleness log into ``events.jsonl``, and, at the end, returns
a :class:`~hogkit.engine.run.Run` with the final snapshot.

Shutdown is ordered and happens on every exit path (done, worker failure,
SIGINT/SIGTERM to the parent, an exception in the parent): stop flag → grace →
SIGTERM → grace → SIGKILL → unlink every segment. Workers ignore SIGINT and are
killed by the kernel if the parent dies (``PR_SET_PDEATHSIG``); if the parent is
SIGKILLed the multiprocessing resource tracker unlinks the segments it created.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import sys
import tempfile
import threading
import time

import numpy as np

from hogkit.engine import entry as _worker
from hogkit.state import worker_state
from hogkit.state.clocks import DONE, FAILED, IDLE, RUNNING, Clocks
from hogkit.state.checkpoint import load_into
from hogkit.errors import Interrupted, InvalidArgument, WorkerFailed
from hogkit.kernels import step as _ks
from hogkit.engine.mainguard import check_main_guard
from hogkit.engine.plan import EVENTS_FILE_PER_S, eval_interval, make_plan
from hogkit.state.reader import StalenessLog
from hogkit.report import EventLog, environment, write_outputs
from hogkit.state.resume import (CARRIED_STATS, CHECKPOINT, RunState, check_compatible,
                           load_state, pack_hist, remaining, unpack_hist)
from hogkit.engine.run import Run
from hogkit.state.store import ParamStore, sweep_dead_segments
from hogkit.validation import check_choice, check_float, check_int
from hogkit.workloads.base import metrics_of
from hogkit.engine.worker_loop import WorkerSpec, control_specs, warm

ENGINES = ("auto", "compiled", "python")
BACKENDS = ("local", "ray")


@contextlib.contextmanager
def _child_env(threads):
    """Thread caps in os.environ while children are spawned (they inherit it)."""
    saved = {v: os.environ.get(v) for v in _worker.THREAD_VARS}
    try:
        _worker.cap_threads(threads)
        yield
    finally:
        for v, old in saved.items():
            if old is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = old


@contextlib.contextmanager
def _parent_signals():
    """SIGINT/SIGTERM raise :class:`Interrupted` in the supervisor (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class _signals_deferred:
    """Shutdown must not be cut short by a second Ctrl-C, and a Ctrl-C that lands
    while the workers are being stopped must not be lost either: SIGINT/SIGTERM are
    held for the block and raised as :class:`Interrupted` when it ends, unless an
    exception is already on its way out (then that one wins; it is an interruption
    or a failure already). SIGKILL still works, and then the resource tracker
    unlinks the segments."""

    def __enter__(self):
        self.got, self.old = [], {}
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, lambda signum, frame: self.got.append(signum))
                        for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, kind, value, tb):
        for s, h in self.old.items():
            signal.signal(s, h)
        if self.got and kind is None and sys.exc_info()[0] is None:
            raise Interrupted(self.got[0])
        return False


def _signal_name(exitcode):
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return None


class _Supervisor:
    """The parent's side of a run: processes, stores, events, shutdown."""

    def __init__(self, workers, grace, restarts=0):
        self.workers = workers
        self.grace = grace
        self.restarts_left = restarts
        self.procs = []
        self.blobs = []
        self.finished = set()
        self.closed = False

    def _spawn(self, r):
        ctx = mp.get_context("spawn")
        with _child_env(1):
            p = ctx.Process(target=_worker.main, name=f"hogkit-worker-{r}", daemon=True,
                            args=(self.blobs[r], os.getpid(), 1, self.errfiles[r]))
            p.start()
        return p

    def start(self, specs, errdir):
        self.errfiles = [os.path.join(errdir, f"worker{r}.err") for r in range(self.workers)]
        self.blobs = [pickle.dumps(spec) for spec in specs]
        for r in range(self.workers):
            self.procs.append(self._spawn(r))

    def _restart(self, r, clocks, step):
        """Replace dead worker ``r`` by a fresh process on the same stores: it passes
        the start barrier at once (nobody is IDLE but itself) and goes on from its
        clock slot (its iterations so far count against its share of the steps)."""
        old = self.procs[r]
        info = {"rank": r, "exitcode": old.exitcode, "signal": _signal_name(old.exitcode),
                "step": step}
        old.close()
        clocks.state[r] = IDLE       # neither FAILED (peers would fail) nor RUNNING
        open(self.errfiles[r], "w").close()
        self.procs[r] = self._spawn(r)
        self.restarts_left -= 1
        return info

    def poll(self, clocks, step_slots, timeout):
        """Wait up to ``timeout`` for a worker to exit; raise WorkerFailed on failure,
        or replace the failed workers while restarts are left; returns the restarts."""
        alive = [p for r, p in enumerate(self.procs) if r not in self.finished]
        if not alive:
            return []
        ready = mp.connection.wait([p.sentinel for p in alive], timeout=timeout)
        failed = []
        for r, p in enumerate(self.procs):
            if r in self.finished or p.sentinel not in ready:
                continue
            p.join()
            if p.exitcode == 0 and clocks.state[r] == DONE:
                self.finished.add(r)
                continue
            failed.append(r)
        if failed and self.restarts_left >= len(failed):
            return [self._restart(r, clocks, int(step_slots[r])) for r in failed]
        if failed:
            # A worker blocked on a failed peer fails too (WorkerFailed from its policy
            # wait), possibly before the peer has finished exiting. Blame the root
            # cause: a failure that is not secondary, else a peer that marked itself
            # FAILED (it does so before exiting), given a grace period to exit.
            root = [r for r in failed if not self._secondary(r)]
            if not root:
                marked = [r for r in range(self.workers)
                          if r not in failed and clocks.state[r] == FAILED]
                for r in marked:
                    self.procs[r].join(self.grace)
                root = [r for r in marked if not self.procs[r].is_alive()]
            r = (root or failed)[0]
            raise self.failure(r, clocks, int(step_slots[r]))
        return []

    def _secondary(self, r):
        try:
            with open(self.errfiles[r]) as f:
                last = f.read().strip().splitlines()[-1:]
        except (OSError, IndexError):
            return False
        return bool(last) and last[0].startswith(("hogkit.errors.WorkerFailed",
                                                   "hogkit.errors.PolicyTimeout"))

    def check_heartbeats(self, clocks, step_slots, limit_s):
        """A RUNNING worker whose last beat is older than ``limit_s`` is hung (or
        stopped with SIGSTOP): fail the run rather than wait forever."""
        now = time.monotonic_ns()
        for r in range(self.workers):
            if r in self.finished or clocks.state[r] != RUNNING:
                continue
            age = (now - int(clocks.heartbeat_ns[r])) * 1e-9
            if age > limit_s:
                raise self.failure(r, clocks, int(step_slots[r]),
                                   reason=f"sent no heartbeat for {age:.0f} s (hung or "
                                          f"stopped); raise wait_timeout if one step can "
                                          f"take that long")

    def failure(self, r, clocks, step=None, reason=""):
        p = self.procs[r]
        clocks.state[r] = FAILED
        tb = ""
        try:
            with open(self.errfiles[r]) as f:
                tb = f.read()
        except OSError:
            pass
        if not reason and p.exitcode == 0:
            reason = "exited before finishing its steps"
        return WorkerFailed(r, step=step, exitcode=p.exitcode,
                            signal=_signal_name(p.exitcode), traceback=tb, reason=reason)

    @property
    def done(self):
        return len(self.finished) == self.workers

    def shutdown(self, clocks):
        """Stop flag → grace → SIGTERM → grace → SIGKILL; reaps every process.

        Idempotent: the failure path and the final ``finally`` may both call it."""
        if self.closed:
            return
        self.closed = True
        if clocks is not None:
            clocks.request_stop()
        deadline = time.monotonic() + self.grace
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        live = [p for p in self.procs if p.is_alive()]
        for p in live:
            p.terminate()
        deadline = time.monotonic() + self.grace
        for p in live:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in live:
            if p.is_alive():
                p.kill()
                p.join()
        for p in self.procs:
            p.close()


def _per_worker(clocks, log, control, workers):
    out = []
    rt = control["rt"]
    for r in range(workers):
        busy = int(rt[r, _ks.RT_BUSY])
        wait = int(rt[r, _ks.RT_WAIT])
        compute, paused = int(rt[r, _ks.RT_COMPUTE]), int(rt[r, _ks.RT_PAUSED])
        st = log.summary(r)
        row = {"rank": r, "updates": int(clocks.updates[r]),
               "iterations": int(clocks.iterations[r]),
               "samples": int(rt[r, _ks.RT_SAMPLES]),
               "wait_fraction": round(wait / busy, 4) if busy else 0.0,
               "nonfinite_skipped": int(rt[r, _ks.RT_NONFINITE]),
               "held_back": int(rt[r, _ks.RT_HELD]),
               "staleness": {"update_gap": st["gap"], "clock_lag": st["lag"]}}
        if compute:
            # what a straggler model actually did: (compute + pauses) / compute
            row["slowdown_realised"] = round((compute + paused) / compute, 4)
        out.append(row)
    return out


def train(workload="mf", *, workers=2, policy=None, rule=None, density=None, batch=None,
          steps=None, seconds=None, seed=0, nonfinite="raise", stragglers=None,
          eval_every="auto", out=None, progress=None, wait_timeout=60.0, grace=2.0,
          workload_options=None, keep_params=True, shards=1, engine="auto",
          events="sampled", checkpoint_every="auto", resume=None, on_failure="stop",
          max_restarts=3, backend="local", nodes=1, address=None, servers=1, sync_every=1,
          push_fraction=1.0, backlog=None, schedule=None) -> Run:
    """Train ``workload`` with ``workers`` processes sharing one parameter store.

    Parameters
    ----------
    workload : str or Workload
        ``"mf"``, ``"logreg"``, ``"mlp"`` (see :mod:`hogkit.workloads`) or an object
        with ``build/setup/gradient/loss``. ``workload_options`` go to its constructor.
    workers : int
        Number of worker processes (≥ 1).
    policy : consistency policy, default ``Async()`` (Hogwild!).
    rule : update rule, default ``SGD(lr=workload.default_lr)``.
    density : optional ``Density`` filter applied to each update before the rule.
    batch : samples per gradient, default ``workload.default_batch``.
    steps, seconds : stop after ``steps`` iterations in total (split evenly over the
        workers) and/or after ``seconds`` of wall time, whichever comes first.
    nonfinite : ``"raise"`` (the run stops with the worker's rank and step) or
        ``"skip"`` (the update is dropped and counted). Either way, nothing
        non-finite reaches the shared parameters.
    stragglers : ``{rank: delay model}`` from :mod:`hogkit.engine.delays`.
    eval_every : seconds between loss evaluations on the live parameters; "auto"
        (every 0.5 s), or None (only at the start and the end).
    out : folder for ``summary.json``, ``events.jsonl``, ``loss.csv``, plots and
        ``checkpoint.npz``; None writes nothing.
    events : what ``events.jsonl`` keeps of the per-update staleness events:
        ``"sampled"`` (default: at most 400 a second of run time, evenly spread, so a
        long run's file stays small), ``"all"`` (every event the workers' rings hold:
        tens of MB a minute), ``"none"``. The histograms and the summary count every
        update whatever this says; ``summary["events"]`` says what the file holds.
    progress : show a tqdm bar (None: only when stderr is a terminal).
    shards : per-shard staleness (docs/algorithms.md §1). With S > 1, each parameter's rows
        are cut into S contiguous ranges and clocks count updates per shard; the gap
        recorded for a sparse update counts only updates by others that touched one
        of its shards (the largest such count over its shards), so rows nobody else
        wrote read as fresh. Dense updates touch every shard.
    engine : ``"auto"`` (default: the compiled step core wherever it can run the
        workload and knobs, else the Python step with a one-line notice),
        ``"compiled"`` (refuse what it cannot run) or ``"python"`` (the reference
        path). The summary says which ran (:mod:`hogkit.engine.step`).
    checkpoint_every : seconds between fuzzy checkpoints of the live parameters and
        the run's state into ``out/checkpoint.npz`` (:mod:`hogkit.state.resume`); "auto": 60
        when ``out`` is given; None: only the quiesced one at the end.
    on_failure : ``"stop"`` (default: the first worker that dies ends the run with
        :class:`WorkerFailed`) or ``"restart"``: a worker that exits or is killed is
        replaced by a fresh process on the same stores that goes on from the shared
        clocks (its iterations so far count; a BSP/SSP peer waits for it as for a slow
        worker), at most ``max_restarts`` times in the run; every restart is in the
        events and in ``summary["restarts"]``. A hung worker (no heartbeat) still
        stops the run.
    resume : a results folder of an earlier run of the same workload, options, workers
        and shards (a crashed or killed one, or one to extend with a larger budget):
        go on from its checkpoint with the budget that is left (``steps`` and
        ``seconds`` count the whole run); results go to that folder unless ``out``
        says otherwise, and the summary covers the whole run.
    backend : ``"local"`` (default: this machine's shared memory) or ``"ray"``: ``nodes``
        nodes of ``workers`` workers each, every node a single-node run whose agent
        exchanges deltas with ``servers`` parameter-shard actors every ``sync_every``
        iterations of its clock (sending the largest ``push_fraction`` of each
        delta's entries, the rest later), the policy's bound held across nodes;
        ``address`` None starts a local Ray instance for the run, ``"auto"`` or
        ``"ray://host:port"`` joins a cluster (:mod:`hogkit.cluster`). ``steps`` and
        straggler ranks are over the whole cluster. Under Async, ``backlog=b`` keeps
        each node at most b iterations ahead of its last exchange. ``schedule`` (a
        :class:`~hogkit.p3.propagation.Schedule` or ``"fifo"``, ``"slicing:N"``,
        ``"priority"``, ``"p3:N"``) cuts each exchange into messages of about N
        parameters, sent input side first under priority and p3, each merged as
        it arrives; None (default): one message per shard.

    Raises
    ------
    InvalidArgument / InvalidType for bad settings (before anything is spawned),
    WorkerFailed when a worker dies or raises (with its rank, signal or exit code
    and traceback), Interrupted on SIGINT/SIGTERM. In every case the workers are
    stopped and no shared-memory segment is left behind.
    """
    check_main_guard("hogkit.train()")
    check_choice("backend", backend, BACKENDS)
    if backend == "ray":
        from hogkit.cluster import train_cluster
        return train_cluster(
            workload, nodes=nodes, workers=workers, address=address, servers=servers,
            sync_every=sync_every, push_fraction=push_fraction, backlog=backlog,
            schedule=schedule, stragglers=stragglers,
            steps=steps, out=out, keep_params=keep_params, eval_every=eval_every,
            resume=resume, on_failure=on_failure, checkpoint_every=checkpoint_every,
            engine=engine, wait_timeout=wait_timeout, grace=grace, policy=policy,
            rule=rule, density=density, batch=batch, seconds=seconds, seed=seed,
            nonfinite=nonfinite, shards=shards, workload_options=workload_options,
            events=events)
    if nodes != 1 or address is not None or schedule is not None:
        raise InvalidArgument(f"nodes={nodes!r}, address={address!r}, schedule={schedule!r} "
                              f'are for a cluster run: add backend="ray" (a local run has '
                              f"no exchange to schedule)")
    check_choice("on_failure", on_failure, ("stop", "restart"))
    max_restarts = check_int("max_restarts", max_restarts, min_value=0)
    wait_timeout = check_float("wait_timeout", wait_timeout, min_value=0.0, exclude_min=True)
    grace = check_float("grace", grace, min_value=0.0)
    resumed = None
    if resume is not None:
        resumed = load_state(resume)
        out = os.fspath(resume) if out is None else out
    plan = make_plan(workload, workers=workers, policy=policy, rule=rule, density=density,
                     batch=batch, steps=steps, seconds=seconds, seed=seed,
                     nonfinite=nonfinite, stragglers=stragglers, eval_every=eval_every,
                     shards=shards, out=out, workload_options=workload_options,
                     keep_params=keep_params, events=events, spawn=True)
    if checkpoint_every == "auto":
        checkpoint_every = 60.0 if plan.out is not None else None
    elif checkpoint_every is not None:
        checkpoint_every = check_float("checkpoint_every", checkpoint_every, min_value=0.0,
                                       exclude_min=True, fix='seconds, "auto" or None')
    if checkpoint_every is not None and plan.out is None:
        raise InvalidArgument("checkpoint_every needs out= (the folder the checkpoints go "
                              "to)")
    engine = choose_engine(engine, plan.workload, rule=plan.rule, density=plan.density,
                           batch=plan.batch, shards=plan.shards, policy=plan.policy,
                           stragglers=plan.stragglers)
    budget = (plan.steps, plan.seconds)
    if resumed is not None:
        _, state, meta = resumed
        check_compatible(meta, plan.config())
        left_steps, left_seconds = remaining(plan.steps, plan.seconds, state)
        plan = dataclasses.replace(plan, steps=left_steps, seconds=left_seconds,
                                   stream=state.segment + 1)
    live = _Live(plan, engine, wait_timeout=wait_timeout, grace=grace,
                 checkpoint_every=checkpoint_every, on_failure=on_failure,
                 max_restarts=max_restarts,
                 resume=None if resumed is None else (os.fspath(resume), *resumed[1:]))
    live.config.update(steps=budget[0], seconds=budget[1])
    if resumed is not None:
        live.config["segments"] = plan.stream + 1
    return live.run(progress)


class _Live:
    """One live run of a plan: share, supervise, collect. :func:`hogkit.spawning.spawn`
    runs a user's own loop through the same supervision (a subclass that shares a
    module and spawns the user's function)."""

    #: extra clock rows no process of this run writes (a cluster node's gate:
    #: ``worker_loop.control_specs``)
    gate_rows = 0

    def __init__(self, plan, engine, *, wait_timeout, grace, checkpoint_every=None,
                 resume=None, on_failure="stop", max_restarts=0):
        self.plan, self.engine = plan, engine
        self.on_failure, self.max_restarts = on_failure, max_restarts
        self.restarts = []
        self.wait_timeout, self.grace = wait_timeout, grace
        self.checkpoint_every = checkpoint_every
        self.resume_dir, prev, self.prev_meta = resume or (None, None, {})
        self.prev = prev if prev is not None else RunState()
        self.wstore = self.wviews = None
        self.restored = []
        self.config = plan.config(engine=engine, environment=environment())
        self.curve = []
        self.dropped = 0
        self.events = None
        self.sampler = _EventSampler(getattr(plan, "events", "sampled"))

    def run(self, progress) -> Run:
        p = self.plan
        from hogkit.doctor import preflight
        preflight(p.workers)
        sweep_dead_segments()
        with contextlib.ExitStack() as stack:
            initial_loss = self._share(stack)
            self.curve = [{"t": 0.0, "updates": 0, "loss": initial_loss}]
            if p.out is not None:
                os.makedirs(p.out, exist_ok=True)
                self.events = EventLog(os.path.join(p.out, "events.jsonl"))
                stack.callback(self.events.close)
            errdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="hogkit-err-"))
            self.cstore = stack.enter_context(ParamStore.create(
                control_specs(p.workers, self._shards(), gate=self.gate_rows), tag="ctl"))
            self.control = self.cstore.views()
            self.clocks, self.log = Clocks(self.control), StalenessLog(self.control)
            self._carry_over()
            self._started(stack)
            start = {"type": "start" if self.resume_dir is None else "resume",
                     "t": self.prev.t, "config": self.config, "initial_loss": initial_loss}
            if self.resume_dir is not None:
                start["worker_state"] = len(self.restored)
            self._event(start)
            wall = self._supervise(errdir, progress)
            return self._collect(initial_loss, wall)

    def _share(self, stack) -> float:
        """Build the workload, compile its kernels, put parameters and data in shared
        memory; returns the initial loss."""
        p = self.plan
        wl = p.workload
        params0, data0 = wl.build(p.seed)
        if self.resume_dir is not None:          # checked before anything is written
            load_into(params0, os.path.join(self.resume_dir, CHECKPOINT),
                      what="the workload's parameters")
        warm(wl, p.rule, p.density, params0, data0, p.seed, p.worker_batch(), self.engine)
        initial_loss = float(wl.loss(params0, data0))
        self.pstore = stack.enter_context(ParamStore.create(params0, tag="params"))
        self.dstore = stack.enter_context(ParamStore.create(data0, tag="data"))
        self.params, self.data = self.pstore.views(), self.dstore.views()
        self.wstore = stack.enter_context(ParamStore.create(
            worker_state.initial(p.rule, p.density, params0, p.workers), tag="wstate"))
        self.wviews = self.wstore.views()
        if self.resume_dir is not None:
            saved = worker_state.load_state(self.resume_dir,
                                            self.prev_meta.get("worker_state"))
            if saved is not None:
                self.restored = worker_state.load_into(self.wviews, saved)
        return initial_loss

    def _started(self, stack):
        """Every store exists, no worker yet: a subclass's hook (a cluster node starts
        its agent here, :mod:`hogkit.cluster.node`)."""

    def _shards(self):
        p = self.plan
        return p.shards * len(self.params) if p.shards > 1 else 1

    def _loss(self) -> float:
        """The loss on the live parameters."""
        return float(self.plan.workload.loss(self.params, self.data))

    def _metrics(self) -> dict:
        """The workload's metrics on the final parameters (``loss`` and more)."""
        return metrics_of(self.plan.workload, self.params, self.data)

    def _specs(self):
        p = self.plan
        return [WorkerSpec(rank=r, plan=p, steps=n, params=self.pstore.handle,
                           data=self.dstore.handle, control=self.cstore.handle,
                           state=self.wstore.handle,
                           step0=int(self.prev.iterations[r] if self.prev.iterations else 0),
                           engine=self.engine, wait_timeout=self.wait_timeout,
                           parent_pid=os.getpid())
                for r, n in enumerate(p.quotas())]

    def _event(self, record):
        if self.events is not None:
            self.events.write([record])

    def _supervise(self, errdir, progress) -> float:
        """Spawn the workers and watch them until they are done; returns the training
        time (first worker out of the start barrier to the last one done: spawning and
        imports excluded, so rates compare across workloads). Every exit path shuts
        the workers down in order."""
        p, clocks = self.plan, self.clocks
        sup = _Supervisor(p.workers, self.grace,
                          restarts=self.max_restarts if self.on_failure == "restart" else 0)
        cursors = np.zeros(self.log.workers, dtype=np.int64)
        bar = _progress_bar(progress, p.steps, p.seconds)
        rt = self.control["rt"]
        t0_ns = rt[:, _ks.RT_T0]
        every, _ = eval_interval(p, live=True)
        started = None                # when the first worker left the start barrier
        try:
            with _parent_signals():
                sup.start(self._specs(), errdir)
                next_beat_check = time.monotonic() + self.wait_timeout
                next_eval = next_ckpt = math.inf
                stop_sent = False
                try:
                    while not sup.done:
                        for info in sup.poll(clocks, clocks.step, 0.05):
                            t = time.monotonic() - started if started is not None else 0.0
                            info["t"] = round(t + self.prev.t, 4)
                            self.restarts.append(info)
                            self._event({"type": "restart", **info})
                        now = time.monotonic()
                        if now >= next_beat_check:
                            sup.check_heartbeats(clocks, clocks.step, self.wait_timeout)
                            next_beat_check = now + 1.0
                        if started is None:
                            if not t0_ns.all():
                                continue          # still starting up: nothing to time
                            started = t0_ns.min() * 1e-9
                            next_eval = started + every
                            next_ckpt = started + (self.checkpoint_every or math.inf)
                        if (p.seconds is not None and not stop_sent
                                and now - started >= p.seconds):
                            clocks.request_stop()
                            stop_sent = True
                        if now >= next_eval:
                            self._evaluate(round(now - started, 4))
                            next_eval = now + every
                        if now >= next_ckpt:
                            self._checkpoint(now - started, "fuzzy")
                            next_ckpt = time.monotonic() + self.checkpoint_every
                        cursors = self._drain(cursors)
                        if bar is not None:
                            bar.n = (round(min(now - started, p.seconds), 1)
                                     if p.steps is None and p.seconds is not None
                                     else int(clocks.iterations.sum()))
                            bar.refresh()
                except WorkerFailed as failure:
                    with _signals_deferred():
                        sup.shutdown(clocks)
                    t_fail = time.monotonic() - started if started is not None else 0.0
                    self._event({"type": "failure", "t": round(t_fail, 4),
                                 "rank": failure.rank, "signal": failure.signal,
                                 "exitcode": failure.exitcode})
                    raise
                wall = (rt[:, _ks.RT_T1].max() - t0_ns.min()) * 1e-9
        finally:
            with _signals_deferred():
                if bar is not None:
                    bar.close()
                sup.shutdown(clocks)
        self._drain(cursors)
        return float(wall)

    def _evaluate(self, t, *, event=True):
        loss = self._loss()
        self.curve.append({"t": t, "updates": int(self.clocks.updates.sum()), "loss": loss})
        if event:                         # whole-run time and updates (resumed segments)
            self._event({"type": "eval", "t": round(t + self.prev.t, 4),
                         "updates": self.curve[-1]["updates"] + sum(self.prev.updates),
                         "loss": loss})
        return loss

    def _drain(self, cursors):
        if self.events is not None:
            new, cursors, lost = self.log.drain(cursors)
            self.dropped += lost
            kept = self.sampler.keep(new)
            if kept:
                self.events.write([{"type": "update", **e} for e in kept])
        return cursors

    # ---- checkpoints and resumed segments (hogkit.state.resume)

    def _carry_over(self):
        """A resumed segment starts its histograms and exact stats where the run was."""
        prev = self.prev
        if not prev.gap_hist:
            return
        unpack_hist(prev.gap_hist, self.log.gap_hist)
        unpack_hist(prev.lag_hist, self.log.lag_hist)
        for w, row in enumerate(prev.stats):
            for col, v in zip(CARRIED_STATS, row):
                self.log.stats[w, col] = v

    def _counts(self):
        """Per-worker counters of the whole run so far (earlier segments added)."""
        prev, W, rt = self.prev, self.plan.workers, self.control["rt"]

        def plus(old, cur):
            return [int(c) + (int(old[r]) if old else 0) for r, c in enumerate(cur)]
        return {"iterations": plus(prev.iterations, self.clocks.iterations[:W]),
                "updates": plus(prev.updates, self.clocks.updates[:W]),
                "samples": plus(prev.samples, rt[:W, _ks.RT_SAMPLES]),
                "nonfinite": plus(prev.nonfinite, rt[:W, _ks.RT_NONFINITE]),
                "held": plus(prev.held, rt[:W, _ks.RT_HELD])}

    def _whole_curve(self):
        """The loss curve of the whole run: earlier segments, then this one shifted by
        their time and updates (its first point repeats their last and is dropped)."""
        prev = self.prev
        if not prev.curve:
            return list(self.curve)
        t0, u0 = prev.t, sum(prev.updates)
        return list(prev.curve) + [{"t": round(c["t"] + t0, 4), "updates": c["updates"] + u0,
                                    "loss": c["loss"]} for c in self.curve[1:]]

    def _state(self, t) -> RunState:
        counts = self._counts()
        return RunState(segment=getattr(self.plan, "stream", 0), t=self.prev.t + t,
                        curve=self._whole_curve(),
                        gap_hist=pack_hist(self.log.gap_hist),
                        lag_hist=pack_hist(self.log.lag_hist),
                        stats=[[int(self.log.stats[w, c]) for c in CARRIED_STATS]
                               for w in range(self.plan.workers)],
                        events_dropped=self.prev.events_dropped + int(self.dropped),
                        **counts)

    def _checkpoint(self, t, consistency):
        """Parameters and run state to ``out/checkpoint.npz`` (atomically); "fuzzy":
        copied while the workers write, labelled with the update counts it holds at
        most; "quiesced": every worker stopped."""
        state = self._state(t)
        meta = {}
        if self.wviews is not None:     # first, so a checkpoint never names a missing one
            meta["worker_state"] = seq = time.time_ns()
            worker_state.save_state(self.plan.out, self.wviews, seq)
        self.pstore.save(os.path.join(self.plan.out, CHECKPOINT),
                         meta={**meta, "consistency": consistency,
                               "updates": sum(state.updates),
                               "version_vector": state.updates, "seed": self.plan.seed,
                               "config": self.config, "state": state.to_meta()})
        self._event({"type": "checkpoint", "t": round(state.t, 4),
                     "consistency": consistency, "updates": sum(state.updates)})

    def _collect(self, initial_loss, wall) -> Run:
        """The run's result from the quiesced stores; written to ``out`` when given."""
        p, log, rt = self.plan, self.log, self.control["rt"]
        prev = self.prev
        for c in self.curve:       # a point taken after the last worker finished is at wall
            c["t"] = min(c["t"], round(wall, 4))
        final_loss = self._evaluate(round(wall, 4), event=False)   # the end event has it
        counts = self._counts()
        summary = log.summary()
        per_worker = _per_worker(self.clocks, log, self.control, p.workers)
        for r, row in enumerate(per_worker):
            row.update(updates=counts["updates"][r], iterations=counts["iterations"][r],
                       samples=counts["samples"][r],
                       nonfinite_skipped=counts["nonfinite"][r], held_back=counts["held"][r])
        whole_wall = prev.t + wall
        run = Run(config=self.config, workers=p.workers, updates=sum(counts["updates"]),
                  wall_s=whole_wall,
                  initial_loss=prev.curve[0]["loss"] if prev.curve else initial_loss,
                  final_loss=final_loss,
                  staleness={"update_gap": summary["gap"], "clock_lag": summary["lag"]},
                  per_worker=per_worker, loss_curve=self._whole_curve(),
                  params=self.pstore.snapshot() if p.keep_params else None,
                  out=p.out,
                  extra={"events_dropped": prev.events_dropped + int(self.dropped),
                         "nonfinite_skipped": sum(counts["nonfinite"]),
                         "samples": sum(counts["samples"]),
                         "engine": self.engine,
                         "events_recorded": int(log.cursor.sum()),
                         "events_stride": int(max(1, rt[:, _ks.RT_STRIDE].max()))})
        if self.resume_dir is not None:
            run.extra["segments"] = getattr(p, "stream", 0) + 1
        if self.on_failure == "restart":
            run.extra["restarts"] = self.restarts
        run.extra["metrics"] = self._metrics()
        if hasattr(p.policy, "grants"):
            g = self.control["rt_grants"].sum(axis=0)
            run.extra["dssp_grants"] = {str(r): int(n) for r, n in enumerate(g) if n}
        if p.out is not None:
            self._checkpoint(wall, "quiesced")
            self._event({"type": "end", "t": round(whole_wall, 4), "updates": run.updates,
                         "final_loss": final_loss})
            self.events.close()           # flushed, so the size below is the file's
            run.extra["events"] = self.sampler.summary(os.path.join(p.out, "events.jsonl"))
            write_outputs(run, p.out)
        return run


def choose_engine(engine, wl, *, rule, density, batch, shards=1, policy=None,
                  stragglers=None):
    """``"compiled"`` or ``"python"`` for ``engine`` = "auto" | "compiled" | "python":
    "auto" takes the compiled step core when it can run the knobs and says in one line
    (a :class:`~hogkit.errors.EngineNotice` warning) why not when it cannot."""
    import warnings

    from hogkit.errors import EngineNotice
    from hogkit.engine.step import compiled_support
    check_choice("engine", engine, ENGINES)
    if engine == "python":
        return "python"
    why = compiled_support(wl, rule=rule, density=density, batch=batch, shards=shards,
                           policy=policy, stragglers=stragglers)
    if why is None:
        return "compiled"
    if engine == "compiled":
        raise InvalidArgument(f"engine='compiled' cannot run {why}; use engine='auto' or "
                              f"'python'")
    if not getattr(wl, "needs_torch", False):     # torch workloads: Python is expected
        warnings.warn(f"hogkit: the Python step runs this: {why}", EngineNotice,
                      stacklevel=3)
    return "python"


class _EventSampler:
    """Which drained update events go to ``events.jsonl`` (``plan.events``): all, none,
    or a budget of :data:`~hogkit.engine.plan.EVENTS_FILE_PER_S` a second since the first
    drain, spent evenly over each batch (every k-th event)."""

    def __init__(self, mode):
        self.mode = mode
        self.seen = self.written = 0
        self.t0 = None

    def keep(self, new):
        n = len(new)
        self.seen += n
        if not n or self.mode == "none":
            return []
        if self.mode == "all":
            self.written += n
            return new
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        room = int(EVENTS_FILE_PER_S * (now - self.t0 + 1.0)) - self.written
        if room <= 0:
            return []
        if n > room:
            new = new[::math.ceil(n / room)]
        self.written += len(new)
        return new

    def summary(self, path):
        out = {"mode": self.mode, "updates_drained": self.seen,
               "updates_in_file": self.written}
        if path is not None and os.path.exists(path):
            out["file_bytes"] = os.path.getsize(path)
        return out


def _progress_bar(progress, steps, seconds):
    if progress is False:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return None
    total = steps if steps is not None else seconds
    unit = "s" if steps is None and seconds is not None else "it"
    return tqdm(total=total, unit=unit, disable=None if progress is None else not progress,
                dynamic_ncols=True, leave=False)
