"""``hogkit.spawn``: your own training loop in every worker, on hogkit's shared store.

The drop-in for torch's Hogwild! recipe (``model.share_memory()``, then
``torch.multiprocessing`` processes that each run ``torch.optim.SGD``)::

    def loop(worker, model):                    # runs in each worker process
        opt = hogkit.optim.SGD(model.parameters(), lr=0.05)
        for x, y in my_batches(worker.rank):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()                          # update, clocks, staleness, policy

    if __name__ == "__main__":
        run = hogkit.spawn(loop, model, nprocs=4, policy=hogkit.SSP(3))

What hogkit adds to the recipe: the parameters are in one POSIX shared-memory segment
that is unlinked on every exit path; each ``step()`` of a :mod:`hogkit.optim` optimizer
ticks the shared clocks, records how stale its gradient was (the same histograms and
``events.jsonl`` as :func:`hogkit.train`), and waits as the consistency policy says
(Async, BSP, SSP(s), DSSP); the parent supervises the workers (a dead or hung worker
fails the run with its rank, signal and traceback; SIGINT stops every worker; nothing
is left behind) and returns a :class:`~hogkit.engine.run.Run`. After the run the parent's
``model`` holds the trained weights (in private memory again).

When the run is asked to stop (``seconds`` ran out, a peer failed, SIGINT), the next
``step()`` raises :class:`~hogkit.errors.Stopped`, which ends the loop; the worker
counts that as a normal end. ``worker.stopping`` lets a loop check for itself.

Workers are started with ``spawn``: ``fn``, ``args`` and the model's class must be
importable (defined at the top level of a module or of the script, which needs
``if __name__ == "__main__":`` around the call). The model travels without its
weights; each worker binds its copy to the shared parameters. Buffers (e.g.
BatchNorm statistics) are private to each worker.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from hogkit.engine.live import LiveRun
from hogkit.engine.mainguard import check_main_guard, check_spawnable
from hogkit.engine.plan import _check_knob, check_out, config_of
from hogkit.engine.settings import Outputs, Workers
from hogkit.errors import InvalidArgument, InvalidType, Stopped
from hogkit.kernels import layout as _kl
from hogkit.policy import Async
from hogkit.state.clocks import DONE, RUNNING, Clocks
from hogkit.state.reader import Reader, StalenessLog
from hogkit.validation import check_float, check_int

__all__ = ["spawn", "Worker", "current_worker"]

_CURRENT = None


def current_worker():
    """The :class:`Worker` of this process inside :func:`spawn`, else None."""
    return _CURRENT


class Worker:
    """What your function gets as its first argument: who it is, and the run's shared
    clocks, staleness probe and policy (the optimizer drives them).

    ``rank`` (0 .. ``world_size`` − 1), ``world_size``, ``seed`` (the run's),
    ``iterations`` (this worker's finished steps), ``stopping`` (the parent asked
    every worker to stop).
    """

    def __init__(self, rank, world_size, clocks, log, policy, *, seed=0, rt=None,
                 wait_timeout=60.0):
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.clocks, self.policy = clocks, policy
        self.reader = Reader(clocks, log, rank)
        self.rt = rt if rt is not None else np.zeros(_kl.RT, np.int64)
        self.wait_timeout = wait_timeout

    @classmethod
    def solo(cls):
        """A private one-worker context (an optimizer used outside :func:`spawn`):
        staleness is always 0 and nothing waits."""
        from hogkit.policy import Async
        from hogkit.engine.worker_loop import private_control
        views, clocks, log = private_control()
        w = cls(0, 1, clocks, log, Async(), rt=views["rt"][0])
        w.reader.read()
        return w

    @property
    def iterations(self) -> int:
        return int(self.clocks.iterations[self.rank])

    @property
    def stopping(self) -> bool:
        return self.clocks.stopping()

    def end_iteration(self) -> None:
        """After an optimizer step: count the iteration (and beat), wait as the policy
        says before the next one, then mark the next read. Raises :class:`Stopped`
        when the run is stopping."""
        clocks, rank = self.clocks, self.rank
        clocks.tick_iteration(rank, beat=True)
        clocks.step[rank] = clocks.iterations[rank]
        if clocks.stopping():
            raise Stopped("the run is stopping")
        t0 = time.perf_counter_ns()
        self.policy.wait(clocks, rank, timeout=self.wait_timeout)
        self.rt[_kl.RT_WAIT] += time.perf_counter_ns() - t0
        if clocks.stopping():
            raise Stopped("the run is stopping")
        self.reader.read()

    def __repr__(self):
        return f"Worker(rank={self.rank}, world_size={self.world_size})"


@dataclass(frozen=True)
class SpawnPlan:
    """The knobs of a :func:`spawn` run, in the shape the supervisor reads."""

    workers: int
    policy: Any
    seconds: Optional[float]
    eval_every: Any
    out: Optional[str]
    seed: int
    keep_params: bool
    threads: int
    events: str = "sampled"            # what events.jsonl keeps (hogkit.engine.plan.EVENTS)
    steps: Optional[int] = None        # the loop is the user's: no step budget
    shards: int = 1
    fn_name: str = ""
    model_name: str = ""
    stragglers: dict = field(default_factory=dict)

    def config(self, **extra) -> dict:
        return {"workload": f"spawn:{self.fn_name}", "model": self.model_name,
                "workers": self.workers, "policy": config_of(self.policy),
                "rule": "the workers' hogkit.optim optimizers", "density": None,
                "batch": None, "steps": None, "seconds": self.seconds, "seed": self.seed,
                "nonfinite": None, "shards": 1, "stragglers": {},
                "threads_per_worker": self.threads, **extra}


@dataclass
class SpawnSpec:
    """One worker's part of a :func:`spawn` run (pickled by the parent)."""

    rank: int
    plan: SpawnPlan
    fn: Any
    args: tuple
    template: Any                   # the model without weights (meta device)
    buffers: dict
    params: Any                     # StoreHandle
    control: Any                    # StoreHandle
    wait_timeout: float
    parent_pid: int

    def run(self) -> None:
        _run(self)


def _run(spec: SpawnSpec) -> None:
    """The worker's body: attach, rebuild the model on the shared parameters, wait for
    every peer, run the user's function, finish."""
    global _CURRENT
    import torch

    from hogkit.state.store import ParamStore, bind_module
    from hogkit.engine.worker_loop import start_barrier
    from hogkit.workloads.module import rebuild
    torch.set_num_threads(spec.plan.threads)
    stores = [ParamStore.attach(h) for h in (spec.params, spec.control)]
    try:
        params, control = (s.views() for s in stores)
        model = bind_module(rebuild(spec.template, spec.buffers), params,
                            where="the shared store")
        clocks = Clocks(control)
        rt = control["rt"][spec.rank]
        worker = Worker(spec.rank, spec.plan.workers, clocks, StalenessLog(control),
                        spec.plan.policy, seed=spec.plan.seed, rt=rt,
                        wait_timeout=spec.wait_timeout)
        _CURRENT = worker
        clocks.set_state(spec.rank, RUNNING)
        clocks.beat(spec.rank)
        start_barrier(clocks, spec.wait_timeout)
        rt[_kl.RT_T0] = time.monotonic_ns()
        clocks.beat(spec.rank)
        worker.reader.read()
        try:
            spec.fn(worker, model, *spec.args)
        except Stopped:
            pass
        rt[_kl.RT_T1] = time.monotonic_ns()
        rt[_kl.RT_BUSY] = rt[_kl.RT_T1] - rt[_kl.RT_T0]
        clocks.set_state(spec.rank, DONE)
    finally:
        _CURRENT = None
        for s in stores:
            s.close()


def spawn(fn, model, *, nprocs=2, args=(), policy=None, seconds=None, seed=0, threads=1,
          eval_fn=None, outputs=None):
    """Run ``fn(worker, model, *args)`` in ``nprocs`` processes that share ``model``'s
    parameters; returns a :class:`~hogkit.engine.run.Run` (see the module docstring).

    Parameters
    ----------
    fn : your training loop; its :mod:`hogkit.optim` optimizer's ``step()`` updates
        the shared parameters and drives the clocks, the staleness record and the
        policy. A top-level function (it is pickled).
    model : the ``torch.nn.Module`` to train (CPU, float32/float64 parameters). Its
        parameters are shared for the run; afterwards it holds the trained weights.
    nprocs : worker processes, or :class:`~hogkit.engine.settings.Workers`
        (``wait_timeout``: seconds a policy wait, the start barrier or a silent worker
        may take before the run fails; ``grace``: seconds between the shutdown's stop
        flag, SIGTERM and SIGKILL). ``args``: more arguments for ``fn`` (pickled).
    policy : ``Async()`` (default), ``BSP()``, ``SSP(s)``, ``DSSP(lo, hi)``; the wait
        happens at the end of each optimizer step, before the next forward.
    seconds : wall-time budget; the workers' next ``step()`` raises
        :class:`~hogkit.errors.Stopped` once it is spent (None: until every ``fn``
        returns).
    threads : torch threads per worker.
    eval_fn : optional ``eval_fn(model) -> float``, the loss on the live shared
        parameters, evaluated in the parent every ``outputs.eval_every`` seconds
        ("auto": 0.5 s; None: start and end only) for the loss curve.
    outputs : a results folder, or :class:`~hogkit.engine.settings.Outputs` (as for
        :func:`hogkit.train`: ``events``, ``eval_every``, ``progress``,
        ``keep_params``; no checkpoints: the loop's state is the user's).

    Raises InvalidArgument / InvalidType (before anything is spawned), WorkerFailed,
    Interrupted; in every case the workers are stopped and no segment is left.
    """
    check_main_guard("hogkit.spawn()")
    if not callable(fn):
        raise InvalidType(f"fn={fn!r} must be a function fn(worker, model, *args)")
    template = _template(model)
    if not isinstance(nprocs, Workers):
        nprocs = check_int("nprocs", nprocs, min_value=1, max_value=4096)
    wk, outs = Workers.of(nprocs), Outputs.of(outputs)
    wk.refuse("stragglers", "delays", "on_failure", "max_restarts",
              where="spawn() (the loop is yours: hogkit does not pace or restart it)")
    if outs.resume is not None or outs.checkpoint_every not in ("auto", None):
        raise InvalidArgument("spawn() writes no checkpoints and cannot resume (the loop "
                              "and its optimizer state are yours); drop Outputs(resume=..., "
                              "checkpoint_every=...)")
    nprocs = check_int("nprocs", wk.n, min_value=1, max_value=4096)
    if not isinstance(args, tuple):
        raise InvalidType(f"args={args!r} must be a tuple of extra arguments for fn")
    policy = Async() if policy is None else policy
    _check_knob("policy", policy, ("wait",), "hogkit.policy (SSP, BSP(), Async(), DSSP)")
    if getattr(policy, "local_steps", 0):
        raise InvalidArgument(f"policy={policy!r}: local SGD needs hogkit's own loop (its "
                              f"merges replace the optimizer step); use hogkit.train() "
                              f"with a TorchWorkload")
    if seconds is not None:
        seconds = check_float("seconds", seconds, min_value=0.0, exclude_min=True,
                              fix="a wall-time budget in seconds, or None")
    if eval_fn is not None and not callable(eval_fn):
        raise InvalidType(f"eval_fn={eval_fn!r} must be a function eval_fn(model) -> "
                          f"float, or None")
    threads = check_int("threads", threads, min_value=1, max_value=1024)
    seed = check_int("seed", seed, min_value=0)
    for what, obj in (("fn", fn), ("args", args), ("policy", policy)):
        check_spawnable(what, obj)
    plan = SpawnPlan(workers=nprocs, policy=policy, seconds=seconds,
                     eval_every=outs.eval_every, out=check_out(outs.folder),
                     seed=seed, keep_params=outs.keep_params, threads=threads,
                     events=outs.events,
                     fn_name=getattr(fn, "__qualname__", repr(fn)),
                     model_name=type(model).__qualname__)
    return _SpawnRun(plan, fn, args, model, template, eval_fn, wait_timeout=wk.wait_timeout,
                     grace=wk.grace).run(outs.progress)


def _template(model):
    """``(template, buffers)`` of a checked model: what the workers rebuild it from
    (:func:`hogkit.workloads.module.weightless`), checked to pickle."""
    from hogkit.engine.mainguard import check_spawnable
    from hogkit.state.store import module_arrays
    from hogkit.workloads.module import weightless
    module_arrays(model, "model", copy=False)      # a CPU float module with parameters
    template = weightless(model)
    check_spawnable("model", template)
    return template


class _SpawnRun(LiveRun):
    """The supervised run of :func:`spawn`: :class:`~hogkit.engine.live.LiveRun` with the
    model's parameters as the store and the user's function in the workers."""

    def __init__(self, plan, fn, args, model, template, eval_fn, *, wait_timeout, grace):
        super().__init__(plan, "own loop", wait_timeout=wait_timeout, grace=grace)
        self.fn, self.args, self.model, self.eval_fn = fn, args, model, eval_fn
        self.template, self.buffers = template

    def _share(self, stack):
        from hogkit.state.store import ParamStore
        self.pstore = stack.enter_context(ParamStore.from_module(self.model, tag="params"))
        stack.callback(_release, self.model)         # runs before the store closes
        self.params, self.data = self.pstore.views(), {}
        return self._loss()

    def _loss(self):
        if self.eval_fn is None:
            return float("nan")
        import torch
        with torch.no_grad():
            return float(self.eval_fn(self.model))

    def _metrics(self):
        if self.eval_fn is None:
            return {}
        loss = self._loss()
        return {"loss": loss if np.isfinite(loss) else None}

    def _specs(self):
        return [SpawnSpec(rank=r, plan=self.plan, fn=self.fn, args=self.args,
                          template=self.template, buffers=self.buffers,
                          params=self.pstore.handle, control=self.cstore.handle,
                          wait_timeout=self.wait_timeout, parent_pid=os.getpid())
                for r in range(self.plan.workers)]


def _release(model):
    """Give the model private copies of the (trained) shared parameters, so the
    segment can go."""
    import torch
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()
