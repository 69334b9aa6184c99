"""Consistency policies: the pure predicate, the wait loop over real Clocks (threads as
workers), failure and stop handling, DSSP's run-time bound, LocalSGD's merge math, CLI."""

from __future__ import annotations

import json
import math
import pickle
import threading
import time

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hogkit.state.clocks import DONE, FAILED, IDLE, RUNNING, Clocks
from hogkit.errors import InvalidArgument, InvalidType, PolicyTimeout, WorkerFailed
from hogkit.policy import (DSSP, SSP, Async, BSP, LocalSGD, clock_lag, dssp_extra,
                           may_proceed)
from hogkit.policy.local_sgd import local_delta, merge
from hogkit.parse import parse_policy


def make_clocks(workers, shards=1):
    return Clocks({name: np.zeros(shape, dtype)
                   for name, (shape, dtype) in Clocks.specs(workers, shards).items()})


def naive_lag(iterations, state, rank):
    """Reference: own clock minus the minimum over non-DONE workers and rank itself."""
    it = np.asarray(iterations)
    keep = np.asarray(state) != DONE
    keep[rank] = True
    return int(it[rank] - it[keep].min())


# --------------------------------------------------------------------------- pure rule

@st.composite
def clock_states(draw, max_workers=8, max_clock=20):
    W = draw(st.integers(1, max_workers))
    it = draw(st.lists(st.integers(0, max_clock), min_size=W, max_size=W))
    state = draw(st.lists(st.sampled_from([IDLE, RUNNING, DONE, FAILED]),
                          min_size=W, max_size=W))
    rank = draw(st.integers(0, W - 1))
    state[rank] = RUNNING
    return np.array(it, np.int64), np.array(state, np.int64), rank


@given(clock_states(), st.integers(0, 6))
def test_ssp_never_proceeds_past_the_bound(cs, s):
    it, state, rank = cs
    lag = naive_lag(it, state, rank)
    assert clock_lag(it, state, rank) == lag
    ok = SSP(s).may_proceed(it, state, rank)
    assert ok == (lag <= s)
    if ok:
        assert lag <= s
    # looser bounds admit everything tighter ones admit
    if ok:
        assert SSP(s + 1).may_proceed(it, state, rank)


@given(clock_states())
def test_bsp_is_ssp0_and_async_is_ssp_inf(cs):
    it, state, rank = cs
    assert BSP() == SSP(0) and Async() == SSP(math.inf)
    assert BSP().bound == 0 and Async().bound == math.inf
    assert BSP().may_proceed(it, state, rank) == SSP(0).may_proceed(it, state, rank)
    assert Async().may_proceed(it, state, rank) is True
    assert SSP(math.inf).may_proceed(it, state, rank) is True
    assert may_proceed(it, state, rank, 0) == (naive_lag(it, state, rank) == 0)


def test_policies_are_classes_users_can_isinstance():
    assert isinstance(BSP(), SSP) and isinstance(Async(), SSP)
    assert isinstance(SSP(0), BSP) and isinstance(SSP(math.inf), Async)
    assert not isinstance(SSP(3), (BSP, Async))
    for p in (BSP(), Async(), SSP(2)):
        q = pickle.loads(pickle.dumps(p))
        assert type(q) is type(p) and q == p
    with pytest.raises(InvalidArgument, match=r"BSP is SSP\(0\); got s=2: use SSP\(2\)"):
        BSP(2)


@given(clock_states(), st.integers(0, 4), st.integers(0, 50))
def test_done_workers_never_block(cs, s, frozen):
    it, state, rank = cs
    before = SSP(s).may_proceed(it, state, rank)
    done = [q for q in range(len(it)) if state[q] == DONE and q != rank]
    it2 = it.copy()
    it2[done] = frozen                 # whatever a DONE worker's clock says
    assert SSP(s).may_proceed(it2, state, rank) == before


