"""A live run on this machine: :class:`LiveRun` shares a plan's stores, spawns and
supervises its workers, and collects the :class:`~hogkit.engine.run.Run`.

:func:`hogkit.train` is a plan handed to a ``LiveRun``; :func:`hogkit.spawn`
(:mod:`hogkit.spawning`) and a cluster node (:mod:`hogkit.cluster.node`) are subclasses
that override its hooks (see the class). Shutdown is ordered and happens on every exit
path (done, worker failure, SIGINT/SIGTERM to the parent, an exception in the parent):
stop flag → grace → SIGTERM → grace → SIGKILL → unlink every segment
(:mod:`hogkit.engine.supervisor`). Workers ignore SIGINT and are killed by the kernel if
the parent dies (``PR_SET_PDEATHSIG``); if the parent is SIGKILLed the multiprocessing
resource tracker unlinks the segments it created.

While the workers run, the parent evaluates the loss on the live parameters now and
then, drains the staleness log into ``events.jsonl`` (:class:`_EventSampler`), and
writes fuzzy checkpoints; a resumed segment (:mod:`hogkit.state.resume`) starts its
histograms, counters and loss curve where the run was.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time

import numpy as np

from hogkit.engine.plan import EVENTS_FILE_PER_S, eval_interval
from hogkit.engine.preflight import check_room, preflight, store_bytes
from hogkit.engine.progress import Progress
from hogkit.engine.run import Run, note_skipped
from hogkit.engine.supervisor import Supervisor, parent_signals, signals_deferred
from hogkit.engine.worker_loop import WorkerSpec, control_specs, warm
from hogkit.errors import InvalidArgument, Interrupted, WorkerFailed, exit_on_interrupt
from hogkit.kernels import layout as _kl
from hogkit.report import EventLog, environment, write_outputs
from hogkit.state import worker_state
from hogkit.state.checkpoint import load_into
from hogkit.state.clocks import Clocks
from hogkit.state.reader import StalenessLog
from hogkit.state.resume import CARRIED_STATS, CHECKPOINT, RunState, pack_hist, unpack_hist
from hogkit.state.store import ParamStore, sweep_dead_segments
from hogkit.validation import check_all_finite
from hogkit.workloads.base import metrics_of

__all__ = ["LiveRun"]


class LiveRun:
    """One live run of a plan on this machine: share, supervise, collect.

    ``LiveRun(plan, engine, ...).run(progress)`` puts the workload's parameters and data
    in shared memory, creates the control store (clocks, staleness rings, counters),
    spawns one worker per rank under a :class:`~hogkit.engine.supervisor.Supervisor`,
    evaluates, checkpoints and drains events while they run, and returns a
    :class:`~hogkit.engine.run.Run` (written to ``plan.out`` when it is set).

    Other runs are built on it by overriding its hooks (everything else, spawning,
    supervision, failures, shutdown and segment clean-up, is shared):

    - ``gate_rows``: extra clock rows no worker of this run writes (a cluster node's
      gate, :func:`~hogkit.engine.worker_loop.control_specs`);
    - ``_share(stack) -> initial loss``: put parameters (``self.pstore``,
      ``self.params``) and data (``self.dstore``, ``self.data``) in shared memory;
    - ``_started(stack)``: every store exists, no worker yet (a cluster node starts its
      agent here, :class:`hogkit.cluster.node.NodeRun`);
    - ``_specs() -> [spec]``: one picklable spec per rank, whose ``run()`` is the
      worker's body (:class:`~hogkit.engine.worker_loop.WorkerSpec`; a user's own loop
      in :mod:`hogkit.spawning`);
    - ``_supervise(errdir, progress) -> wall seconds``: spawn and watch the workers (a
      cluster node wraps it to finish its agent);
    - ``_loss()`` and ``_metrics()``: the loss on the live parameters, the metrics on the
      final ones.
    """

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
        self.ended = {"how": "done"}      # how the run ended: done, failed, interrupted...
        self._t_started = None            # when the first worker left the start barrier
        self._final_written = False       # the quiesced checkpoint of the ending is on disk

    def run(self, progress) -> Run:
        """Preflight, share, spawn, supervise, collect; ``progress``: what it shows while
        it goes (:mod:`hogkit.engine.progress`). Every store is released on every exit
        path."""
        p = self.plan
        self.progress = progress if isinstance(progress, Progress) else Progress(progress)
        preflight(p.workers)
        exit_on_interrupt()     # a script that does not catch it ends 130/143, one line
        sweep_dead_segments()
        with contextlib.ExitStack() as stack:
            initial_loss = self._share(stack)
            self.curve = [{"t": 0.0, "updates": 0, "loss": initial_loss}]
            if p.out is not None:
                os.makedirs(p.out, exist_ok=True)
                stack.enter_context(out_lock(p.out))
                self.events = EventLog(os.path.join(p.out, "events.jsonl"))
                stack.callback(self.events.close)
            errdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="hogkit-err-"))
            self.cstore = stack.enter_context(ParamStore.create(
                control_specs(p.workers, self._shards(len(self.params)),
                              gate=self.gate_rows), tag="ctl"))
            self.control = self.cstore.views()
            self.clocks, self.log = Clocks(self.control), StalenessLog(self.control)
            stack.callback(self._drop_views)     # first out: before the stores close
            self._carry_over()
            self._started(stack)
            start = {"type": "start" if self.resume_dir is None else "resume",
                     "t": self.prev.t, "config": self.config, "initial_loss": initial_loss}
            if self.resume_dir is not None:
                start["worker_state"] = len(self.restored)
            if self.events is not None and self.events.repaired:
                start["events_repaired_bytes"] = self.events.repaired
            self._event(start)
            try:
                wall = self._supervise(errdir, self.progress)
            except BaseException as e:
                self._keep_ending(initial_loss, e)
                raise
            if p.out is not None:
                self.progress.stage(f"training done; evaluating and writing the results "
                                    f"to {p.out}")
            run = self._collect(initial_loss, wall)
            if p.out is not None:
                self._write_out(run, wall)
            return run

    def _drop_views(self):
        """Let go of every view of the stores before they close, so each mapping (and
        the descriptor Python's mmap keeps) goes with the close, not with a later
        garbage collection: a process that runs many trainings holds no unlinked
        segment's memory of an earlier one."""
        self.params = self.data = self.control = self.wviews = None
        self.clocks = self.log = None

    def _keep_ending(self, initial_loss, err):
        """The run failed or was interrupted once its workers had been started; they are
        stopped now. Their parameters go to a final checkpoint and the summary is
        written, both labelled with how it ended, each where space allows; a note on
        ``err`` says what was kept (nothing here hides ``err``)."""
        out = self.plan.out
        if out is None or self.events is None:
            return
        self.ended = {"how": ending_of(err), "error": str(err).splitlines()[0][:500]}
        self.events.quiet = True          # a log the disk refused must not hide err
        wall = (time.monotonic() - self._t_started) if self._t_started is not None else 0.0
        try:
            run = self._collect(initial_loss, wall)
            self._write_out(run, wall)
        except BaseException as e2:       # a second signal, a full disk: err still wins
            kept = self._final_written and os.path.exists(os.path.join(out, CHECKPOINT))
            note = (f"kept: the parameters at the end in {os.path.join(out, CHECKPOINT)} "
                    f"(labelled {self.ended['how']!r}); the summary was not written: {e2}"
                    if kept else f"the final checkpoint was not written either: {e2}")
        else:
            note = (f"kept: the parameters at the end in {os.path.join(out, CHECKPOINT)} "
                    f"(labelled {self.ended['how']!r}; --resume {out} goes on from it) and "
                    f"summary.json, which says how the run ended")
        if hasattr(err, "add_note"):
            err.add_note(note)

    def _replication(self, p, params0, data0):
        """``p`` with ``replication="auto"`` decided on the built model
        (:func:`hogkit.engine.replication.resolve_auto`), recorded in the config."""
        from hogkit.engine.replication import resolve_auto
        p, chosen = resolve_auto(p, params0, data0)
        if chosen is not None:
            self.plan = p
            self.config["replication"] = chosen
        return p

    def _share(self, stack) -> float:
        """Build the workload, compile its kernels, put parameters and data in shared
        memory; returns the initial loss."""
        p = self.plan
        wl = p.workload
        planned = getattr(wl, "planned_bytes", lambda: None)()
        if planned:               # before anything is built (the exact sizes follow)
            check_room(int(planned))
        name = getattr(wl, "name", type(wl).__name__)
        self.progress.stage(f"building the {name} workload's parameters and data")
        params0, data0 = wl.build(p.seed)
        check_all_finite(data0, "the data", "clean or drop those values before training "
                         "(nothing was spawned)")
        if self.resume_dir is not None:          # checked before anything is written
            load_into(params0, os.path.join(self.resume_dir, CHECKPOINT),
                      what="the workload's parameters")
        check_all_finite(params0, "the checkpoint's parameters" if self.resume_dir
                         else "the initial parameters",
                         "resume from an earlier run folder or start afresh"
                         if self.resume_dir else "fix the workload's build() (its init)")
        p = self._replication(p, params0, data0)
        wstate = worker_state.initial(p.rule, p.density, params0, p.workers)
        check_room(store_bytes(params0, data0, wstate, control=control_specs(
            p.workers, self._shards(len(params0)), gate=self.gate_rows)))  # before compiling
        from hogkit.engine.step import lane_lr_scale
        self.progress.stage(f"compiling the {self.engine} engine's kernels (the first run "
                            f"on a machine compiles them, 10-20 s; later runs load them "
                            f"from numba's cache)")
        t = time.monotonic()
        warm(wl, p.rule, p.density, params0, data0, p.seed, p.worker_batch(), self.engine,
             lane=p.lane, lane_lr_scale=lane_lr_scale(p),
             local=p.local is not None)
        Interrupted.check()     # a signal whose raise numba's compile swallowed
        self.progress.stage(f"kernels ready ({time.monotonic() - t:.1f} s)")
        initial_loss = float(wl.loss(params0, data0))
        self.pstore = stack.enter_context(ParamStore.create(params0, tag="params"))
        self.dstore = stack.enter_context(ParamStore.create(data0, tag="data"))
        self.params, self.data = self.pstore.views(), self.dstore.views()
        self.wstore = stack.enter_context(ParamStore.create(wstate, tag="wstate"))
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

    def _shards(self, n_params):
        """Shard counters in the control store: one per (parameter, shard)."""
        p = self.plan
        return p.shards * n_params if p.shards > 1 else 1

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
        sup = Supervisor(p.workers, self.grace,
                          restarts=self.max_restarts if self.on_failure == "restart" else 0)
        cursors = np.zeros(self.log.workers, dtype=np.int64)
        progress.stage(f"starting {p.workers} worker process"
                       f"{'es' if p.workers != 1 else ''}")
        rt = self.control["rt"]
        t0_ns = rt[:, _kl.RT_T0]
        every, _ = eval_interval(p, live=True)
        started = None                # when the first worker left the start barrier
        try:
            with parent_signals():
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
                            started = self._t_started = t0_ns.min() * 1e-9
                            progress.stage("training" + (f" for {p.seconds:g} s"
                                                         if p.seconds is not None else ""))
                            progress.training(p.steps, p.seconds)
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
                        progress.update(round(min(now - started, p.seconds), 1)
                                        if p.steps is None and p.seconds is not None
                                        else int(clocks.iterations.sum()))
                except WorkerFailed as failure:
                    with signals_deferred():
                        sup.shutdown(clocks)
                    t_fail = time.monotonic() - started if started is not None else 0.0
                    self._event({"type": "failure", "t": round(t_fail, 4),
                                 "rank": failure.rank, "signal": failure.signal,
                                 "exitcode": failure.exitcode})
                    raise
                wall = (rt[:, _kl.RT_T1].max() - t0_ns.min()) * 1e-9
        finally:
            with signals_deferred():
                progress.close()
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
                "samples": plus(prev.samples, rt[:W, _kl.RT_SAMPLES]),
                "nonfinite": plus(prev.nonfinite, rt[:W, _kl.RT_NONFINITE]),
                "held": plus(prev.held, rt[:W, _kl.RT_HELD])}

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
                               "ended": (self.ended["how"] if consistency == "quiesced"
                                         else None),
                               "updates": sum(state.updates),
                               "version_vector": state.updates, "seed": self.plan.seed,
                               "config": self.config, "state": state.to_meta()})
        self._final_written = consistency == "quiesced"
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
                         "events_stride": int(max(1, rt[:, _kl.RT_STRIDE].max()))})
        if self.resume_dir is not None:
            run.extra["segments"] = getattr(p, "stream", 0) + 1
        if self.on_failure == "restart":
            run.extra["restarts"] = self.restarts
        note_skipped(run, per_sample=getattr(p, "lane", "batch") == "sample")
        run.extra["metrics"] = self._metrics()
        if hasattr(p.policy, "grants"):
            g = self.control["rt_grants"].sum(axis=0)
            run.extra["dssp_grants"] = {str(r): int(n) for r, n in enumerate(g) if n}
        run.extra["ended"] = dict(self.ended)
        return run

    def _write_out(self, run, wall):
        """The quiesced run to its results folder: final checkpoint first (labelled with
        how the run ended), the end event, then the summary and plots."""
        p = self.plan
        self._checkpoint(wall, "quiesced")
        self._event({"type": "end", "t": round(run.wall_s, 4), "updates": run.updates,
                     "final_loss": run.final_loss, "ended": self.ended["how"]})
        self.events.close()           # flushed, so the size below is the file's
        run.extra["events"] = self.sampler.summary(os.path.join(p.out, "events.jsonl"))
        write_outputs(run, p.out)


