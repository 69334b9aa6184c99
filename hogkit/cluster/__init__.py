"""Past one machine: the same training on a Ray cluster, with shared-memory Hogwild!
inside each node.

:func:`train` (``hogkit.cluster.train(workload, workers=per_node, cluster=Cluster(N,
...))``, and ``hogkit run --backend ray``) is the entry. Rooms:

- :mod:`~hogkit.cluster.shard`: a parameter shard (rows of every parameter, version
  vector, node clocks), push-then-pull in one atomic exchange;
- :mod:`~hogkit.cluster.agent`: a node's agent thread (deltas up, values down, the
  gate row that holds local workers to the cluster's bound, cross-node staleness);
- :mod:`~hogkit.cluster.node`: a node = the single-node live run + its agent;
- :mod:`~hogkit.cluster.backend`: the Ray actors and the driver.

This module checks the cluster's own arguments and builds one plan per node (the
same :func:`~hogkit.engine.plan.make_plan` checks as a single-node run, before Ray
starts), then hands them to :func:`~hogkit.cluster.backend.run_cluster`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from hogkit.cluster.backend import check_address, require_ray, run_cluster
from hogkit.cluster.node import policy_bound
from hogkit.engine.mainguard import check_main_guard
from hogkit.engine.plan import eval_interval, make_plan
from hogkit.engine.run import Run
from hogkit.engine.settings import Outputs, Workers
from hogkit.errors import InvalidArgument, InvalidType
from hogkit.p3.propagation import parse_schedule
from hogkit.policy import SSP, Async
from hogkit.report import environment
from hogkit.validation import check_float, check_int

__all__ = ["train", "Cluster", "node_plans"]


@dataclass(frozen=True)
class Cluster:
    """Where a cluster run runs and how its nodes exchange.

    nodes : Ray node actors (each a single-node run of ``workers`` processes).
    address : None (start a local Ray instance for the run), ``"auto"`` (join the
        cluster ``ray start --head`` made on this machine) or ``"ray://host:port"``.
    servers : parameter-shard actors; the rows of every parameter are cut over them.
    sync_every : iterations of a node's clock between its exchanges (1: as often as a
        round trip allows).
    push_fraction : the largest share of each delta's entries sent, the rest later.
    backlog : Async only: each node runs at most this many iterations ahead of its
        last exchange.
    schedule : a :class:`~hogkit.p3.propagation.Schedule` or ``"fifo"``,
        ``"slicing:N"``, ``"priority"``, ``"p3:N"``: each exchange cut into messages of
        about N parameters (input side first under priority and p3), each merged as it
        arrives; None: one message per shard.
    call_timeout, start_timeout : seconds an exchange, and the actors' start, may take.
    """

    nodes: int = 2
    address: Optional[str] = None
    servers: int = 1
    sync_every: int = 1
    push_fraction: float = 1.0
    backlog: Optional[int] = None
    schedule: object = None
    call_timeout: float = 30.0
    start_timeout: float = 120.0

    def __post_init__(self):
        n, servers, sync_every, fraction, backlog = _exchange_settings(
            self.nodes, self.servers, self.sync_every, self.push_fraction, self.backlog)
        for name, v in (("nodes", n), ("servers", servers), ("sync_every", sync_every),
                        ("push_fraction", fraction), ("backlog", backlog),
                        ("address", check_address(self.address)),
                        ("call_timeout", check_float("call_timeout", self.call_timeout,
                                                     min_value=0.0, exclude_min=True)),
                        ("start_timeout", check_float("start_timeout", self.start_timeout,
                                                      min_value=0.0, exclude_min=True))):
            object.__setattr__(self, name, v)
        if self.schedule is not None:
            object.__setattr__(self, "schedule", parse_schedule(self.schedule))


def node_plans(plan, nodes, stragglers, make):
    """One plan per node, each checked by ``make(steps, stragglers)``
    (:func:`~hogkit.engine.plan.make_plan` for a node): the steps split over the nodes
    (as a plan splits them over its workers), each node's own random stream (``stream =
    node``: the same data and initial model, different samples), stragglers keyed by
    global rank ``node · workers + local rank`` moved to their node."""
    W = plan.workers
    if plan.steps is None:
        steps = [None] * nodes
    else:
        q, r = divmod(plan.steps, nodes)
        steps = [q + (n < r) for n in range(nodes)]
        if min(steps) < W:
            raise InvalidArgument(f"steps={plan.steps} gives a node fewer steps than its "
                                  f"{W} workers; use steps >= {nodes * W}")
    out = []
    for n in range(nodes):
        mine = {g - n * W: m for g, m in stragglers.items() if n * W <= g < (n + 1) * W}
        out.append(dataclasses.replace(make(steps[n], mine), stream=n))
    return out


def train(workload="mf", *, workers=2, policy=None, rule=None, density=None, batch=None,
          steps=None, seconds=None, seed=0, engine=None, outputs=None,
          cluster=None) -> Run:
    """Train ``workload`` on ``cluster.nodes`` nodes of ``workers`` worker processes
    each: every node a single-node run whose agent exchanges deltas with the parameter-
    shard actors, the policy's bound held across nodes. Returns one
    :class:`~hogkit.engine.run.Run` whose summary adds ``nodes`` and ``cross_node``.

    workers : worker processes per node, or :class:`~hogkit.engine.settings.Workers`
        (straggler ranks over the whole cluster: node n's worker r is rank ``n ·
        workers + r``; ``wait_timeout`` and ``grace`` hold in each node).
    cluster : :class:`Cluster` (nodes, Ray's address, shard actors, the exchange).

    The rest as in :func:`hogkit.train`; ``steps`` are over the whole cluster, and the
    nodes run whole steps (the batch lane). Not (yet) on a cluster: resuming,
    restarting workers, checkpoints.

    Raises InvalidArgument / InvalidType before Ray starts, NodeFailed (the node, and
    the worker's rank) or ShardFailed when a node or shard fails, Interrupted on
    SIGINT/SIGTERM; every actor is killed and no segment is left.
    """
    check_main_guard("hogkit.cluster.train()")
    c = cluster if cluster is not None else Cluster()
    if not isinstance(c, Cluster):
        raise InvalidType(f"cluster={c!r} must be a hogkit.cluster.Cluster(nodes, ...)")
    wk, outs = Workers.of(workers), Outputs.of(outputs)
    wk.refuse("on_failure", "max_restarts", where="a cluster run (it stops at the first "
              "failure)")
    if outs.resume is not None or outs.checkpoint_every not in ("auto", None):
        raise InvalidArgument("a cluster run writes no checkpoints and cannot resume yet; "
                              "drop Outputs(resume=..., checkpoint_every=...)")
    W = wk.n
    stragglers = _global_stragglers(wk.stragglers, c.nodes, W)

    def make(node_steps, mine, outputs=Outputs(keep_params=False, eval_every=None,
                                               events=outs.events)):
        return make_plan(workload, workers=dataclasses.replace(wk, stragglers=mine or None),
                         policy=policy, rule=rule, density=density, batch=batch,
                         steps=node_steps, seconds=seconds, seed=seed, engine=engine,
                         outputs=outputs, mode="node")

    plan = make(steps, {}, outputs=dataclasses.replace(outs, checkpoint_every=None))
    plans = node_plans(plan, c.nodes, stragglers, make)
    policy_bound(plan.policy)               # a policy refused across nodes: before Ray starts
    if c.backlog is not None:
        if plan.policy != Async():
            raise InvalidArgument(f"backlog={c.backlog} is for policy=Async() (a bounded "
                                  f"policy already bounds each node against the others); "
                                  f"got {plan.policy!r}")
        # the node's workers admit against the gate row, which follows the node's own
        # clock at its last exchange (hogkit.cluster.agent, *backlog*)
        plans = [dataclasses.replace(p, policy=SSP(c.backlog)) for p in plans]
    require_ray()
    config = plan.config(engine=plan.engine, environment=environment())
    config.update(backend="ray", nodes=c.nodes, workers=c.nodes * W, workers_per_node=W,
                  servers=c.servers, sync_every=c.sync_every, push_fraction=c.push_fraction,
                  backlog=c.backlog, schedule=None if c.schedule is None else c.schedule.spec,
                  address=c.address, steps=steps if steps is not None else plan.steps,
                  seconds=plan.seconds)
    return run_cluster(plans, plan.engine, nodes=c.nodes, servers=c.servers,
                       address=c.address, sync_every=c.sync_every, fraction=c.push_fraction,
                       backlog=c.backlog, schedule=c.schedule,
                       eval_every=eval_interval(plan, live=True)[0], out=plan.out,
                       keep_params=outs.keep_params, config=config,
                       call_timeout=c.call_timeout, start_timeout=c.start_timeout,
                       wait_timeout=wk.wait_timeout, grace=wk.grace)


def _exchange_settings(nodes, servers, sync_every, push_fraction, backlog) -> tuple:
    """``(nodes, servers, sync_every, push_fraction, backlog)``, checked."""
    nodes = check_int("nodes", nodes, min_value=1, fix="use nodes=1 or more")
    servers = check_int("servers", servers, min_value=1,
                        fix="servers is how many parameter-shard actors: 1 or more")
    sync_every = check_int("sync_every", sync_every, min_value=1,
                           fix="node-clock iterations between exchanges: 1 or more")
    push_fraction = check_float("push_fraction", push_fraction, min_value=0.0,
                                max_value=1.0, exclude_min=True,
                                fix="the share of each push's non-zero entries sent, in (0, 1]")
    if backlog is not None:
        backlog = check_int("backlog", backlog, min_value=0,
                            fix="iterations a node may run ahead of its last exchange")
    return nodes, servers, sync_every, push_fraction, backlog


def _global_stragglers(stragglers, nodes, workers) -> dict:
    """``{global rank: model}``, every rank checked to be in the cluster."""
    stragglers = dict(stragglers or {})
    for g in stragglers:
        check_int("straggler rank", g, min_value=0, max_value=nodes * workers - 1,
                  fix=f"ranks are global: node n's worker r is n * {workers} + r")
    return stragglers
