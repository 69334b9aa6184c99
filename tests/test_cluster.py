"""The cluster backend's parts without Ray: parameter shards and node agents over real
``Shard`` objects in this process (the exchange is a plain call), against plain-numpy
sums. The Ray runs are in test_cluster_ray.py."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import hogkit
from hogkit import Async, BSP, InvalidArgument
from hogkit.state.clocks import DONE, RUNNING, Clocks
from hogkit.cluster.agent import Agent, plan_messages
from hogkit.cluster.shard import Shard, local_exchange, row_ranges
from hogkit.p3.propagation import parse_schedule


def test_row_ranges_cover_every_row_once():
    for n, s in [(10, 3), (5000, 4), (2, 5), (1, 1)]:
        rr = row_ranges(n, s)
        assert len(rr) == s and rr[0][0] == 0 and rr[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(rr, rr[1:]))
        sizes = [hi - lo for lo, hi in rr]
        assert max(sizes) - min(sizes) <= 1


def test_shard_push_then_pull_returns_only_what_changed():
    sh = Shard(0, {"w": np.zeros((4, 2), np.float32)}, nodes=2)
    r = sh.exchange(0, 3, 5, {"w": (np.array([1]), np.ones((1, 2), np.float32))})
    # node 0 gets back the row it changed, with the version vector and clocks
    assert r["rows"]["w"][0].tolist() == [1]
    assert r["versions"].tolist() == [5, 0] and r["clocks"].tolist() == [3, 0]
    # node 1's first exchange sees node 0's row; its second sees nothing new
    r1 = sh.exchange(1, 1, 2, {"w": (np.array([3]), np.full((1, 2), 2, np.float32))})
    assert sorted(r1["rows"]["w"][0].tolist()) == [1, 3]
    r1 = sh.exchange(1, 1, 0, {"w": (np.array([], np.int64), np.zeros((0, 2), np.float32))})
    assert r1["rows"]["w"][0].size == 0
    assert r1["versions"].tolist() == [5, 2]
    r0 = sh.exchange(0, 4, 0, {}, done=True)
    assert r0["rows"]["w"][0].tolist() == [3] and r0["done"].tolist() == [True, False]
    np.testing.assert_array_equal(sh.snapshot()["values"]["w"],
                                  [[0, 0], [1, 1], [0, 0], [2, 2]])


class _Node:
    """A node without processes: private views, clocks with the gate row, an agent."""

    def __init__(self, node, nodes, init, shards, workers=1, order=None, **kw):
        specs = Clocks.specs(workers + 1)
        self.clocks = Clocks({k: np.zeros(s, d) for k, (s, d) in specs.items()})
        self.clocks.state[:] = RUNNING
        self.params = {k: v.copy() for k, v in init.items()}
        ranges = {k: row_ranges(v.shape[0], len(shards)) for k, v in init.items()}

        inner = local_exchange(shards, order)

        def exchange(node, messages, need=None):
            self.needs.append(need)
            for k, answer in enumerate(inner(node, messages, need)):
                yield answer
                if self.between is not None:     # another node's exchange interleaves
                    self.between(k)
        self.needs, self.between = [], None
        self.agent = Agent(node, nodes, self.params, self.clocks, workers, ranges, exchange,
                           **kw)

    def update(self, name, row, value, rank=0):
        """A worker's update: write, count it, finish the iteration."""
        self.params[name][row] += value
        self.clocks.updates[rank] += 1
        self.clocks.iterations[rank] += 1


def _cluster(init, nodes=2, servers=2, **kw):
    shards = [Shard(s, {k: v[lo:hi] for k, v in init.items()
                        for lo, hi in [row_ranges(v.shape[0], servers)[s]]}, nodes)
              for s in range(servers)]
    return shards, [_Node(n, nodes, init, shards, **kw) for n in range(nodes)]


def _global(shards):
    snaps = [s.snapshot()["values"] for s in shards]
    return {k: np.concatenate([sn[k] for sn in snaps]) for k in snaps[0]}


