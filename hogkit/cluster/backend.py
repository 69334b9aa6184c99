"""``train(..., backend="ray")``: the same training over a Ray cluster, hierarchical.

Each **node** is a Ray actor that runs a whole single-node hogkit run (shared-memory
stores, lock-free local workers, the compiled or Python step) with an agent thread
(:mod:`hogkit.cluster.agent`) exchanging deltas with the **parameter-shard actors**
(:mod:`hogkit.cluster.shard`, one process each, rows of every parameter cut into
``servers`` ranges). The driver (this process) validates everything first, starts a
local Ray instance when no address is given (and shuts it down at the end), places
the actors, watches them, evaluates the global model (pulled from the shards) every
``eval_every`` seconds, and assembles one :class:`~hogkit.engine.run.Run` whose summary has
the single-node shape plus ``nodes`` and ``cross_node``.

Every remote call has a timeout: an exchange ``call_timeout`` (a shard that dies or
hangs fails the node with a message naming the shard), set-up ``start_timeout``,
the run itself the budget plus ``start_timeout``. A node whose process dies or whose
worker fails ends the run with :class:`~hogkit.cluster.node.NodeFailed` naming the
node (and the worker's rank); the other nodes are asked to stop, then killed after
``grace``. SIGINT/SIGTERM in the driver do the same and raise
:class:`~hogkit.errors.Interrupted`. A node's segments are unlinked by its own
run's shutdown; a node killed outright leaves them to its resource tracker, and its
workers die with it (``PR_SET_PDEATHSIG``). At the end the driver kills every actor
and sweeps, until they are gone, the segments of those on its own machine (same boot,
same pid namespace): a killed process's segments are free only once all its threads
have exited.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import signal
import sys
import time

import numpy as np

from hogkit.cluster.agent import take_delta
from hogkit.cluster.node import NodeFailed, NodeRun
from hogkit.cluster.shard import Shard, row_ranges
from hogkit.errors import HogkitError, Interrupted, InvalidArgument, RunFailed
from hogkit.state.reader import StalenessLog
from hogkit.report import write_outputs
from hogkit.engine.run import Run, note_skipped
from hogkit.engine.supervisor import parent_signals
from hogkit.procfs import pid_space
from hogkit.state.store import sweep_segments_of
from hogkit.workloads.base import metrics_of

__all__ = ["run_cluster", "ShardFailed", "require_ray"]


#: longest the driver sweeps, after killing its actors, for the segments of those on
#: this machine to go (a sweep right after the kill left a node's segments for over
#: 10 s in one clean-clone CI on a loaded 2-core machine; a sweep once the actor's pid
#: looked dead left them in another, likely held by its threads still exiting)
ACTOR_EXIT_S = 30.0


class ShardFailed(RunFailed):
    """A parameter-shard actor died or did not answer within the timeout."""


class ClusterTimeout(RunFailed, TimeoutError):
    """The cluster's actors did not answer within the timeout."""


def require_ray():
    """Import ray, or say how to get it."""
    try:
        import ray
    except ImportError:
        raise ImportError('backend="ray" needs Ray: pip install -e ".[ray]" (or pip install '
                          '"ray>=2.9")') from None
    return ray


@contextlib.contextmanager
def _no_main_module():
    """A Ray worker's ``__main__`` is Ray's own script; a spawned hogkit worker must
    not re-run it, so it is hidden from multiprocessing while a node spawns."""
    main = sys.modules.get("__main__")
    spec, path = getattr(main, "__spec__", None), getattr(main, "__file__", None)
    main.__spec__ = None                     # what multiprocessing.spawn looks at
    if path is not None:
        del main.__file__
    try:
        yield
    finally:
        main.__spec__ = spec
        if path is not None:
            main.__file__ = path


class _Exchange:
    """The agent's exchange over Ray: one remote call per message, all in flight at
    once in the schedule's order, each reply handed back as it arrives; the whole
    exchange within ``timeout``."""

    def __init__(self, shards, timeout):
        self.shards, self.timeout = shards, timeout

    def __call__(self, node, messages, need=None):
        import ray
        refs = {self.shards[m["shard"]].exchange.remote(ShardActor.message(
                    node, m["clock"], m["updates"], m["delta"], m["done"], need,
                    m["window"], m["parts"])): i for i, m in enumerate(messages)}
        pending = list(refs)
        deadline = time.monotonic() + self.timeout
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1,
                                          timeout=max(deadline - time.monotonic(), 0))
                if not ready:
                    late = sorted({messages[refs[r]]["shard"] for r in pending})
                    raise ShardFailed(f"parameter shard(s) {late} did not answer node "
                                      f"{node}'s exchange within {self.timeout:g} s; raise "
                                      f"call_timeout=... or look at the shard's log "
                                      f"(ray logs)")
                yield refs[ready[0]], pickle.loads(ray.get(ready[0]))
        except ray.exceptions.RayActorError as e:
            raise ShardFailed(f"a parameter shard died during node {node}'s exchange: "
                              f"{str(e).splitlines()[0]}") from None


