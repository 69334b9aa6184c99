"""``train()``: a supervised Hogwild! run on real processes over shared memory.

The parent owns everything shared: it builds the workload's data and initial
parameters, puts them in shared-memory stores (parameters, data, control), compiles
the numba kernels once (workers then load them from numba's cache), spawns the
workers with the ``spawn`` start method and capped thread pools, and supervises
them on their process sentinels. It evaluates the loss on the live parameters now
and then, drains the staleness log into ``events.jsonl``, and, at the end, returns
a :class:`~hogkit.run.Run` with the final snapshot.

Shutdown is ordered and happens on every exit path (done, worker failure,
SIGINT/SIGTERM to the parent, an exception in the parent): stop flag → grace →
SIGTERM → grace → SIGKILL → unlink every segment. Workers ignore SIGINT and are
killed by the kernel if the parent dies (``PR_SET_PDEATHSIG``); if the parent is
SIGKILLed the multiprocessing resource tracker unlinks the segments it created.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import tempfile
import threading
import time

import numpy as np

from hogkit import _worker
from hogkit.clocks import DONE, FAILED, RUNNING, Clocks
from hogkit.errors import Interrupted, InvalidArgument, InvalidType, WorkerFailed
from hogkit.knobs import (check_budget, check_knob, config_of, resolve_workload,
                          split_steps)
from hogkit.reader import Reader, StalenessLog
from hogkit.report import EventLog, environment, plot_run, write_summary
from hogkit.run import Run
from hogkit.store import ParamStore, sweep_dead_segments
from hogkit.kernels import step as _ks
from hogkit.validation import check_choice, check_float, check_int
from hogkit.worker_loop import WorkerSpec, runtime_specs, warm

ENGINES = ("auto", "compiled", "python")


def _resolve_batch(batch, wl, workers):
    """``(batch, global_batch, epoch_steps)``: an int batch is per worker and fixed
    (global_batch 0); a hogkit.batching object sizes each worker's share per iteration."""
    if batch is None:
        return wl.default_batch, 0, 0
    if isinstance(batch, (int, np.integer)) and not isinstance(batch, bool):
        return check_int("batch", batch, min_value=1), 0, 0
    if not all(hasattr(batch, a) for a in ("sizes", "observe", "speed", "global_batch")):
        raise InvalidType(f"batch={batch!r} must be an int (samples per worker per "
                          f"step) or a hogkit.batching object (FixedBatch, AdaptiveBatch, "
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


@contextlib.contextmanager
def _signals_ignored():
    """Shutdown must not be cut short by a second Ctrl-C (SIGKILL still works, and
    then the resource tracker unlinks the segments)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _signal_name(exitcode):
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return None


class _Supervisor:
    """The parent's side of a run: processes, stores, events, shutdown."""

    def __init__(self, workers, grace):
        self.workers = workers
        self.grace = grace
        self.procs = []
        self.finished = set()
        self.closed = False

    def start(self, specs, errdir):
        ctx = mp.get_context("spawn")
        self.errfiles = [os.path.join(errdir, f"worker{r}.err") for r in range(self.workers)]
        with _child_env(1):
            for r, spec in enumerate(specs):
                p = ctx.Process(target=_worker.main, name=f"hogkit-worker-{r}", daemon=True,
                                args=(pickle.dumps(spec), os.getpid(), 1, self.errfiles[r]))
                p.start()
                self.procs.append(p)

    def poll(self, clocks, step_slots, timeout):
        """Wait up to ``timeout`` for a worker to exit; raise WorkerFailed on failure."""
        alive = [p for r, p in enumerate(self.procs) if r not in self.finished]
        if not alive:
            return
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
          eval_every=0.5, out=None, progress=None, wait_timeout=60.0, grace=2.0,
          workload_options=None, keep_params=True, shards=1, engine="auto") -> Run:
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
    stragglers : ``{rank: delay model}`` from :mod:`hogkit.delays`.
    eval_every : seconds between loss evaluations on the live parameters (None: only
        at start and end).
    out : folder for ``summary.json``, ``events.jsonl``, ``loss.csv``, plots and
        ``checkpoint.npz``; None writes nothing.
    progress : show a tqdm bar (None: only when stderr is a terminal).
    shards : per-shard staleness (REFERENCE §1). With S > 1, each parameter's rows
        are cut into S contiguous ranges and clocks count updates per shard; the gap
        recorded for a sparse update counts only updates by others that touched one
        of its shards (the largest such count over its shards), so rows nobody else
        wrote read as fresh. Dense updates touch every shard.
    engine : ``"auto"`` (default: the compiled step core wherever it can run the
        workload and knobs, else the Python step with a one-line notice),
        ``"compiled"`` (refuse what it cannot run) or ``"python"`` (the reference
        path). The summary says which ran (:mod:`hogkit.step`).

    Raises
    ------
    InvalidArgument / InvalidType for bad settings (before anything is spawned),
    WorkerFailed when a worker dies or raises (with its rank, signal or exit code
    and traceback), Interrupted on SIGINT/SIGTERM. In every case the workers are
    stopped and no shared-memory segment is left behind.
    """
    from hogkit.policy import Async
    from hogkit.rules import SGD

    wl = resolve_workload(workload, workload_options)
    workers = check_int("workers", workers, min_value=1, max_value=4096,
                        fix="use workers=1 for a sequential baseline")
    steps, seconds = check_budget(steps, seconds, workers)
    seed = check_int("seed", seed, min_value=0)
    shards = check_int("shards", shards, min_value=1, max_value=1 << 16,
                       fix="use shards=1 for one global update counter")
    check_choice("nonfinite", nonfinite, ("raise", "skip"))
    batch, global_batch, epoch_steps = _resolve_batch(batch, wl, workers)
    policy = Async() if policy is None else policy
    rule = SGD(lr=wl.default_lr) if rule is None else rule
    check_knob("policy", policy, ("wait",), "hogkit.policy (SSP, BSP(), Async(), DSSP, "
                "LocalSGD) or parse_policy('ssp:3')")
    check_knob("rule", rule, ("init", "apply"), "hogkit.rules (SGD, StalenessAware, ...)")
    if density is not None:
        check_knob("density", density, ("init", "filter"), "hogkit.density.Density")
    wait_timeout = check_float("wait_timeout", wait_timeout, min_value=0.0, exclude_min=True)
    grace = check_float("grace", grace, min_value=0.0)
    stragglers = dict(stragglers or {})
    for r, model in stragglers.items():
        check_int("straggler rank", r, min_value=0, max_value=workers - 1)
        check_knob(f"stragglers[{r}]", model, ("start",), "hogkit.delays (Slowdown, "
                    "Pauses, Load)")
    if eval_every is not None:
        eval_every = check_float("eval_every", eval_every, min_value=0.0, exclude_min=True)
    engine = choose_engine(engine, wl, rule=rule, density=density, batch=batch,
                           shards=shards, policy=policy, stragglers=stragglers)

    config = {"workload": wl.name, "workload_config": config_of(wl), "workers": workers,
              "policy": config_of(policy), "rule": config_of(rule),
              "density": config_of(density), "batch": config_of(batch) if global_batch else batch,
              "steps": steps,
              "seconds": seconds, "seed": seed, "nonfinite": nonfinite, "shards": shards,
              "stragglers": {str(r): config_of(m) for r, m in stragglers.items()},
              "engine": engine, "environment": environment()}

    sweep_dead_segments()
    params0, data0 = wl.build(seed)
    n_params = len(params0)
    warm(wl, rule, density, params0, data0, seed,
                 batch if not global_batch else max(1, global_batch // workers), engine)
    initial_loss = float(wl.loss(params0, data0))

    if out is not None:
        os.makedirs(out, exist_ok=True)
    events = EventLog(os.path.join(out, "events.jsonl")) if out is not None else None
    sup = _Supervisor(workers, grace)
    clocks = None
    with contextlib.ExitStack() as stack:
        if events is not None:
            stack.callback(events.close)
        errdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="hogkit-err-"))
        pstore = stack.enter_context(ParamStore.create(params0, tag="params"))
        dstore = stack.enter_context(ParamStore.create(data0, tag="data"))
        del params0
        cstore = stack.enter_context(ParamStore.create(
            {**Clocks.specs(workers, shards * n_params if shards > 1 else 1),
             **StalenessLog.specs(workers),
             **runtime_specs(workers)},
            tag="ctl"))
        control = cstore.views()
        clocks, log = Clocks(control), StalenessLog(control)
        params, data = pstore.views(), dstore.views()
        specs = [WorkerSpec(rank=r, workers=workers, seed=seed, steps=n, workload=wl,
                            rule=rule, policy=policy, density=density, batch=batch,
                            global_batch=global_batch, epoch_steps=epoch_steps,
                            params=pstore.handle, data=dstore.handle, control=cstore.handle,
                            nonfinite=nonfinite, wait_timeout=wait_timeout, shards=shards,
                            delay=stragglers.get(r), parent_pid=os.getpid(), engine=engine)
                 for r, n in enumerate(split_steps(steps, workers))]
        if events is not None:
            events.write([{"type": "start", "t": 0.0, "config": config,
                           "initial_loss": initial_loss}])
        curve = [{"t": 0.0, "updates": 0, "loss": initial_loss}]
        cursors = np.zeros(workers, dtype=np.int64)
        dropped = 0
        bar = _progress_bar(progress, steps, seconds)
        try:
            with _parent_signals():
                sup.start(specs, errdir)
                rt = control["rt"]
                t0_ns = rt[:, _ks.RT_T0]
                started = None        # when the first worker left the start barrier
                next_beat_check = time.monotonic() + wait_timeout
                next_eval = float("inf")
                stop_sent = False
                try:
                    while not sup.done:
                        sup.poll(clocks, clocks.step, 0.05)
                        now = time.monotonic()
                        if now >= next_beat_check:
                            sup.check_heartbeats(clocks, clocks.step, wait_timeout)
                            next_beat_check = now + 1.0
                        if started is None:
                            if not t0_ns.all():
                                continue          # still starting up: nothing to time
                            started = t0_ns.min() * 1e-9
                            if eval_every:
                                next_eval = started + eval_every
                        if seconds is not None and not stop_sent and now - started >= seconds:
                            clocks.request_stop()
                            stop_sent = True
                        if now >= next_eval:
                            loss = float(wl.loss(params, data))
                            curve.append({"t": round(now - started, 4),
                                          "updates": int(clocks.updates.sum()), "loss": loss})
                            next_eval = now + eval_every
                            if events is not None:
                                events.write([{"type": "eval", **curve[-1]}])
                        if events is not None:
                            cursors, n_lost = _drain(log, cursors, events)
                            dropped += n_lost
                        if bar is not None:
                            bar.n = (int(clocks.iterations.sum()) if steps is not None
                                     else round(min(now - started, seconds), 1))
                            bar.refresh()
                except WorkerFailed as failure:
                    with _signals_ignored():
                        sup.shutdown(clocks)
                    if events is not None:
                        t_fail = time.monotonic() - started if started is not None else 0.0
                        events.write([{"type": "failure", "t": round(t_fail, 4),
                                       "rank": failure.rank, "signal": failure.signal,
                                       "exitcode": failure.exitcode}])
                    raise
                # training time: first worker out of the start barrier to last one done
                # (spawning and imports excluded, so rates compare across workloads)
                wall = (rt[:, _ks.RT_T1].max() - t0_ns.min()) * 1e-9
        finally:
            with _signals_ignored():
                if bar is not None:
                    bar.close()
                sup.shutdown(clocks)
        if events is not None:
            cursors, n_lost = _drain(log, cursors, events)
            dropped += n_lost
        final_loss = float(wl.loss(params, data))
        curve.append({"t": round(wall, 4), "updates": int(clocks.updates.sum()),
                      "loss": final_loss})
        summary = log.summary()
        run = Run(config=config, workers=workers, updates=int(clocks.updates.sum()),
                  wall_s=wall, initial_loss=initial_loss, final_loss=final_loss,
                  staleness={"update_gap": summary["gap"], "clock_lag": summary["lag"]},
                  per_worker=_per_worker(clocks, log, control, workers),
                  loss_curve=curve, params=pstore.snapshot() if keep_params else None,
                  out=os.fspath(out) if out is not None else None,
                  extra={"events_dropped": int(dropped),
                         "nonfinite_skipped": int(control["rt"][:, _ks.RT_NONFINITE].sum()),
                         "samples": int(control["rt"][:, _ks.RT_SAMPLES].sum()),
                         "engine": engine,
                         "events_recorded": int(log.cursor.sum()),
                         "events_stride": int(max(1, control["rt"][:, _ks.RT_STRIDE].max()))})
        if hasattr(policy, "grants"):
            g = control["rt_grants"].sum(axis=0)
            run.extra["dssp_grants"] = {str(r): int(n) for r, n in enumerate(g) if n}
        if out is not None:
            events.write([{"type": "end", "t": round(wall, 4), "updates": run.updates,
                           "final_loss": final_loss}])
            write_summary(run, out)
            plot_run(run.summary(), out)
            pstore.save(os.path.join(out, "checkpoint.npz"),
                        meta={"consistency": "quiesced", "updates": run.updates,
                              "version_vector": clocks.updates.tolist(), "seed": seed,
                              "config": config})
    return run


def choose_engine(engine, wl, *, rule, density, batch, shards=1, policy=None,
                  stragglers=None):
    """``"compiled"`` or ``"python"`` for ``engine`` = "auto" | "compiled" | "python":
    "auto" takes the compiled step core when it can run the knobs and says in one line
    (a :class:`~hogkit.errors.EngineNotice` warning) why not when it cannot."""
    import warnings

    from hogkit.errors import EngineNotice
    from hogkit.step import compiled_support
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


def _drain(log, cursors, events):
    """Move new staleness events from the shared rings into events.jsonl."""
    new, cursors, lost = log.drain(cursors)
    if new:
        events.write([{"type": "update", **e} for e in new])
    return cursors, lost


def _progress_bar(progress, steps, seconds):
    if progress is False:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return None
    total = steps if steps is not None else seconds
    unit = "it" if steps is not None else "s"
    return tqdm(total=total, unit=unit, disable=None if progress is None else not progress,
                dynamic_ncols=True, leave=False)