#: the lock file a run holds in its results folder while it writes there
LOCK_FILE = ".hogkit.lock"


@contextlib.contextmanager
def out_lock(out):
    """Hold ``out``'s lock file for the run (``flock``, released by the kernel if the
    process dies): a second run into the same folder is refused, naming the first's
    pid, instead of both writing interleaved events and overwriting each other."""
    import fcntl
    fd = os.open(os.path.join(out, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise InvalidArgument(f"another run (pid {holder}) is writing to {out}; wait "
                                  f"for it to finish, or give another out folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


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


def ending_of(err) -> str:
    """How a run that raised ``err`` ended: "interrupted" (SIGINT), "terminated"
    (SIGTERM) or "failed"."""
    import signal
    if isinstance(err, KeyboardInterrupt):
        return ("terminated" if getattr(err, "signum", signal.SIGINT) == signal.SIGTERM
                else "interrupted")
    return "failed"


def _per_worker(clocks, log, control, workers):
    out = []
    rt = control["rt"]
    for r in range(workers):
        busy = int(rt[r, _kl.RT_BUSY])
        wait = int(rt[r, _kl.RT_WAIT])
        compute, paused = int(rt[r, _kl.RT_COMPUTE]), int(rt[r, _kl.RT_PAUSED])
        st = log.summary(r)
        row = {"rank": r, "updates": int(clocks.updates[r]),
               "iterations": int(clocks.iterations[r]),
               "samples": int(rt[r, _kl.RT_SAMPLES]),
               "wait_fraction": round(wait / busy, 4) if busy else 0.0,
               "nonfinite_skipped": int(rt[r, _kl.RT_NONFINITE]),
               "held_back": int(rt[r, _kl.RT_HELD]),
               "staleness": {"update_gap": st["gap"], "clock_lag": st["lag"]}}
        if compute:
            # what a straggler model actually did: (compute + pauses) / compute
            row["slowdown_realised"] = round((compute + paused) / compute, 4)
        out.append(row)
    return out
