"""Past one machine: the same training on a Ray cluster, with shared-memory Hogwild!
inside each node.

:func:`train` (``hogkit.cluster.train(workload, nodes=N, workers=per_node, ...)``, and
``hogkit run --backend ray``) is the entry. Rooms:

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

from hogkit.cluster.backend import check_address, require_ray, run_cluster
from hogkit.cluster.node import policy_bound
from hogkit.engine.mainguard import check_main_guard
from hogkit.engine.plan import eval_interval, make_plan
from hogkit.engine.run import Run
from hogkit.engine.runtime import choose_engine
from hogkit.errors import InvalidArgument
from hogkit.p3.propagation import parse_schedule
from hogkit.policy import SSP, Async
from hogkit.report import environment
from hogkit.validation import check_float, check_int

__all__ = ["train", "node_plans"]


def node_plans(plan, nodes, stragglers, make):
    """One plan per node, each checked by ``make`` (:func:`~hogkit.engine.plan.make_plan`'s
    keywords): the steps split over the nodes (as a plan splits them over its
    workers), each node's own random stream (``stream = node``: the same data and
    initial model, different samples), stragglers keyed by global rank ``node ·
    workers + local rank`` moved to their node."""
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
        p = make(steps=steps[n], stragglers=mine or None, out=None, keep_params=False,
                 eval_every=None)
        out.append(dataclasses.replace(p, stream=n))
    return out


def train(workload="mf", *, nodes, workers, policy=None, rule=None, density=None,
          batch=None, steps=None, seconds=None, seed=0, nonfinite="raise", stragglers=None,
          eval_every="auto", out=None, keep_params=True, workload_options=None, shards=1,
          engine="auto", events="sampled", wait_timeout=60.0, grace=2.0, address=None,
          servers=1, sync_every=1, push_fraction=1.0, backlog=None, schedule=None,
          call_timeout=30.0, start_timeout=120.0) -> Run:
    """Train ``workload`` on ``nodes`` nodes of ``workers`` worker processes each: every
    node a single-node run whose agent exchanges deltas with ``servers`` parameter-shard
    actors, the policy's bound held across nodes. Returns one
    :class:`~hogkit.engine.run.Run` whose summary adds ``nodes`` and ``cross_node``.

    nodes, workers : Ray node actors, and worker processes in each (≥ 1).
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

    The rest as in :func:`hogkit.train`; ``steps`` and straggler ranks are over the
    whole cluster (node n's worker r is rank ``n · workers + r``). Not (yet) on a
    cluster: resuming, restarting workers, checkpoints.

    Raises InvalidArgument / InvalidType before Ray starts, NodeFailed (the node, and
    the worker's rank) or ShardFailed when a node or shard fails, Interrupted on
    SIGINT/SIGTERM; every actor is killed and no segment is left.
    """
    check_main_guard("hogkit.cluster.train()")
    nodes, servers, sync_every, push_fraction, backlog = _exchange_settings(
        nodes, servers, sync_every, push_fraction, backlog)
    timeouts = _timeouts(call_timeout, start_timeout, wait_timeout, grace)
    address = check_address(address)
    schedule = None if schedule is None else parse_schedule(schedule)
    W = check_int("workers", workers, min_value=1, fix="workers per node: 1 or more")
    stragglers = _global_stragglers(stragglers, nodes, W)

    def make(**kw):
        return make_plan(workload, workers=W, policy=policy, rule=rule, density=density,
                         batch=batch, seconds=seconds, seed=seed, nonfinite=nonfinite,
                         shards=shards, workload_options=workload_options, events=events,
                         spawn=True, lane="batch", **kw)

    plan = make(steps=steps, out=out, keep_params=keep_params, eval_every=eval_every)
    plans = node_plans(plan, nodes, stragglers, make)
    policy_bound(plan.policy)               # a policy refused across nodes: before Ray starts
    if backlog is not None:
        if plan.policy != Async():
            raise InvalidArgument(f"backlog={backlog} is for policy=Async() (a bounded policy "
                                  f"already bounds each node against the others); got "
                                  f"{plan.policy!r}")
        # the node's workers admit against the gate row, which follows the node's own
        # clock at its last exchange (hogkit.cluster.agent, *backlog*)
        plans = [dataclasses.replace(p, policy=SSP(backlog)) for p in plans]
    engine = choose_engine(engine, plan.workload, rule=plan.rule, density=plan.density,
                           batch=plan.batch, shards=plan.shards, policy=plan.policy,
                           stragglers=plans[0].stragglers or None)
    require_ray()
    config = plan.config(engine=engine, environment=environment())
    config.update(backend="ray", nodes=nodes, workers=nodes * W, workers_per_node=W,
                  servers=servers, sync_every=sync_every, push_fraction=push_fraction,
                  backlog=backlog, schedule=None if schedule is None else schedule.spec,
                  address=address, steps=steps, seconds=plan.seconds)
    return run_cluster(plans, engine, nodes=nodes, servers=servers, address=address,
                       sync_every=sync_every, fraction=push_fraction, backlog=backlog,
                       schedule=schedule, eval_every=eval_interval(plan, live=True)[0],
                       out=plan.out, keep_params=keep_params, config=config, **timeouts)


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


def _timeouts(call_timeout, start_timeout, wait_timeout, grace) -> dict:
    """The cluster's timeouts and the nodes' supervision settings, checked."""
    return {"call_timeout": check_float("call_timeout", call_timeout, min_value=0.0,
                                        exclude_min=True),
            "start_timeout": check_float("start_timeout", start_timeout, min_value=0.0,
                                         exclude_min=True),
            "wait_timeout": check_float("wait_timeout", wait_timeout, min_value=0.0,
                                        exclude_min=True),
            "grace": check_float("grace", grace, min_value=0.0)}


def _global_stragglers(stragglers, nodes, workers) -> dict:
    """``{global rank: model}``, every rank checked to be in the cluster."""
    stragglers = dict(stragglers or {})
    for g in stragglers:
        check_int("straggler rank", g, min_value=0, max_value=nodes * workers - 1,
                  fix=f"ranks are global: node n's worker r is n * {workers} + r")
    return stragglers
