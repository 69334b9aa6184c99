"""Reader and StalenessLog: exact staleness on scripted interleavings, log summary/drain."""

from __future__ import annotations

import math
import multiprocessing as mp

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hogkit.state.clocks import Clocks
from hogkit.errors import InvalidArgument, InvalidType
from hogkit.kernels import staleness as _kstat
from hogkit.state.reader import EVENT_FIELDS, Reader, StalenessLog
from hogkit.state.store import ParamStore
from helpers import store_procs


def _store(workers, shards=1, ring=64, bins=16):
    return ParamStore.create({**Clocks.specs(workers, shards),
                              **StalenessLog.specs(workers, ring=ring, bins=bins)}, tag="rd")


@pytest.fixture
def two():
    with _store(2, shards=4) as s:
        v = s.views()
        yield Clocks(v), StalenessLog(v)


def _apply(clocks, rank, shards=None, n=1):
    for _ in range(n):
        clocks.tick_update(rank, None if shards is None else np.asarray(shards, np.int64))


# ----------------------------------------------------------------------- scripted staleness

def test_gap_counts_only_others_updates_since_read(two):
    clocks, log = two
    r0, r1 = Reader(clocks, log, 0), Reader(clocks, log, 1)
    r0.read()
    _apply(clocks, 1, n=3)          # w1 applies 3 updates
    assert r0.gap() == 3
    _apply(clocks, 0)               # w0's own update is not staleness
    assert r0.gap() == 3
    assert r0.commit(10) == (3, 0)
    r1.read()
    assert r1.gap() == 0
    _apply(clocks, 0, n=2)
    r0.read()
    assert r0.gap() == 0
    assert r1.commit(11) == (2, 0)
    assert r1.commit(12, gap=5) == (5, 0)  # an explicit gap is recorded as given


def test_per_shard_gap_counts_updates_that_touched_the_shards(two):
    clocks, log = two
    r0 = Reader(clocks, log, 0)
    assert r0.per_shard  # auto: the clocks have 4 shards
    _apply(clocks, 1, [0, 1])       # before the read: never counted
    r0.read()
    _apply(clocks, 1, [1], n=2)
    _apply(clocks, 1, [2, 1, 2])    # shard 2 once (distinct), shard 1 once
    _apply(clocks, 1)               # dense: every shard
    _apply(clocks, 0, [3], n=5)     # own updates never count
    sh = lambda *ids: np.array(ids, dtype=np.int64)  # noqa: E731
    assert r0.gap() == 4
    assert r0.gap(sh(1)) == 4
    assert r0.gap(sh(2)) == 2
    assert r0.gap(sh(0)) == 1
    assert r0.gap(sh(3)) == 1
    assert r0.gap(sh(1, 2)) == 4     # max over shards: never above the global gap
    assert r0.gap(sh(3, 0)) == 1
    assert r0.gap(sh()) == 0
    assert r0.commit(0, gap=r0.gap(sh(2))) == (2, 0)


def test_clock_lag_is_own_minus_slowest_at_read():
    with _store(3) as s:
        v = s.views()
        clocks, log = Clocks(v), StalenessLog(v)
        for _ in range(5):
            clocks.tick_iteration(1)
        clocks.tick_iteration(2)
        readers = [Reader(clocks, log, r) for r in range(3)]
        for r in readers:
            r.read()
        assert [r.lag for r in readers] == [0, 5, 1]
        clocks.tick_iteration(0)  # lag is fixed at read time
        assert [r.commit(0)[1] for r in readers] == [0, 5, 1]
        readers[1].read()
        assert readers[1].lag == 4


@st.composite
def schedules(draw, max_workers=4, max_shards=3, max_len=40):
    W = draw(st.integers(1, max_workers))
    S = draw(st.integers(1, max_shards))
    ops = draw(st.lists(st.one_of(
        st.tuples(st.just("read"), st.integers(0, W - 1)),
        st.tuples(st.just("apply"), st.integers(0, W - 1),
                  st.none() | st.lists(st.integers(0, S - 1), max_size=4)),
        st.tuples(st.just("gap"), st.integers(0, W - 1),
                  st.lists(st.integers(0, S - 1), max_size=3, unique=True))),
        max_size=max_len))
    return W, S, ops