def test_agents_carry_each_nodes_updates_to_the_other_and_publish_the_gate():
    init = {"w": np.zeros((6, 3), np.float64), "b": np.zeros(5, np.float64)}
    shards, (a, b) = _cluster(init)
    a.update("w", 0, 1.0)
    a.update("b", 4, 2.0)
    b.update("w", 5, 3.0)
    assert not a.agent.cycle()             # b has pushed nothing yet: no news
    assert b.agent.cycle()                 # b pulls a's updates
    a.agent.cycle()
    expect = {"w": np.zeros((6, 3)), "b": np.zeros(5)}
    expect["w"][0] += 1.0
    expect["w"][5] += 3.0
    expect["b"][4] += 2.0
    for node in (a, b):
        for k in init:
            np.testing.assert_array_equal(node.params[k], expect[k])
    for k in init:
        np.testing.assert_array_equal(_global(shards)[k], expect[k])
    # the gate row carries the other node's clock; its update count stays 0
    assert a.clocks.iterations[1] == 1 and b.clocks.iterations[1] == 2
    assert a.clocks.updates[1] == 0
    # b's reads since its last exchange lacked a's 2 updates
    assert b.agent.summary()["update_gap"]["max"] == 2


def test_a_done_remote_node_no_longer_binds():
    shards, (a, b) = _cluster({"w": np.zeros(4)}, bound=0)
    b.update("w", 1, 1.0)
    b.agent.finish(push=True)              # no thread: the final exchange, marked done
    a.agent.cycle()
    assert a.clocks.state[1] == DONE
    assert not a.agent.due()               # nothing binds a any more


def test_bounded_policy_exchanges_at_the_edge_of_the_bound():
    _, (a, _b) = _cluster({"w": np.zeros(4)}, bound=2, sync_every=100)
    a.update("w", 0, 1.0)
    assert not a.agent.due()               # 1 ahead of the gate, bound 2
    a.update("w", 0, 1.0)
    assert a.agent.due()                   # at the edge: exchange before it blocks


def test_backlog_gate_follows_the_nodes_own_clock():
    _, (a, _b) = _cluster({"w": np.zeros(4)}, backlog=3, sync_every=1000)
    for _ in range(3):
        a.update("w", 0, 1.0)
    assert a.agent.due()
    a.agent.cycle()
    assert a.clocks.iterations[1] == 3     # the gate: a's clock at its last exchange


_SCHEDULES = [None, "fifo", "priority", "slicing:3", "p3:2", "p3:1"]


def _order(kind, rnd):
    """How the messages of one exchange reach the shards: as sent, reversed, shuffled
    (an asynchronous actor may start them in any order)."""
    if kind == "sent":
        return None
    if kind == "reversed":
        return lambda msgs: range(len(msgs) - 1, -1, -1)
    return lambda msgs: rnd.sample(range(len(msgs)), len(msgs))


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 1), st.sampled_from(["upd", "sync"]),
                              st.integers(0, 12), st.floats(-4, 4, allow_nan=False)),
                    max_size=40),
       fraction=st.sampled_from([1.0, 0.5, 0.2]), servers=st.integers(1, 3),
       schedule=st.sampled_from(_SCHEDULES),
       order=st.sampled_from(["sent", "reversed", "shuffled"]), rnd=st.randoms())
@example(ops=[(1, "upd", 0, 1e-06)], fraction=0.5, servers=1, schedule=None, order="sent",
         rnd=random.Random(0))          # a residual below allclose's default rtol
def test_no_update_is_lost_whatever_the_exchange_order_and_density(
        ops, fraction, servers, schedule, order, rnd):
    """Sequential interleavings (no racing writes): after both nodes' final exchanges
    the global model is the initial one plus every update, with a push fraction < 1
    too (the rest is sent later, never dropped), with any schedule and whatever order
    a sliced exchange's messages reach the shards in; and each node then holds it."""
    init = {"w": np.arange(16.0).reshape(8, 2), "b": np.arange(5.0)}
    shards, nodes = _cluster(init, servers=servers, fraction=fraction,
                             order=_order(order, rnd),
                             schedule=None if schedule is None else parse_schedule(schedule))
    expect = {k: v.copy() for k, v in init.items()}
    for n, op, row, v in ops:
        if op == "upd":
            name = "w" if row < 8 else "b"
            nodes[n].update(name, row % 8, v)
            expect[name][row % 8] += v
        else:
            nodes[n].agent.cycle()
    for _ in range(40):                    # a fraction < 1 needs several pushes to drain
        for node in nodes:
            node.agent.cycle()
        # drained to the final check's tolerance (allclose's default rtol 1e-5 took a
        # residual of 1e-6 on a weight of 1 for drained and stopped too soon)
        if all(np.allclose(nd.params[k], nd.agent.base[k], rtol=0.0, atol=1e-10)
               for nd in nodes for k in init):
            break
    for node in nodes:
        node.agent.cycle()
    for k in init:
        np.testing.assert_allclose(_global(shards)[k], expect[k], atol=1e-9)
        for node in nodes:
            np.testing.assert_allclose(node.params[k], expect[k], atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 1), st.booleans(), st.integers(0, 7),
                              st.integers(-1, 6)), max_size=40),
       servers=st.integers(1, 3), schedule=st.sampled_from(_SCHEDULES),
       order=st.sampled_from(["sent", "reversed", "shuffled"]), rnd=st.randoms())