def test_bad_bounds_name_value_and_fix():
    with pytest.raises(InvalidArgument, match=r"staleness bound s=-1 must be a "
                       r"non-negative int; use Async\(\) for unbounded"):
        SSP(-1)
    with pytest.raises(InvalidType):
        SSP(1.5)
    with pytest.raises(InvalidType):
        SSP(True)
    with pytest.raises(InvalidArgument, match="s_lo <= s_hi"):
        DSSP(3, 1)
    with pytest.raises(InvalidArgument, match="finite"):
        DSSP(0, math.inf)
    with pytest.raises(InvalidArgument, match="h=0"):
        LocalSGD(0)


def test_config_repr_pickle():
    for p in (Async(), BSP(), SSP(3), DSSP(1, 4), LocalSGD(8, overlap=True)):
        json.dumps(p.config())
        q = pickle.loads(pickle.dumps(p))
        assert repr(q) == repr(p) and q.config() == p.config()
    assert repr(BSP()) == "BSP()" and repr(Async()) == "Async()" and repr(SSP(2)) == "SSP(2)"
    assert Async().config() == {"name": "async", "s": None}
    assert BSP().config() == {"name": "bsp", "s": 0}


# --------------------------------------------------------------------------- wait loop

def run_workers(policy, *, workers=3, steps=30, straggler_s=2e-3, fast_s=2e-4,
                timeout=10.0):
    """Threads as workers over one Clocks; returns per-rank max lag seen at proceed."""
    clocks = make_clocks(workers)
    max_lag = [0] * workers
    errors = []

    def body(rank):
        try:
            clocks.set_state(rank, RUNNING)
            clocks.beat(rank)
            for _ in range(steps):
                policy.wait(clocks, rank, timeout=timeout)
                it = clocks.iterations
                lag = int(it[rank] - it.min())          # naive: over ALL workers
                max_lag[rank] = max(max_lag[rank], lag)
                time.sleep(straggler_s if rank == 0 else fast_s)
                clocks.tick_iteration(rank, beat=True)     # DSSP's timing: finish + time
            clocks.set_state(rank, DONE)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
            clocks.set_state(rank, FAILED)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert clocks.iterations.tolist() == [steps] * workers
    return max_lag, policy


@pytest.mark.parametrize("s", [0, 2])
def test_threads_ssp_lag_never_exceeds_s(s):
    max_lag, _ = run_workers(SSP(s))
    assert max(max_lag) <= s
    if s == 0:
        assert max(max_lag) == 0


def test_threads_bsp_lag_is_zero():
    max_lag, _ = run_workers(BSP())
    assert max(max_lag) == 0


def test_threads_async_lag_exceeds_any_small_bound():
    # quality check: the harness does catch lag when nothing bounds it
    max_lag, _ = run_workers(Async(), steps=40)
    assert max(max_lag) >= 5


def test_threads_dssp_stays_within_hi_and_grants_in_range():
    policy = DSSP(1, 3)
    max_lag, _ = run_workers(policy, steps=40)
    assert max(max_lag) <= 3
    g = policy.grants()
    assert g and set(g) <= {0, 1, 2}
    assert max(g) >= 1, g          # the fast workers got extra while rank 0 lagged


@pytest.mark.timeout(30)                # "at once": waiting out the 600 s would fail here
def test_failed_peer_raises_at_once_naming_rank():
    clocks = make_clocks(3)
    clocks.iterations[:] = [5, 2, 5]
    clocks.state[:] = [RUNNING, FAILED, RUNNING]
    with pytest.raises(WorkerFailed) as ei:    # not PolicyTimeout: it did not wait it out
        BSP().wait(clocks, 0, timeout=600.0)
    assert ei.value.rank == 1 and "FAILED" in str(ei.value)


def test_frozen_peer_times_out_naming_it_as_suspect():
    clocks = make_clocks(3)
    clocks.iterations[:] = [5, 2, 5]
    clocks.state[:] = RUNNING
    clocks.heartbeat_ns[:] = time.monotonic_ns()
    clocks.heartbeat_ns[1] = time.monotonic_ns() - 30 * 10**9
    t0 = time.monotonic()
    with pytest.raises(PolicyTimeout) as ei:
        SSP(1).wait(clocks, 0, timeout=0.2)
    dt = time.monotonic() - t0
    assert 0.2 <= dt < 2.0
    msg = str(ei.value)
    assert "worker 1 (clock 2" in msg and "suspect" in msg and "SSP(1)" in msg
    assert ei.value.blockers == [1] and ei.value.suspects == [1]
    assert isinstance(ei.value, TimeoutError)