@given(schedules())
def test_gap_matches_a_naive_replay(schedule):
    """Against the definition: replay the history of applies and count by hand."""
    W, S, ops = schedule
    with _store(W, shards=S) as s:
        v = s.views()
        clocks, log = Clocks(v), StalenessLog(v)
        readers = [Reader(clocks, log, r, shards=True) for r in range(W)]
        history, read_at = [], {}
        for op in ops:
            if op[0] == "read":
                readers[op[1]].read()
                read_at[op[1]] = len(history)
            elif op[0] == "apply":
                touched = set(range(S)) if op[2] is None else set(op[2])
                clocks.tick_update(op[1], None if op[2] is None
                                   else np.array(op[2], dtype=np.int64))
                history.append((op[1], touched))
            elif op[1] in read_at:
                w, ids = op[1], op[2]
                since = [t for who, t in history[read_at[w]:] if who != w]
                assert readers[w].gap() == len(since)
                want = max((sum(i in t for t in since) for i in ids), default=0)
                assert readers[w].gap(np.array(ids, dtype=np.int64)) == want


# ----------------------------------------------------------------------- log

def test_summary_is_exact_with_overflow_bins():
    with _store(2, bins=4) as s:   # values 0, 1, 2 exact; >= 3 in the overflow bin
        log = StalenessLog(s.views())
        gaps0 = [0, 1, 1, 2, 7]
        gaps1 = [3, 0, 2, 2, 2, 100]
        for k, g in enumerate(gaps0):
            log.record(0, step=k, gap=g, lag=k % 2, t_ns=k)
        for k, g in enumerate(gaps1):
            log.record(1, step=k, gap=g, lag=0, t_ns=100 + k)
        allg = gaps0 + gaps1
        sm = log.summary()
        g = sm["gap"]
        assert g["count"] == 11 and g["max"] == 100
        assert g["mean"] == pytest.approx(np.mean(allg))
        assert g["histogram"] == {0: 2, 1: 2, 2: 4, 3: 3}
        assert g["overflow"] == 3
        assert g["p50"] == 2                     # sorted: 0 0 1 1 2 2 2 2 3 7 100 -> 2
        assert g["p99"] == 3                     # in the overflow bin: the lower bound
        g0 = log.summary(0)["gap"]
        assert g0["count"] == 5 and g0["max"] == 7 and g0["mean"] == pytest.approx(2.2)
        assert g0["p50"] == 1 and g0["histogram"] == {0: 1, 1: 2, 2: 1, 3: 1}
        lag = sm["lag"]
        assert lag["count"] == 11 and lag["max"] == 1 and lag["histogram"] == {0: 9, 1: 2}
        assert lag["p50"] == 0 and lag["p99"] == 1


def test_empty_summary():
    with _store(2) as s:
        sm = StalenessLog(s.views()).summary()
        assert sm["gap"] == {"count": 0, "mean": 0.0, "p50": 0, "p99": 0, "p999": 0,
                             "max": 0, "overflow": 0, "lower_bounds": [], "histogram": {}}


def test_drain_returns_new_events_in_time_order():
    with _store(2, ring=8) as s:
        log = StalenessLog(s.views())
        log.record(1, step=0, gap=2, lag=1, t_ns=20)
        log.record(0, step=0, gap=0, lag=0, t_ns=10)
        log.record(0, step=1, gap=1, lag=0, t_ns=30)
        ev, cur, dropped = log.drain()
        assert dropped == 0 and cur.tolist() == [2, 1]
        assert [e["t_ns"] for e in ev] == [10, 20, 30]
        assert ev[1] == dict(zip(EVENT_FIELDS, (1, 0, 2, 1, 20)))
        assert all(type(x) is int for e in ev for x in e.values())
        ev, same, dropped = log.drain(cur)
        assert ev == [] and same.tolist() == cur.tolist() and dropped == 0
        log.record(1, step=1, gap=0, lag=0, t_ns=40)
        ev, cur2, dropped = log.drain(cur)
        assert [e["step"] for e in ev] == [1] and cur2.tolist() == [2, 2] and dropped == 0