def test_the_gate_clock_is_a_promise_under_any_schedule(ops, servers, schedule, order, rnd):
    """Whenever a node's gate row says the other node reached clock c, every row of its
    store holds the other node's first c updates of that row, also when its exchange
    ran between two messages of the other's (each update a distinct power of two, so
    which updates a value holds is readable from its bits)."""
    init = {"w": np.zeros((8, 1))}
    shards, nodes = _cluster(init, servers=servers, order=_order(order, rnd),
                             schedule=None if schedule is None else parse_schedule(schedule))
    done = [[], []]                        # each node's updates: (row, value), in order
    bit = 0

    def check(n):
        c = nodes[n].clocks.iterations[1]          # the gate row: the other's clock
        for row, v in done[1 - n][:c]:
            held = int(nodes[n].params["w"][row, 0])
            assert held & int(v), (f"node {n}'s gate says the other reached {c} but row "
                                   f"{row} lacks its update {v:g}")

    for n, upd, row, at in ops:
        if upd:
            v = float(2 ** bit)
            bit += 1
            nodes[n].update("w", row, v)
            done[n].append((row, v))
            continue
        # node n exchanges; after its message `at` node 1-n makes a whole exchange
        def between(k, n=n, at=at):
            if k == at:
                nodes[1 - n].agent.cycle()
                check(1 - n)
        nodes[n].between = between
        nodes[n].agent.cycle()
        nodes[n].between = None
        check(n)


@pytest.mark.parametrize("S", [2, 16], ids=["2 shards", "more shards than rows"])
def test_plan_messages_cover_each_row_once_in_the_schedules_order(S):
    shapes = {"in.w": (10, 4), "in.b": (10,), "out.w": (3, 10)}
    ranges = {k: row_ranges(v[0], S) for k, v in shapes.items()}
    assert plan_messages(shapes, ranges) == [(s, None, 1) for s in range(S)]
    for spec, first in (("fifo", "out.w"), ("slicing:8", "out.w"), ("priority", "in.w"),
                        ("p3:8", "in.w")):
        plan = plan_messages(shapes, ranges, parse_schedule(spec))
        assert next(iter(plan[0][1])) == first, spec
        for name, shape in shapes.items():
            for s, (lo, hi) in enumerate(ranges[name]):
                got = sorted(r for sh, w, _ in plan if sh == s and name in w
                             for r in range(*w[name]))
                assert got == list(range(hi - lo)), (spec, name, s)
        for s in range(S):                 # the last message to a shard counts them all
            mine = [p for p in plan if p[0] == s]
            assert [p[2] for p in mine] == [None] * (len(mine) - 1) + [len(mine)]
    if S > 2:
        return
    # p3:8 on a 4-wide parameter: 2 rows a slice; a 10-wide one: 1 row
    p3 = plan_messages(shapes, ranges, parse_schedule("p3:8"))
    assert {w["in.w"][1] - w["in.w"][0] for _, w, _ in p3 if "in.w" in w} == {1, 2}
    assert {w["out.w"][1] - w["out.w"][0] for _, w, _ in p3 if "out.w" in w} == {1}