class NodeActor:
    """Body of the node actor: one :class:`NodeRun`."""

    def __init__(self, plan, engine, node, nodes, ranges, shards, sync_every, fraction,
                 backlog, schedule, call_timeout, wait_timeout, grace):
        self.args = dict(plan=plan, engine=engine, node=node, nodes=nodes, ranges=ranges,
                         exchange=_Exchange(shards, call_timeout), sync_every=sync_every,
                         fraction=fraction, backlog=backlog, schedule=schedule,
                         wait_timeout=wait_timeout,
                         grace=grace)
        self.live = None

    def ping(self):
        return pid_space(), os.getpid()

    def run(self):
        plan = self.args.pop("plan")
        engine = self.args.pop("engine")
        self.live = NodeRun(plan, engine, **self.args)
        with _no_main_module():
            run = self.live.run(False)
        return self.live.result(run)

    def stop(self):
        if self.live is not None:
            self.live.stop()
        return True


class ShardActor:
    """Body of a parameter-shard actor: one :class:`Shard`, asynchronous so that an
    exchange may hold its pull (``need``: the clock its node is blocked on) while
    other nodes' exchanges go through.

    An exchange travels as one pickled ``bytes`` each way (:meth:`message`, the reply
    pickled likewise): Ray serialises every numpy array of an argument or a result on
    its own, and an exchange holds a dozen small ones (rows and values per parameter,
    the version vector, the clocks). Measured by hand on the 2-core machine: 8 small
    arrays each way cost about 0.2 ms a direction over an empty call's 1.2 ms round
    trip, one bytes object almost nothing; BSP on mf went from 451 to 618 updates/s."""

    #: longest a pull is held; the agent then asks again
    HOLD_S = 0.25

    def __init__(self, index, values, nodes):
        self.shard = Shard(index, values, nodes)
        self.pushed = None

    @staticmethod
    def message(node, clock, updates, delta, done=False, need=None, window=None,
                parts=1) -> bytes:
        """One exchange's argument (:meth:`Shard.exchange`'s, plus ``need``)."""
        return pickle.dumps((node, clock, updates, delta, done, need, window, parts),
                            protocol=pickle.HIGHEST_PROTOCOL)

    async def exchange(self, message: bytes) -> bytes:
        """Push, hold the pull until ``need`` is reached (at most :attr:`HOLD_S`), pull;
        the :class:`~hogkit.cluster.shard.Reply`, pickled."""
        import asyncio
        node, clock, updates, delta, done, need, window, parts = pickle.loads(message)
        if self.pushed is None:
            self.pushed = asyncio.Condition()
        self.shard.push(node, clock, updates, delta, done, parts)
        async with self.pushed:
            self.pushed.notify_all()
            if need is not None and not self.shard.reached(node, need):
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(
                        self.pushed.wait_for(lambda: self.shard.reached(node, need)),
                        self.HOLD_S)
        return pickle.dumps(self.shard.pull(node, window), protocol=pickle.HIGHEST_PROTOCOL)

    async def snapshot(self):
        return self.shard.snapshot()

    async def ping(self):
        return pid_space(), os.getpid()


