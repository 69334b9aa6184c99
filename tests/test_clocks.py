"""Clocks: single-writer counters over store views."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hogkit.state.clocks import DONE, FAILED, IDLE, RUNNING, Clocks
from hogkit.errors import InvalidArgument, InvalidType
from hogkit.state.store import ParamStore


@pytest.fixture
def clocks():
    with ParamStore.create(Clocks.specs(3, shards=4), tag="clk") as s:
        yield Clocks(s.views())


def test_specs():
    sp = Clocks.specs(2, shards=5)
    assert all(k.startswith("clk_") for k in sp)
    assert sp["clk_shard_updates"] == ((2, 5), np.dtype(np.int64))
    # one 64-byte row per worker, so a worker's writes never invalidate a peer's line
    assert sp["clk_slots"] == ((2, 8), np.dtype(np.int64))
    assert sp["clk_stop"] == ((8,), np.dtype(np.int64))
    for bad in (0, -1):
        with pytest.raises(InvalidArgument, match="workers"):
            Clocks.specs(bad)
    with pytest.raises(InvalidArgument, match="shards"):
        Clocks.specs(2, shards=0)
    with pytest.raises(InvalidType):
        Clocks.specs(2.0)


def test_fresh_clocks_are_zero(clocks):
    assert clocks.workers == 3 and clocks.shards == 4
    for a in (clocks.updates, clocks.iterations, clocks.heartbeat_ns, clocks.state,
              clocks.shard_updates, clocks.stop):
        assert not a.any()
    assert (clocks.state == IDLE).all() and not clocks.stopping()


def test_ticks_touch_only_the_own_slot(clocks):
    clocks.tick_update(1)
    clocks.tick_update(1)
    clocks.tick_iteration(2)
    assert clocks.updates.tolist() == [0, 2, 0]
    assert clocks.iterations.tolist() == [0, 0, 1]
    assert clocks.total_updates() == 2 and clocks.min_iteration() == 0
    # a dense update (shards=None) touches every shard
    assert clocks.shard_updates.tolist() == [[0] * 4, [2] * 4, [0] * 4]


def test_tick_update_counts_each_distinct_shard_once(clocks):
    clocks.tick_update(0, np.array([3, 1, 3, 3], dtype=np.int64))
    clocks.tick_update(0, np.array([1], dtype=np.int32))
    clocks.tick_update(0, np.array([], dtype=np.int64))
    assert clocks.updates[0] == 3
    assert clocks.shard_updates[0].tolist() == [0, 2, 0, 1]


def test_one_shard_dense_path():
    with ParamStore.create(Clocks.specs(2), tag="clk") as s:
        c = Clocks(s.views())
        c.tick_update(1)
        assert c.shard_updates.tolist() == [[0], [1]]


def test_beat_state_stop(clocks):
    t0 = time.monotonic_ns()
    clocks.beat(2)
    assert t0 <= clocks.heartbeat_ns[2] <= time.monotonic_ns()
    clocks.set_state(0, RUNNING)
    clocks.set_state(1, DONE)
    clocks.set_state(2, FAILED)
    assert clocks.state.tolist() == [RUNNING, DONE, FAILED]
    with pytest.raises(InvalidArgument, match="state 7"):
        clocks.set_state(0, 7)
    clocks.request_stop()
    assert clocks.stopping() and clocks.stop[0] == 1


@pytest.mark.parametrize("rank", [-1, 3, 100])
def test_bad_rank_never_wraps_to_another_slot(clocks, rank):
    for call in (lambda: clocks.tick_update(rank), lambda: clocks.tick_iteration(rank),
                 lambda: clocks.beat(rank), lambda: clocks.set_state(rank, RUNNING)):
        with pytest.raises(InvalidArgument, match=r"rank=.* must be in \[0, 3\)"):
            call()
    assert not clocks.updates.any() and not clocks.iterations.any()


def test_bad_shards(clocks):
    with pytest.raises(InvalidArgument, match="outside"):
        clocks.tick_update(0, np.array([4], dtype=np.int64))
    with pytest.raises(InvalidArgument, match="outside"):
        clocks.tick_update(0, np.array([-1], dtype=np.int64))
    with pytest.raises(InvalidType, match="int64"):
        clocks.tick_update(0, np.array([1.0]))
    with pytest.raises(InvalidType):
        clocks.tick_update(0, [1, 2])
    with pytest.raises(InvalidType):
        clocks.tick_update(1.5)
    assert not clocks.updates.any()


def test_views_are_checked():
    good = {k: np.zeros(shape, dt) for k, (shape, dt) in Clocks.specs(2, 3).items()}
    Clocks(good)
    with pytest.raises(InvalidArgument, match="clk_stop"):
        Clocks({k: v for k, v in good.items() if k != "clk_stop"})
    with pytest.raises(InvalidType, match="int64"):
        Clocks({**good, "clk_slots": np.zeros((2, 8), np.int32)})
    with pytest.raises(InvalidArgument, match="shape"):
        Clocks({**good, "clk_slots": np.zeros((2, 4), np.int64)})
    with pytest.raises(InvalidArgument, match="shape"):
        Clocks({**good, "clk_shard_updates": np.zeros((3, 3), np.int64)})
    with pytest.raises(InvalidType, match="mapping"):
        Clocks([1, 2])


def test_the_slots_are_the_views():
    """updates, iterations... are views of one cache line per worker."""
    with ParamStore.create(Clocks.specs(2), tag="clk") as s:
        c = Clocks(s.views())
        c.tick_update(1)
        c.tick_iteration(1, beat=True)
        assert c.slots[1, :2].tolist() == [1, 1]
        assert c.heartbeat_ns[1] > 0 and c.interval_ns[1] == 0    # no previous beat
        c.tick_iteration(1, beat=True)
        assert c.interval_ns[1] > 0 and c.iterations[1] == 2
        assert c.slots.strides[0] == 64


def test_lag_leaves_done_workers_out():
    with ParamStore.create(Clocks.specs(3), tag="clk") as s:
        c = Clocks(s.views())
        c.iterations[:] = [5, 2, 4]
        assert c.lag(0) == 3
        c.state[1] = DONE                 # a finished worker never holds the others
        assert c.lag(0) == 1 and c.lag(1) == 0