def test_wait_returns_on_stop_and_when_peer_catches_up():
    clocks = make_clocks(2)
    clocks.iterations[:] = [3, 0]
    clocks.state[:] = RUNNING
    threading.Timer(0.05, clocks.request_stop).start()
    waited = BSP().wait(clocks, 0, timeout=5.0)
    assert 0.03 < waited < 1.0 and clocks.stopping()

    clocks = make_clocks(2)
    clocks.iterations[:] = [3, 2]
    clocks.state[:] = RUNNING
    threading.Timer(0.05, clocks.tick_iteration, args=(1,)).start()
    waited = BSP().wait(clocks, 0, timeout=5.0)
    assert 0.03 < waited < 1.0


def test_done_peer_does_not_block_wait():
    clocks = make_clocks(3)
    clocks.iterations[:] = [10, 2, 10]
    clocks.state[:] = [RUNNING, DONE, RUNNING]
    assert BSP().wait(clocks, 0, timeout=0.0) == 0.0


def test_async_and_local_never_wait():
    clocks = make_clocks(2)
    clocks.iterations[:] = [100, 0]
    clocks.state[:] = [RUNNING, FAILED]
    assert Async().wait(clocks, 0, timeout=0.0) == 0.0
    assert LocalSGD(4).wait(clocks, 0, timeout=0.0) == 0.0


# --------------------------------------------------------------------------- DSSP

def test_dssp_controller_examples():
    # slowest's next finish at t=3; fastest finishes at 0,1,2,... -> r*=3
    assert dssp_extra(0.0, 1.0, -7.0, 10.0, 5) == 3
    # slowest finishes right now -> no extra
    assert dssp_extra(0.0, 1.0, -10.0, 10.0, 5) == 0
    # beyond the window: take the largest r (closest)
    assert dssp_extra(0.0, 1.0, 0.0, 100.0, 4) == 4
    # unknown timing or no room -> 0
    assert dssp_extra(0.0, 0.0, 0.0, 10.0, 4) == 0
    assert dssp_extra(0.0, 1.0, -7.0, 10.0, 0) == 0


@given(st.floats(0, 1e9), st.floats(1e-3, 1e7), st.floats(-1e9, 1e9), st.floats(1e-3, 1e7),
       st.integers(0, 10))
def test_dssp_controller_in_range(lf, iv_f, ls, iv_s, r_max):
    assert 0 <= dssp_extra(lf, iv_f, ls, iv_s, r_max) <= r_max


@given(st.integers(0, 3), st.integers(0, 3), st.integers(2, 5),
       st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 3)),
                min_size=1, max_size=25))
def test_dssp_bound_always_within_lo_hi(s_lo, extra, W, script):
    """Scripted clocks: random ticks and waits (timeout 0, so a block raises at once)."""
    s_hi = s_lo + extra
    policy = DSSP(s_lo, s_hi)
    clocks = make_clocks(W)
    clocks.state[:] = RUNNING
    now = time.monotonic_ns()
    for who, ticks, waiter in script:
        who %= W
        waiter %= W
        clocks.iterations[who] += ticks
        clocks.heartbeat_ns[who] = now + int(clocks.iterations[who]) * 10**6 * (who + 1)
        lag = naive_lag(clocks.iterations, clocks.state, waiter)
        try:
            policy.wait(clocks, waiter, timeout=0.0)
        except PolicyTimeout:
            assert lag > s_lo
        else:
            assert lag <= policy.current_bound(waiter) or lag <= s_lo
            assert lag <= s_hi
        assert s_lo <= policy.current_bound(waiter) <= s_hi
    assert all(0 <= r <= extra for r in policy.grants())


