"""Past one machine: the same training on a Ray cluster, with shared-memory Hogwild!
inside each node.

``hogkit.train(..., backend="ray", nodes=N, workers=per_node)`` (and ``hogkit run
--backend ray``) lands here. Rooms:

- :mod:`~hogkit.cluster.shard`: a parameter shard (rows of every parameter, version
  vector, node clocks), push-then-pull in one atomic exchange;
- :mod:`~hogkit.cluster.agent`: a node's agent thread (deltas up, values down, the
  gate row that holds local workers to the cluster's bound, cross-node staleness);
- :mod:`~hogkit.cluster.node`: a node = the single-node live run + its agent;
- :mod:`~hogkit.cluster.backend`: the Ray actors and the driver.

This module checks the cluster's own arguments and builds one plan per node (the
same :func:`~hogkit.engine.plan.make_plan` checks as a single-node run, before Ray starts).
"""

from __future__ import annotations

import dataclasses

from hogkit.errors import InvalidArgument
from hogkit.policy import SSP, Async
from hogkit.p3.propagation import parse_schedule
from hogkit.validation import check_float, check_int

__all__ = ["train_cluster", "node_plans"]


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


def train_cluster(workload, *, nodes, workers, address, servers, sync_every, push_fraction,
                  backlog, schedule, stragglers, steps, out, keep_params, eval_every, resume,
                  on_failure, checkpoint_every, engine, wait_timeout, grace, call_timeout=30.0,
                  start_timeout=120.0, **plan_kwargs):
    """``train(backend="ray", ...)``: checks, plans, then :func:`backend.run_cluster`."""
    from hogkit.cluster.backend import check_address, require_ray, run_cluster
    from hogkit.engine.plan import eval_interval, make_plan
    from hogkit.report import environment
    from hogkit.engine.runtime import choose_engine

    nodes = check_int("nodes", nodes, min_value=1, fix="use nodes=1 or more")
    servers = check_int("servers", servers, min_value=1,
                        fix="servers is how many parameter-shard actors: 1 or more")
    sync_every = check_int("sync_every", sync_every, min_value=1,
                           fix="node-clock iterations between exchanges: 1 or more")
    push_fraction = check_float("push_fraction", push_fraction, min_value=0.0,
                                max_value=1.0, exclude_min=True,
                                fix="the share of each push's non-zero entries sent, in (0, 1]")
    call_timeout = check_float("call_timeout", call_timeout, min_value=0.0, exclude_min=True)
    start_timeout = check_float("start_timeout", start_timeout, min_value=0.0,
                                exclude_min=True)
    address = check_address(address)
    if schedule is not None:
        schedule = parse_schedule(schedule)
    if backlog is not None:
        backlog = check_int("backlog", backlog, min_value=0,
                            fix="iterations a node may run ahead of its last exchange")
    for name, value, ok, fix in (
            ("resume", resume, None, "resume is for single-node runs"),
            ("on_failure", on_failure, "stop", "a cluster run stops at the first failure"),
            ("checkpoint_every", checkpoint_every, None,
             "a cluster run writes no checkpoints yet; use checkpoint_every=None")):
        if value != ok and not (name == "checkpoint_every" and value == "auto"):
            raise InvalidArgument(f'{name}={value!r} is not supported with backend="ray"; '
                                  f"{fix}")
    stragglers = dict(stragglers or {})
    W = check_int("workers", workers, min_value=1, fix="workers per node: 1 or more")
    for g in stragglers:
        check_int("straggler rank", g, min_value=0, max_value=nodes * W - 1,
                  fix=f"ranks are global: node n's worker r is n * {W} + r")
    def make(**kw):
        return make_plan(workload, workers=W, spawn=True, **plan_kwargs, **kw)

    plan = make(steps=steps, out=out, keep_params=keep_params, eval_every=eval_every)
    plans = node_plans(plan, nodes, stragglers, make)
    if backlog is not None:
        if not isinstance(plan.policy, Async):
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
                       out=plan.out, keep_params=keep_params,
                       config=config, wait_timeout=wait_timeout, grace=grace,
                       call_timeout=call_timeout, start_timeout=start_timeout)
