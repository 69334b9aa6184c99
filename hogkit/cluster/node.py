"""One node of a cluster run: a whole single-node live run (its shared-memory stores,
its lock-free workers, its supervisor) plus the agent that connects it to the
parameter shards.

:class:`NodeRun` is a :class:`~hogkit.engine.live.LiveRun` with one gate row in its
clocks and an :class:`~hogkit.cluster.agent.Agent` started once every store exists and finished
(one last exchange, marked done) once its workers are; everything else (spawning,
supervision, failures, shutdown, segment cleanup) is the single-node runtime's. It
knows nothing of Ray: the exchange is a callable, so the node is tested with
in-process shards too.
"""

from __future__ import annotations

import threading

from hogkit.cluster.agent import Agent
from hogkit.errors import InvalidArgument, RunFailed, WorkerFailed
from hogkit.engine.live import LiveRun

__all__ = ["NodeRun", "NodeFailed", "policy_bound"]


class NodeFailed(RunFailed):
    """A node of a cluster run failed: ``node`` and, when a worker was the cause, its
    ``rank`` within the node."""

    def __init__(self, node, message, rank=None, cause=None):
        self.node, self.rank, self.cause_name = node, rank, cause
        super().__init__(message)

    def __reduce__(self):
        return (NodeFailed, (self.node, str(self), self.rank, self.cause_name))


def policy_bound(policy):
    """The bound the gate enforces between nodes: the policy's ``cluster_bound`` (SSP's
    s, BSP 0, DSSP's s_lo (its grants stretch it as on one node), ``math.inf`` for
    Async and LocalSGD). A policy that declares none is refused."""
    bound = getattr(policy, "cluster_bound", None)
    if bound is None:
        raise InvalidArgument(f"policy={policy!r} has no bound between the nodes of a "
                              f"cluster run (its cluster_bound is None); use Async(), "
                              f"BSP(), SSP(s), DSSP(lo, hi) or LocalSGD(h) there")
    return bound


class NodeRun(LiveRun):
    """A node's live run (module docstring)."""

    gate_rows = 1

    def __init__(self, plan, engine, *, node, nodes, ranges, exchange, sync_every,
                 fraction=1.0, backlog=None, schedule=None, wait_timeout=60.0, grace=2.0):
        super().__init__(plan, engine, wait_timeout=wait_timeout, grace=grace)
        self.node, self.nodes = node, nodes
        self.ranges, self.exchange = ranges, exchange
        self.sync_every, self.fraction, self.backlog = sync_every, fraction, backlog
        self.schedule = schedule
        self.agent = None
        self.ready = threading.Event()

    def _started(self, stack):
        self.agent = Agent(self.node, self.nodes, self.params, self.clocks,
                           self.plan.workers, self.ranges, self.exchange,
                           sync_every=self.sync_every, bound=policy_bound(self.plan.policy),
                           fraction=self.fraction, backlog=self.backlog,
                           schedule=self.schedule)
        self.agent.start()
        stack.callback(self.agent.halt)       # on every exit path
        self.ready.set()

    def _supervise(self, errdir, progress):
        try:
            wall = super()._supervise(errdir, progress)
        except WorkerFailed as e:
            self.agent.finish(push=False)          # its error, if any, is the cause
            raise NodeFailed(self.node, f"node {self.node}: worker {e.rank} failed: {e}",
                             rank=e.rank, cause=e.cause) from e
        except BaseException:
            self.agent.halt()
            raise
        self.agent.finish()                      # the agent's own failure raises here
        return wall

    def _drop_views(self):
        """Keep a copy of the node's staleness log for :meth:`result` (read after the
        run), then let go of the views as every live run does."""
        if self.log is not None:
            W = self.plan.workers
            self._log_copy = {"log_gap_hist": self.log.gap_hist[:W].copy(),
                              "log_lag_hist": self.log.lag_hist[:W].copy(),
                              "log_stats": self.log.stats[:W].copy()}
        super()._drop_views()

    def stop(self):
        """Ask this node's workers to stop (from another thread: the driver)."""
        if self.ready.wait(0) and self.clocks is not None:
            self.clocks.request_stop()

    def result(self, run) -> dict:
        """What the driver gets back: the node's summary, its cross-node staleness
        and traffic, and its staleness histograms to merge."""
        out = run.summary()
        out["cross_node"] = {**self.agent.summary(), "log": {
            "log_gap_hist": self.agent.log.gap_hist.copy(),
            "log_lag_hist": self.agent.log.lag_hist.copy(),
            "log_stats": self.agent.log.stats.copy()}}
        out["log"] = self._log_copy
        return out