def test_a_sliced_exchange_publishes_the_clock_once_every_part_is_in():
    sh = Shard(0, {"w": np.zeros((4, 1))}, 2)
    one = np.ones((1, 1))
    # the clock-carrying part arrives first: the clock waits for the other two
    sh.exchange(0, 5, 7, {"w": (np.array([3]), one)}, window={"w": (2, 4)}, parts=3)
    r = sh.exchange(0, None, 0, {"w": (np.array([0]), one)}, window={"w": (0, 1)})
    assert r["clocks"].tolist() == [0, 0] and r["versions"].tolist() == [0, 0]
    assert r["rows"]["w"][0].tolist() == [0]             # only its own window
    r = sh.exchange(0, None, 0, {"w": (np.array([1]), one)}, window={"w": (1, 2)})
    assert r["clocks"].tolist() == [5, 0] and r["versions"].tolist() == [7, 0]
    # node 1 pulls window (0, 2) then the rest: each row once
    r = sh.exchange(1, 2, 1, {}, window={"w": (0, 2)})
    assert r["rows"]["w"][0].tolist() == [0, 1]
    r = sh.pull(1)
    assert r["rows"]["w"][0].tolist() == [3]
    assert sh.pull(1)["rows"]["w"][0].size == 0


def test_cluster_arguments_are_checked_before_ray_starts():
    import hogkit.cluster
    from hogkit.cluster import Cluster
    bad = [dict(cluster=dict(nodes=0)), dict(cluster=dict(servers=0)),
           dict(cluster=dict(sync_every=0)), dict(cluster=dict(push_fraction=1.5)),
           dict(cluster=dict(address="nowhere")),
           dict(cluster=dict(backlog=4), policy=BSP()),
           dict(workers=dict(stragglers={4: hogkit.Slowdown(2.0)})), dict(steps=1),
           dict(cluster=dict(schedule="p4")), dict(cluster=dict(schedule="p3:0")),
           dict(cluster=dict(schedule=3)), dict(workers=dict(n=0)),
           dict(cluster=dict(call_timeout=0)), dict(cluster=dict(start_timeout=-1)),
           dict(workers=dict(wait_timeout=0)), dict(workers=dict(grace=-1))]
    for kw in bad:
        with pytest.raises((InvalidArgument, hogkit.InvalidType)):
            args = dict(steps=100, policy=Async(), workers=hogkit.Workers(1),
                        cluster=Cluster(2))
            args.update({k: v for k, v in kw.items() if not isinstance(v, dict)})
            if "cluster" in kw:
                args["cluster"] = Cluster(**{"nodes": 2, **kw["cluster"]})
            if "workers" in kw:
                args["workers"] = hogkit.Workers(**{"n": 1, **kw["workers"]})
            hogkit.cluster.train("mf", **args)


def test_a_local_run_takes_no_cluster_option_and_a_cluster_run_no_local_one():
    """``hogkit.train`` holds what every local run needs; the cluster's options are
    :func:`hogkit.cluster.train`'s (a TypeError naming the keyword), and what a cluster
    run cannot do yet is refused by name before Ray starts."""
    import hogkit.cluster
    from hogkit.cluster import Cluster
    for kw in (dict(backend="ray"), dict(nodes=2), dict(cluster=Cluster(2))):
        with pytest.raises(TypeError, match=next(iter(kw))):
            hogkit.train("mf", **kw)
    for kw, name in ((dict(outputs=hogkit.Outputs(resume="/tmp/x")), "resume"),
                     (dict(workers=hogkit.Workers(1, on_failure="restart")), "on_failure"),
                     (dict(outputs=hogkit.Outputs("/tmp/x", checkpoint_every=5.0)),
                      "checkpoint_every"),
                     (dict(workers=hogkit.Workers(1, max_restarts=1)), "max_restarts")):
        with pytest.raises(InvalidArgument, match=name):
            hogkit.cluster.train("mf", steps=100, cluster=Cluster(2), **kw)


def test_policy_bound_of_each_policy():
    from hogkit.cluster.node import policy_bound
    assert policy_bound(BSP()) == 0 and policy_bound(hogkit.SSP(3)) == 3
    assert policy_bound(Async()) == math.inf and policy_bound(hogkit.DSSP(1, 4)) == 1
    assert policy_bound(hogkit.LocalSGD(8)) == math.inf