def _start_ray(ray, address):
    """``(started_here)``: join ``address``, or start a local instance sized for the
    run (logical CPUs: the actors themselves ask for none on a local instance)."""
    if ray.is_initialized():
        return False
    if address is None:
        ray.init(num_cpus=max(os.cpu_count() or 1, 1), include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
        return True
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    return False


def check_address(address):
    if address is None or address == "auto":
        return address
    if not isinstance(address, str) or not (address.startswith("ray://")
                                            or ":" in address):
        raise InvalidArgument(f'address={address!r}: expected None (start a local Ray '
                              f'instance), "auto" (the cluster `ray start --head` made on '
                              f'this machine), "ray://HOST:PORT" or "HOST:PORT"')
    return address


def run_cluster(plans, engine, *, nodes, servers, address, sync_every, fraction,
                backlog, eval_every, out, keep_params, config, wait_timeout, grace,
                schedule=None, call_timeout=30.0, start_timeout=120.0) -> Run:
    """Run ``plans`` (one per node, checked already) on Ray; see the module docstring.
    ``eval_every``: seconds between evaluations of the global model (inf: none)."""
    ray = require_ray()
    plan = plans[0]
    wl = plan.workload
    params0, data0 = wl.build(plan.seed)
    initial_loss = float(wl.loss(params0, data0))
    ranges = {k: row_ranges(v.shape[0], servers) for k, v in params0.items()}
    # compile the agents' delta kernel here, once, for these dtypes: the node actors
    # then load it from numba's cache instead of each compiling it at its first exchange
    take_delta(params0, {k: v.copy() for k, v in params0.items()})
    started = _start_ray(ray, address)
    shard_cls = ray.remote(num_cpus=0, max_restarts=0)(ShardActor)
    node_cls = ray.remote(max_restarts=0, max_concurrency=4)(NodeActor)
    actors, node_actors, here = [], [], []
    tag = f"hogkit-{os.getpid()}-{time.time_ns()}"     # actor names: `ray list actors`
    try:
        with parent_signals():
            shards = [shard_cls.options(name=f"{tag}-shard{s}").remote(
                          s, {k: v[ranges[k][s][0]:ranges[k][s][1]]
                                           for k, v in params0.items()}, nodes)
                      for s in range(servers)]
            actors += shards
            # one machine: the actors ask for no CPU (its workers are processes of
            # their own); several: each node asks for its workers' CPUs, spread out
            machines = sum(1 for m in ray.nodes() if m.get("Alive"))
            opts = ({"num_cpus": 0} if machines <= 1 else
                    {"num_cpus": plan.workers, "scheduling_strategy": "SPREAD"})
            node_actors = [node_cls.options(name=f"{tag}-node{n}", **opts).remote(
                plans[n], engine, n, nodes, ranges, shards, sync_every, fraction, backlog,
                schedule, call_timeout, wait_timeout, grace) for n in range(nodes)]
            actors += node_actors
            space = pid_space()
            here = [pid for where, pid in _get(ray, [a.ping.remote() for a in actors],
                                                start_timeout, "the actors did not start")
                    if where == space]
            driver = _Driver(ray, plans, node_actors, shards, ranges, wl, data0, eval_every,
                             grace, call_timeout, start_timeout)
            results = driver.watch(initial_loss)
            params, _, traffic = driver.snapshot()
    finally:
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        if started:
            ray.shutdown()
        # a node killed outright (its process and its resource tracker with it) leaves
        # its segments; on this machine they go now, on another at its next run. Ray's
        # kill returns before the process is gone, and a sweep spares a live owner's
        # segments: sweep until this machine's actors' segments are gone
        sweep_segments_of(here, ACTOR_EXIT_S)
    return _finish(results, params, traffic, driver.curve, initial_loss, wl, data0, plans,
                   config, out, keep_params)


def _get(ray, refs, timeout, what, died=RunFailed):
    """``ray.get`` with a timeout; an actor that died is ``died`` with a message naming
    it, not a Ray traceback."""
    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise ClusterTimeout(f"{what} within {timeout:g} s; raise start_timeout=... or "
                           f"check the cluster (ray status)") from None
    except ray.exceptions.RayActorError as e:
        lines = str(e).splitlines()
        name = next((ln.split(":", 1)[1].strip() for ln in lines
                     if ln.strip().startswith("name:")), "?")
        raise died(f"{what}: actor {name} died ({lines[0].strip()})") from None


class _Driver:
    """Watch the nodes' runs; evaluate the global model now and then."""

    def __init__(self, ray, plans, nodes, shards, ranges, wl, data, eval_every, grace,
                 call_timeout, start_timeout):
        self.ray, self.plans, self.nodes, self.shards = ray, plans, nodes, shards
        self.ranges, self.wl, self.data = ranges, wl, data
        self.every = eval_every                 # seconds between global evaluations
        self.grace, self.call_timeout, self.start_timeout = grace, call_timeout, start_timeout
        self.curve = []

    def snapshot(self):
        """The global model and version vector, pulled from every shard."""
        snaps = _get(self.ray, [s.snapshot.remote() for s in self.shards],
                     self.call_timeout, "the driver's snapshot of the parameter shards",
                     died=ShardFailed)
        params = {}
        for name, rr in self.ranges.items():
            params[name] = np.concatenate([snaps[s]["values"][name] for s in range(len(rr))])
        versions = np.min([s["versions"] for s in snaps], axis=0)
        traffic = sum(s["bytes_in"] + s["bytes_out"] for s in snaps)
        return params, int(versions.sum()), traffic

    def _evaluate(self, t):
        params, updates, _ = self.snapshot()
        self.curve.append({"t": round(t, 4), "updates": updates,
                           "loss": float(self.wl.loss(params, self.data))})

    def watch(self, initial_loss):
        ray = self.ray
        refs = {n.run.remote(): i for i, n in enumerate(self.nodes)}
        self.curve = [{"t": 0.0, "updates": 0, "loss": initial_loss}]
        secs = self.plans[0].seconds
        deadline = (time.monotonic() + secs + self.start_timeout) if secs else math.inf
        t0 = time.monotonic()
        next_eval = t0 + self.every
        results = {}
        try:
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=0.05)
                for ref in done:
                    results[refs[ref]] = self._result(ref, refs[ref])
                now = time.monotonic()
                if now >= deadline:
                    raise TimeoutError(f"nodes {sorted(set(refs.values()) - set(results))} "
                                       f"did not finish within the budget + start_timeout "
                                       f"({deadline - t0:.0f} s)")
                if pending and now >= next_eval:
                    self._evaluate(now - t0)
                    next_eval = time.monotonic() + self.every
        except KeyboardInterrupt as e:     # Ray may turn our Interrupted into its own
            self._stop(list(refs))
            if isinstance(e, Interrupted):
                raise
            raise Interrupted(signal.SIGINT) from None
        except BaseException:
            self._stop(list(refs))
            raise
        return [results[i] for i in range(len(self.nodes))]

    def _result(self, ref, node):
        ray = self.ray
        try:
            return ray.get(ref, timeout=self.call_timeout)
        except ray.exceptions.RayTaskError as e:
            cause = e.cause
            if isinstance(cause, HogkitError) and not isinstance(cause, NodeFailed):
                raise NodeFailed(node, f"node {node}: {type(cause).__name__}: {cause}",
                                 cause=type(cause).__name__) from None
            if isinstance(cause, BaseException):
                raise cause from None
            raise
        except ray.exceptions.RayActorError as e:
            raise NodeFailed(node, f"node {node}'s process died (its workers died with it): "
                                   f"{str(e).splitlines()[0]}") from None

    def _stop(self, refs):
        """Ask every node to stop; wait ``grace`` (+ a node's own shutdown) for them."""
        ray = self.ray
        for n in self.nodes:
            with contextlib.suppress(Exception):
                n.stop.remote()
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=4 * self.grace + 2)