def test_drain_reports_ring_overflow():
    with _store(2, ring=4) as s:
        log = StalenessLog(s.views())
        for k in range(3):
            log.record(0, step=k, gap=k, lag=0, t_ns=k)
        ev, cur, dropped = log.drain()
        assert dropped == 0 and len(ev) == 3  # ring - 1 events: all of them
        for k in range(3, 11):
            log.record(0, step=k, gap=k, lag=0, t_ns=k)
        ev, cur, dropped = log.drain()
        # the full ring's oldest slot (event 7) might be mid-overwrite: not trusted
        assert dropped == 8 and [e["step"] for e in ev] == [8, 9, 10]
        assert cur.tolist() == [11, 0]
        assert log.summary(0)["gap"]["count"] == 11  # histograms keep everything


def test_drain_drops_events_overwritten_while_copying():
    with _store(1, ring=4) as s:
        log = StalenessLog(s.views())
        for k in range(3):
            log.record(0, step=k, gap=0, lag=0, t_ns=k)
        real = log.events

        class LapsDuringCopy:
            """The writer records 3 more events right after the drain copied its rows."""
            def __getitem__(self, idx):
                rows = real[idx]
                log.events = real
                for k in range(3, 6):
                    log.record(0, step=k, gap=0, lag=0, t_ns=k)
                return rows

        log.events = LapsDuringCopy()
        ev, cur, dropped = log.drain()
        # copied events 0, 1, 2; afterwards the cursor is 6, so slots of events <= 2
        # may have been rewritten mid-copy: only events >= 6 - 4 + 1 = 3 are trusted.
        assert ev == [] and dropped == 3 and cur.tolist() == [3]
        ev, cur, dropped = log.drain(cur)
        assert [e["step"] for e in ev] == [3, 4, 5] and dropped == 0


def test_log_bad_input():
    with _store(2) as s:
        log = StalenessLog(s.views())
        with pytest.raises(InvalidArgument, match="rank=2"):
            log.record(2, step=0, gap=0, lag=0, t_ns=0)
        with pytest.raises(InvalidArgument, match="rank=-1"):
            log.record(-1, step=0, gap=0, lag=0, t_ns=0)
        with pytest.raises(InvalidArgument, match="gap=-1"):
            log.record(0, step=0, gap=-1, lag=0, t_ns=0)
        with pytest.raises(InvalidArgument, match="cursors"):
            log.drain([0])
        with pytest.raises(InvalidArgument, match="ahead"):
            log.drain([5, 0])
        with pytest.raises(InvalidArgument, match="rank"):
            log.summary(2)
        assert log.summary()["gap"]["count"] == 0
    for kw, match in (({"workers": 0}, "workers"), ({"workers": 1, "ring": 0}, "ring"),
                      ({"workers": 1, "bins": 1}, "bins")):
        with pytest.raises(InvalidArgument, match=match):
            StalenessLog.specs(**kw)
    with pytest.raises(InvalidArgument, match="log_stats"):
        StalenessLog({"log_gap_hist": np.zeros((1, 2), np.int64)})