def test_the_cluster_model_is_bounded_by_compute_and_pipelines_sliced_exchanges():
    from hogkit.cluster.model import (exchange_messages, network_from_round_trips,
                                      predict_updates_per_s)
    from hogkit.p3.comm import Network
    net = network_from_round_trips(2e-3, 6e-3, 1_000_000)
    assert net.latency == pytest.approx(1e-3) and net.overhead == 0
    assert net.bandwidth == pytest.approx(2 * 1_000_000 / 4e-3)
    step = 100e-6
    rates = [predict_updates_per_s(step, k, 40_000, net, 2) for k in (1, 16, 256)]
    assert rates == sorted(rates)                       # longer periods amortise it
    assert all(r <= 2 / step * (1 + 1e-9) for r in rates)   # never past pure compute
    # preparing each exchange is compute the period pays
    assert predict_updates_per_s(step, 1, 40_000, net, 2, prep_s=1e-3) < rates[0]
    # whole layers are cut over the shards like the default; slices pipeline an
    # exchange that the link's bandwidth bounds (2 MB over 1 Gbit/s)
    slow = Network.gbps(1, latency=50e-6)
    shapes = {"emb": (5000, 100), "out": (100,)}
    assert exchange_messages(shapes, 2) == 2               # one per shard
    assert exchange_messages(shapes, 2, "fifo") == 4       # one per layer and shard
    sliced_n = exchange_messages(shapes, 2, "p3:40000")
    assert sliced_n == 2 * 7 + 2                   # 400 rows a slice; "out" whole per shard
    whole = predict_updates_per_s(step, 1, 2e6, slow, 2, servers=2)
    assert predict_updates_per_s(step, 1, 2e6, slow, 2, servers=2, messages=2) == whole
    assert predict_updates_per_s(step, 1, 2e6, slow, 2, servers=2, messages=4) >= whole
    sliced = predict_updates_per_s(step, 1, 2e6, slow, 2, servers=2, messages=sliced_n)
    assert sliced > 1.5 * whole
    # ...unless every message pays a fixed cost: then slicing a small exchange costs
    costly = Network.gbps(1, latency=50e-6, overhead=400e-6)
    assert (predict_updates_per_s(step, 1, 4_000, costly, 2, servers=2, messages=80)
            < 0.2 * predict_updates_per_s(step, 1, 4_000, costly, 2, servers=2))


def test_a_burst_of_round_trips_gives_the_per_message_overhead():
    """One round trip is 2·(overhead + latency); a burst of k in flight at once is
    k − 1 overheads more (the model's own arithmetic, checked by simulating it)."""
    from hogkit.cluster.model import network_from_round_trips
    from hogkit.p3.comm import Network, simulate_comm
    from hogkit.p3.profiles import Layer, Profile
    net = network_from_round_trips(2e-3, 6e-3, 1_000_000, burst_s=2e-3 + 15 * 300e-6,
                                   burst=16)
    assert net.overhead == pytest.approx(300e-6)
    assert net.latency == pytest.approx(1e-3 - 300e-6)

    def round_trip(messages):
        prof = Profile("p", (Layer("l", messages, 0.0, 1e-9),), 1, "test")
        sched = "fifo" if messages == 1 else "slicing:1"
        r = simulate_comm(prof, sched, Network(math.inf, net.latency, net.overhead),
                          workers=1, servers=1, bound=None, iterations=4, warmup=1)
        return r.iteration_s
    assert round_trip(1) == pytest.approx(2e-3, rel=1e-6)
    assert round_trip(16) == pytest.approx(2e-3 + 15 * 300e-6, rel=1e-6)
    with pytest.raises(InvalidArgument, match="burst"):
        network_from_round_trips(2e-3, 6e-3, 1_000, burst_s=3e-3, burst=1)


def test_a_policy_with_no_cluster_bound_is_refused_before_ray_starts():
    """BoundedDelay bounds update counts, which a node's gate row does not carry: the
    cluster entry refuses it up front, naming the policies it takes (no Ray needed)."""
    import hogkit
    with pytest.raises(InvalidArgument, match="cluster_bound is None"):
        hogkit.cluster.train("mf", workers=1, policy=hogkit.BoundedDelay(4), steps=100,
                             cluster=hogkit.cluster.Cluster(2))