def _merged(logs):
    """One summary over several nodes' staleness arrays (rows stacked)."""
    views = {k: np.concatenate([lg[k] for lg in logs]) for k in logs[0]}
    rows = views["log_stats"].shape[0]
    views["log_ring"] = np.zeros((rows, 1, 5), np.int64)
    return StalenessLog(views).summary()


def _finish(results, params, traffic, curve, initial_loss, wl, data, plans, config, out,
            keep_params) -> Run:
    W = plans[0].workers
    per_worker, nodes = [], []
    for n, r in enumerate(results):
        for row in r["per_worker"]:
            per_worker.append({**row, "rank": n * W + row["rank"], "node": n,
                               "local_rank": row["rank"]})
        cross = {k: v for k, v in r["cross_node"].items() if k != "log"}
        cross["clock_lag"] = r["staleness"]["clock_lag"]      # reads' lag, gate included
        nodes.append({"node": n, "updates": r["updates"], "wall_s": r["wall_s"],
                      "updates_per_s": r["updates_per_s"],
                      "local_final_loss": r["final_loss"], "engine": r["engine"],
                      "staleness": r["staleness"], "cross_node": cross})
    updates = sum(r["updates"] for r in results)
    wall = max(r["wall_s"] for r in results)
    within = _merged([r["log"] for r in results])
    across = _merged([r["cross_node"]["log"] for r in results])
    final_loss = float(wl.loss(params, data))
    curve = [c for c in curve if c["t"] < wall] + [
        {"t": round(wall, 4), "updates": updates, "loss": final_loss}]
    run = Run(config=config, workers=len(results) * W, updates=updates, wall_s=wall,
              initial_loss=initial_loss, final_loss=final_loss,
              staleness={"update_gap": within["gap"], "clock_lag": within["lag"]},
              per_worker=per_worker, loss_curve=curve,
              params=params if keep_params else None, out=out,
              extra={"backend": "ray", "engine": results[0]["engine"],
                     **{k: sum(r.get(k, 0) for r in results)
                        for k in ("samples", "nonfinite_skipped", "events_recorded",
                                  "events_dropped")},
                     "events_stride": max(r.get("events_stride", 1) for r in results),
                     "nodes": nodes,
                     "cross_node": {"update_gap": across["gap"], "clock_lag": within["lag"],
                                    "exchanges": sum(x["cross_node"]["exchanges"]
                                                     for x in nodes),
                                    "bytes": int(traffic),
                                    "bytes_per_update": round(traffic / updates, 1)
                                    if updates else None},
                     "metrics": metrics_of(wl, params, data), "ended": {"how": "done"}})
    note_skipped(run, per_sample=config.get("lane") == "sample")
    if out is not None:
        write_outputs(run, out)
    return run
