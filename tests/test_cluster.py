"""The cluster backend's parts without Ray: parameter shards and node agents over real
``Shard`` objects in this process (the exchange is a plain call), against plain-numpy
sums. The Ray runs are in test_cluster_ray.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hogkit
from hogkit import Async, BSP, InvalidArgument
from hogkit.clocks import DONE, RUNNING, Clocks
from hogkit.cluster.agent import Agent
from hogkit.cluster.shard import Shard, row_ranges


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

    def __init__(self, node, nodes, init, shards, workers=1, **kw):
        specs = Clocks.specs(workers + 1)
        self.clocks = Clocks({k: np.zeros(s, d) for k, (s, d) in specs.items()})
        self.clocks.state[:] = RUNNING
        self.params = {k: v.copy() for k, v in init.items()}
        ranges = {k: row_ranges(v.shape[0], len(shards)) for k, v in init.items()}

        def exchange(node, clock, updates, deltas, done, need=None):
            self.needs.append(need)
            return [s.exchange(node, clock, updates, d, done) for s, d in zip(shards, deltas)]
        self.needs = []
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


@settings(max_examples=30)
@given(ops=st.lists(st.tuples(st.integers(0, 1), st.sampled_from(["upd", "sync"]),
                              st.integers(0, 7), st.floats(-4, 4, allow_nan=False)),
                    max_size=40),
       fraction=st.sampled_from([1.0, 0.5, 0.2]), servers=st.integers(1, 3))
def test_no_update_is_lost_whatever_the_exchange_order_and_density(ops, fraction, servers):
    """Sequential interleavings (no racing writes): after both nodes' final exchanges
    the global model is the initial one plus every update, with a push fraction < 1
    too (the rest is sent later, never dropped); and each node then holds it."""
    init = {"w": np.arange(16.0).reshape(8, 2)}
    shards, nodes = _cluster(init, servers=servers, fraction=fraction)
    expect = init["w"].copy()
    for n, op, row, v in ops:
        if op == "upd":
            nodes[n].update("w", row, v)
            expect[row] += v
        else:
            nodes[n].agent.cycle()
    for _ in range(40):                    # a fraction < 1 needs several pushes to drain
        for node in nodes:
            node.agent.cycle()
        if all(np.allclose(nd.params["w"], nd.agent.base["w"]) for nd in nodes):
            break
    for node in nodes:
        node.agent.cycle()
    np.testing.assert_allclose(_global(shards)["w"], expect, atol=1e-9)
    for node in nodes:
        np.testing.assert_allclose(node.params["w"], expect, atol=1e-9)


def test_cluster_arguments_are_checked_before_ray_starts():
    with pytest.raises(InvalidArgument, match='add backend="ray"'):
        hogkit.train("mf", nodes=2)
    with pytest.raises(InvalidArgument, match="backend"):
        hogkit.train("mf", backend="spark")
    bad = [dict(nodes=0), dict(servers=0), dict(sync_every=0), dict(push_fraction=1.5),
           dict(address="nowhere"), dict(backlog=4, policy=BSP()),
           dict(resume="/tmp/x"), dict(on_failure="restart"), dict(checkpoint_every=5.0),
           dict(stragglers={4: hogkit.Slowdown(2.0)}), dict(steps=1)]
    for kw in bad:
        args = dict(backend="ray", nodes=2, workers=1, steps=100, policy=Async())
        args.update(kw)
        with pytest.raises((InvalidArgument, hogkit.InvalidType)):
            hogkit.train("mf", **args)


def test_policy_bound_of_each_policy():
    from hogkit.cluster.node import policy_bound
    assert policy_bound(BSP()) == 0 and policy_bound(hogkit.SSP(3)) == 3
    assert policy_bound(Async()) == math.inf and policy_bound(hogkit.DSSP(1, 4)) == 1
    assert policy_bound(hogkit.LocalSGD(8)) == math.inf