def test_dssp_grants_extra_to_fastest_when_slowest_lags():
    policy = DSSP(0, 3)
    clocks = make_clocks(2)          # worker 0 slow (100 ms/iter), worker 1 fast (1 ms)
    clocks.state[:] = RUNNING
    ms = 10**6
    now = time.monotonic_ns()
    clocks.iterations[:] = [1, 2]                       # lag of worker 1: 1 > s_lo = 0
    clocks.heartbeat_ns[:] = [now - 70 * ms, now]       # last finishes
    clocks.interval_ns[:] = [100 * ms, 1 * ms]          # latest iteration times
    assert policy.wait(clocks, 1, timeout=1.0) == 0.0   # granted: no wait at all
    # the slowest finishes again in ~30 ms: the fast one's finishes at +0..3 ms are all
    # earlier, so the closest is the last of the window, r* = s_hi - s_lo
    assert policy.grants(1) == {3: 1}
    assert policy.current_bound(1) == 3
    # and without the grant it would have blocked: lag 1 > s_lo = 0
    assert not SSP(0).may_proceed(clocks.iterations, clocks.state, 1)


def test_dssp_without_timings_behaves_as_ssp_lo():
    policy = DSSP(0, 3)
    clocks = make_clocks(2)
    clocks.state[:] = RUNNING
    clocks.iterations[:] = [1, 2]                       # no intervals recorded yet
    with pytest.raises(PolicyTimeout):
        policy.wait(clocks, 1, timeout=0.0)
    assert policy.grants(1) == {0: 1}


def test_dssp_not_fastest_gets_no_extra():
    policy = DSSP(0, 3)
    clocks = make_clocks(3)
    clocks.state[:] = RUNNING
    clocks.iterations[:] = [1, 2, 3]
    with pytest.raises(PolicyTimeout):
        policy.wait(clocks, 1, timeout=0.0)
    assert policy.grants(1) == {0: 1}


# --------------------------------------------------------------------------- LocalSGD

@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_local_merge_of_all_workers_is_the_model_average(W, n, seed):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(n)
    replicas = [base + rng.standard_normal(n) for _ in range(W)]
    shared = base.copy()
    for r in replicas:
        merge(shared, local_delta(r, base), workers=W)
    np.testing.assert_allclose(shared, np.mean(replicas, axis=0), rtol=1e-12, atol=1e-12)


def test_local_helpers_check_inputs_and_phase():
    p = LocalSGD(4)
    assert p.bound == math.inf and not p.overlap
    assert [k for k in range(12) if p.merges_after(k)] == [3, 7, 11]
    a = np.zeros(3, np.float32)
    with pytest.raises(InvalidType):
        local_delta(a, np.zeros(3, np.float64))
    with pytest.raises(InvalidArgument):
        merge(a, np.zeros(4, np.float32), workers=2)
    with pytest.raises(InvalidArgument):
        merge(a, np.zeros(3, np.float32), workers=0)
    merge(a, np.ones(3, np.float32), workers=2)
    assert a.tolist() == [0.5, 0.5, 0.5]


# --------------------------------------------------------------------------- CLI

@pytest.mark.parametrize("text, expect", [
    ("async", Async()), ("BSP", BSP()), ("ssp:3", SSP(3)), (" ssp:0 ", BSP()),
    ("local:8", LocalSGD(8)), ("local:8:overlap", LocalSGD(8, overlap=True)),
])
def test_parse_policy(text, expect):
    assert parse_policy(text) == expect


def test_parse_dssp():
    p = parse_policy("dssp:1:4")
    assert isinstance(p, DSSP) and (p.s_lo, p.s_hi) == (1, 4)


@pytest.mark.parametrize("text, match", [
    ("ssp:-1", r"s=-1 must be a non-negative int; use Async\(\) for unbounded"),
    ("ssp", "argument"), ("ssp:x", "s='x' is not an int"), ("sssp:1", "unknown policy"),
    ("dssp:4:1", "s_lo <= s_hi"), ("dssp:1", "argument"), ("local:0", "h=0"),
    ("local:2:fast", "overlap"), ("async:1", "argument"),
])
def test_parse_policy_errors(text, match):
    with pytest.raises(InvalidArgument, match=match):
        parse_policy(text)


def test_parse_policy_type():
    with pytest.raises(InvalidType):
        parse_policy(3)