def test_reader_bad_input(two):
    clocks, log = two
    r = Reader(clocks, log, 1, shards=False)
    with pytest.raises(InvalidArgument, match="before read"):
        r.gap()
    with pytest.raises(InvalidArgument, match="before read"):
        r.commit(0)
    with pytest.raises(InvalidArgument, match="before read"):
        r.commit(0, gap=1)
    r.read()
    with pytest.raises(InvalidArgument, match="shards=True"):
        r.gap(np.array([0], dtype=np.int64))
    rs = Reader(clocks, log, 0)
    rs.read()
    with pytest.raises(InvalidArgument, match="outside"):
        rs.gap(np.array([4], dtype=np.int64))
    with pytest.raises(InvalidArgument, match="rank=2"):
        Reader(clocks, log, 2)
    with pytest.raises(InvalidType, match="shards"):
        Reader(clocks, log, 0, shards="yes")
    with _store(3) as s3:
        with pytest.raises(InvalidArgument, match="3 workers"):
            Reader(clocks, StalenessLog(s3.views()), 0)
    assert Reader(clocks, None, 0).per_shard  # a reader without a log still measures


# ----------------------------------------------------------------------- real workers

@pytest.mark.process
def test_two_real_workers_fill_the_shared_log():
    steps = 300
    ctx = mp.get_context("spawn")
    with _store(2, ring=1024, bins=64) as s:
        v = s.views()
        clocks, log = Clocks(v), StalenessLog(v)
        procs = [ctx.Process(target=store_procs.child_worker, args=(s.handle, r, steps))
                 for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0]
        assert clocks.updates.tolist() == [steps, steps]
        assert clocks.iterations.tolist() == [steps, steps]
        assert (clocks.state == clocks.DONE).all() and (clocks.heartbeat_ns > 0).all()
        sm = log.summary()
        assert sm["gap"]["count"] == sm["lag"]["count"] == 2 * steps
        assert 0 <= sm["gap"]["max"] <= steps and sum(sm["gap"]["histogram"].values()) == 2 * steps
        ev, cur, dropped = log.drain()
        assert dropped == 0 and len(ev) == 2 * steps and cur.tolist() == [steps, steps]
        for r in range(2):
            assert [e["step"] for e in ev if e["rank"] == r] == list(range(steps))
        assert sum(e["gap"] for e in ev) == round(sm["gap"]["mean"] * 2 * steps)


# --- percentiles at every scale (log-linear bins) ----------------------------------------

def _exact(values, q):
    v = np.sort(values)
    return int(v[max(1, math.ceil(q * len(v))) - 1])


@pytest.mark.parametrize("planted", ["uniform", "spike", "wide"])
def test_percentiles_are_within_one_percent_at_every_scale(planted):
    """Uniform to 10**6, a spike at 5,000 on a small background, and values spread over
    2**0 .. 2**40: p50/p99/p999 within 1 % of the exact nearest-rank value, the histogram
    merged across workers, nothing read as a lower bound."""
    rng = np.random.default_rng(0)
    n = 60_000
    if planted == "uniform":
        values = rng.integers(0, 10**6 + 1, n)
    elif planted == "spike":
        values = np.where(rng.random(n) < 0.995, 5_000, rng.integers(0, 100, n))
    else:
        values = (2.0 ** rng.uniform(0, 40, n)).astype(np.int64)
    with _store(3, ring=16, bins=_kstat.HIST_BINS) as s:
        log = StalenessLog(s.views())
        for i, v in enumerate(values.tolist()):
            log.record(i % 3, step=i, gap=v, lag=v, t_ns=0)
        sm = log.summary()
    for part in ("gap", "lag"):
        g = sm[part]
        assert g["count"] == n and g["max"] == int(values.max()) and g["lower_bounds"] == []
        for name, q in (("p50", 0.50), ("p99", 0.99), ("p999", 0.999)):
            exact = _exact(values, q)
            assert abs(g[name] - exact) <= 0.01 * exact, (name, g[name], exact)


def test_a_value_past_the_range_is_a_named_lower_bound():
    with _store(1, ring=16, bins=_kstat.HIST_BINS) as s:
        log = StalenessLog(s.views())
        for i in range(10):
            log.record(0, step=i, gap=2**41, lag=0, t_ns=0)
        g = log.summary()["gap"]
    assert g["p50"] == 2**40 and "p50" in g["lower_bounds"] and g["overflow"] == 10
    assert g["max"] == 2**41
