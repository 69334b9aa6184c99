"""The policy contract: one admission state machine (``hogkit.kernels.clock.admit``)
against its plain-Python reference (tests/naive.py), every policy through one table of
capabilities, and the contract's two proofs on all three engines (live compiled, live
Python, simulated): BoundedDelay, a policy added in its own room, and a policy the
engines have never seen, defined here by subclassing :class:`~hogkit.policy.Policy`.

Bounded delay's evidence: in the simulator, the exact lead at every START (the Python
engine hands each START back; the fused engine must then agree bit for bit); live, the
reader's record of every update. With two workers and one update per iteration, a
worker admitted under K is at most 2K updates ahead of its peer, so each read's clock
lag is at most 2K + 1 (the peer may have applied its step and not yet ticked its
clock) and, since neither may start while more than 2K ahead, no update sees more than
4K + 1 updates by the other between its read and its apply.
"""

from __future__ import annotations

import json
import math
import pickle
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
import hogkit
from hogkit import workloads
from hogkit.cluster.node import policy_bound
from hogkit.engine.delays import LogNormal, Slowdown, StepTimes
from hogkit.engine.simulator import simulate, strip_wall
from hogkit.engine.step import PythonStep, compiled_support
from hogkit.errors import InvalidArgument, InvalidType, PolicyTimeout, WorkerFailed
from hogkit.kernels import clock as K
from hogkit.policy import (BSP, DSSP, SSP, Async, BoundedDelay, LocalSGD, Policy,
                           from_string)
from hogkit.rules.core import SGD
from hogkit.state.clocks import DONE, FAILED, IDLE, RUNNING, Clocks

MF = workloads.get("mf", preset="hot")
DELAYS = StepTimes(base=LogNormal(1e-3, 0.5), stragglers={1: Slowdown(3.0)})


class Lockstep1(Policy):
    """A policy of the user's own, unknown to every engine: SSP(1) by another name
    (it encodes as an existing kind; the engines read only the contract)."""

    cluster_bound = 1

    def encode(self):
        return self.row(K.K_SSP, 1)

    def __repr__(self):
        return "Lockstep1()"


# --------------------------------------------------------------------------- kernel

@st.composite
def slot_matrices(draw, max_workers=6):
    W = draw(st.integers(1, max_workers))
    slots = np.zeros((W, K.SLOT), np.int64)
    for q in range(W):
        slots[q, K.UPD] = draw(st.integers(0, 12))
        slots[q, K.ITER] = draw(st.integers(0, 12))
        slots[q, K.BEAT] = draw(st.sampled_from([0, 1]) | st.integers(1, 10**9))
        slots[q, K.INTERVAL] = draw(st.sampled_from([0]) | st.integers(1, 10**7))
        slots[q, K.STATE] = draw(st.sampled_from([IDLE, RUNNING, DONE, FAILED]))
    me = draw(st.integers(0, W - 1))
    slots[me, K.STATE] = RUNNING
    return slots, me


@st.composite
def policy_rows(draw):
    kind = draw(st.sampled_from([K.K_SSP, K.K_DSSP, K.K_DELAY]))
    a = draw(st.integers(-1 if kind == K.K_SSP else 0, 5))
    b = a + draw(st.integers(0, 4)) if kind == K.K_DSSP else 0
    return Policy.row(kind, a, b)


admission_states = st.tuples(st.integers(-1, 4), st.integers(0, 1), st.integers(0, 6))


@given(slot_matrices(), policy_rows(), admission_states)
def test_admit_matches_the_reference(sm, pol, adm0):
    slots, me = sm
    adm = np.array(adm0, np.int64)
    grants = np.zeros(K.GRANT_BINS, np.int64)
    ok = K.admit(slots, me, pol, adm, grants, K.clock_lag(slots, me))
    ok_ref, adm_ref, grants_ref = naive.admit(slots, me, pol, adm0, [0] * K.GRANT_BINS)
    assert bool(ok) == ok_ref
    assert adm.tolist() == adm_ref and grants.tolist() == grants_ref
    assert bool(K.admit_now(slots, me, pol, np.array(adm0, np.int64), grants)) == ok_ref


@given(slot_matrices(), policy_rows(), admission_states)
def test_the_common_case_on_scalars_is_admit_changing_nothing(sm, pol, adm0):
    """What the step core tests before it binds admit's arrays: when it holds, admit
    proceeds and leaves the state and the histogram as they were."""
    slots, me = sm
    lag = K.clock_lag(slots, me)
    if pol[K.P_KIND] == K.K_SSP and pol[K.P_A] < 0:
        return                                   # never asked: the core's `free`
    x = K.lead_given(slots, me, pol[K.P_KIND], lag)
    assert x == K.lead(slots, me, pol)
    if not K.admitted_as_is(pol[K.P_A], adm0[0], adm0[1], x):
        return
    adm, grants = np.array(adm0, np.int64), np.zeros(K.GRANT_BINS, np.int64)
    assert K.admit(slots, me, pol, adm, grants, lag)
    assert adm.tolist() == list(adm0) and not grants.any()


@given(slot_matrices(), policy_rows(), st.integers(0, 6))
def test_blocked_and_blockers_match_the_reference(sm, pol, wait):
    slots, me = sm
    adm = np.array([-1, 0, wait], np.int64)
    blocked = bool(K.blocked(slots, me, pol, adm))
    assert blocked == (not naive.within(slots, me, pol, wait))
    out = np.empty(len(slots), np.int64)
    ranks = out[:K.holding_back(slots, me, pol, adm, out)].tolist()
    assert ranks == naive.holding_back(slots, me, pol, wait)
    if blocked:
        assert ranks, "a blocked worker is held back by someone it can be told about"


@given(slot_matrices(), st.integers(0, 5))
def test_the_slowest_is_always_admitted_under_bounded_delay(sm, k):
    slots, _ = sm
    ranks = [q for q in range(len(slots)) if slots[q, K.STATE] != DONE]
    if not ranks:
        return
    slowest = min(ranks, key=lambda q: slots[q, K.UPD])
    assert K.update_lead(slots, slowest) <= 0
    assert BoundedDelay(k).may_proceed(slots[:, K.UPD], slots[:, K.STATE], slowest)


@settings(max_examples=60)
@given(st.integers(2, 5), policy_rows(),
       st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 4),
                          st.booleans()), min_size=1, max_size=30))
def test_a_run_of_admissions_follows_the_reference(W, pol, script):
    """Clocks move, workers ask and are released, episodes come and go: the kernel's
    state and histogram stay the reference's at every point."""
    slots = np.zeros((W, K.SLOT), np.int64)
    slots[:, K.STATE] = RUNNING
    adm = [K.admission_state() for _ in range(W)]
    grants = [np.zeros(K.GRANT_BINS, np.int64) for _ in range(W)]
    ref = [([-1, 0, 0], [0] * K.GRANT_BINS) for _ in range(W)]
    for who, ticks, asker, release in script:
        who, asker = who % W, asker % W
        slots[who, K.UPD] += ticks
        slots[who, K.ITER] += ticks
        slots[who, K.BEAT] += ticks * (who + 1) * 1000
        slots[who, K.INTERVAL] = (who + 1) * 1000
        ok = K.admit(slots, asker, pol, adm[asker], grants[asker],
                     K.clock_lag(slots, asker))
        ok_ref, a_ref, g_ref = naive.admit(slots, asker, pol, *ref[asker])
        assert bool(ok) == ok_ref
        if not ok and release:              # a wait ended: the releaser's flag
            adm[asker][K.A_RELEASED] = 1
            a_ref[1] = 1
        ref[asker] = (a_ref, g_ref)
        assert adm[asker].tolist() == a_ref and grants[asker].tolist() == g_ref


# --------------------------------------------------------------------------- contract

POLICIES = [
    # policy, its spelling, kind, a, b, local_steps, timing, cluster_bound
    (Async(), "async", K.K_SSP, -1, 0, 0, False, math.inf),
    (BSP(), "bsp", K.K_SSP, 0, 0, 0, False, 0),
    (SSP(3), "ssp:3", K.K_SSP, 3, 0, 0, False, 3),
    (DSSP(1, 4), "dssp:1:4", K.K_DSSP, 1, 4, 0, True, 1),
    (LocalSGD(8), "local:8", K.K_SSP, -1, 0, 8, False, math.inf),
    (LocalSGD(8, overlap=True), "local:8:overlap", K.K_SSP, -1, 0, 8, False, math.inf),
    (BoundedDelay(8), "delay:8", K.K_DELAY, 8, 0, 0, False, None),
]


@pytest.mark.parametrize("policy, spelling, kind, a, b, local, timing, cluster", POLICIES,
                         ids=[p[1] for p in POLICIES])
def test_every_policy_declares_itself(policy, spelling, kind, a, b, local, timing, cluster):
    row = policy.encode()
    assert row.dtype == np.int64 and row.shape == (K.NPOL,)
    assert row.tolist() == [kind, a, b]
    assert policy.local_steps == local and policy.timing is timing
    assert policy.cluster_bound == cluster
    assert from_string(spelling) == policy and from_string(spelling.upper()) == policy
    q = pickle.loads(pickle.dumps(policy))
    assert q == policy and hash(q) == hash(policy) and repr(q) == repr(policy)
    json.dumps(policy.config())
    assert compiled_support(MF, rule=SGD(0.1), density=None, batch=8, policy=policy) is None
    assert (policy.simulable() is None) == (not policy.overlap)


def test_bounded_delay_settings_spelling_and_cluster_refusal():
    assert BoundedDelay(0) == BoundedDelay(0) != BoundedDelay(1)
    assert BoundedDelay(3).bound == 3 and repr(BoundedDelay(3)) == "BoundedDelay(3)"
    assert BoundedDelay(3).config() == {"name": "delay", "K": 3}
    with pytest.raises(InvalidArgument, match=r"K=-1 must be a non-negative int"):
        BoundedDelay(-1)
    with pytest.raises(InvalidArgument, match="finite"):
        BoundedDelay(math.inf)
    with pytest.raises(InvalidArgument, match="K='x' is not an int"):
        from_string("delay:x")
    with pytest.raises(InvalidArgument, match="argument"):
        from_string("delay")
    with pytest.raises(InvalidArgument, match="unknown policy.*delay:K"):
        from_string("lag:3")
    with pytest.raises(InvalidType):
        from_string(8)
    with pytest.raises(InvalidArgument, match="cluster_bound is None"):
        policy_bound(BoundedDelay(2))
    assert policy_bound(Lockstep1()) == 1 and policy_bound(DSSP(1, 4)) == 1


def test_a_policy_of_ones_own_is_read_through_the_contract():
    assert compiled_support(MF, rule=SGD(0.1), density=None, batch=8,
                            policy=Lockstep1()) is None
    assert "policy" in compiled_support(MF, rule=SGD(0.1), density=None, batch=8,
                                        policy=object())
    assert Lockstep1() == Lockstep1() and Lockstep1().simulable() is None
    assert pickle.loads(pickle.dumps(Lockstep1())) == Lockstep1()


def _clocks(updates, state):
    clocks = Clocks({n: np.zeros(shape, dt) for n, (shape, dt) in
                     Clocks.specs(len(updates)).items()})
    clocks.updates[:], clocks.state[:] = updates, state
    clocks.heartbeat_ns[:] = time.monotonic_ns()
    return clocks


def test_the_python_wait_runs_the_kernel_and_names_who_holds_it_back():
    """Worker 0 is 4 updates above the mean of [9, 1, 2]: BoundedDelay(2) waits for
    the workers more than 2 updates behind it; FAILED among them raises at once."""
    clocks = _clocks([9, 1, 8], RUNNING)
    assert BoundedDelay(3).wait(clocks, 0, timeout=0.0) == 0.0     # lead ceil(3) = 3
    with pytest.raises(PolicyTimeout) as ei:
        BoundedDelay(2).wait(clocks, 0, timeout=0.05)
    assert ei.value.blockers == [1]
    assert "worker 1 (update count 1" in str(ei.value) and "BoundedDelay(2)" in str(ei.value)
    assert "at most 2 above the running workers' mean" in str(ei.value)
    clocks.state[1] = FAILED
    with pytest.raises(WorkerFailed, match=r"frozen update count u=1 blocks worker 0"):
        BoundedDelay(2).wait(clocks, 0, timeout=600.0)
    clocks.state[1] = DONE                            # leaves the mean: lead 1
    assert BoundedDelay(1).wait(clocks, 0, timeout=0.0) == 0.0
    with pytest.raises(InvalidArgument, match="rank=3"):
        BoundedDelay(1).wait(clocks, 3, timeout=0.0)


def test_a_wait_handed_back_by_the_core_releases_once():
    """The compiled core's hand-back (``wait_bound``) and the release it is followed by:
    DSSP's grant is dropped and the next admission proceeds without a check."""
    clocks = _clocks([0, 0], RUNNING)
    clocks.iterations[:] = [3, 0]
    policy = DSSP(1, 3)
    adm, grants = policy.admission(0)
    assert not K.admit_now(clocks.slots, 0, policy.encode(), adm, grants)
    assert adm[K.A_WAIT] == 1 and policy.grants(0) == {0: 1}   # no timings: r* = 0
    clocks.iterations[1] = 2
    assert policy.wait_bound(clocks, 0, int(adm[K.A_WAIT]), timeout=1.0) == 0.0
    adm[K.A_RELEASED] = 1                             # CompiledStep.release()
    clocks.iterations[1] = 0                          # lag 3 again, yet:
    assert K.admit_now(clocks.slots, 0, policy.encode(), adm, grants)
    assert adm.tolist()[:2] == [-1, 0] and policy.current_bound(0) == 1


# --------------------------------------------------------------------------- engines

def _lead_ok(slots, me, k):
    return naive.within(slots, me, [K.K_DELAY, k, 0], k)


def _watch_starts(monkeypatch, k):
    """Every START the Python engine hands back: whether me's lead was within K."""
    seen = []
    compute = PythonStep.compute

    def watched(self, rng, batch, *, read=True):
        seen.append(_lead_ok(self.clocks.slots, self.rank, k))
        return compute(self, rng, batch, read=read)

    monkeypatch.setattr(PythonStep, "compute", watched)
    return seen


def _same(a, b):
    sa, sb = strip_wall(a.summary()), strip_wall(b.summary())
    sa.pop("engine"), sb.pop("engine")
    assert json.dumps(sa, sort_keys=True) == json.dumps(sb, sort_keys=True)
    assert a.checksum() == b.checksum()


def test_bounded_delay_holds_at_every_simulated_start(monkeypatch):
    kw = dict(workers=hogkit.Workers(4, delays=DELAYS), steps=800, batch=8, seed=3)
    fused = simulate(MF, policy=BoundedDelay(2), engine="compiled", **kw)
    seen = _watch_starts(monkeypatch, 2)
    python = simulate(MF, policy=BoundedDelay(2), engine="python", **kw)
    assert len(seen) == 800 and all(seen)
    _same(fused, python)
    assert python.per_worker[0]["wait_fraction"] > 0      # the fast ones were held
    seen.clear()                                          # quality: Async breaks it
    simulate(MF, policy=Async(), engine="python", **kw)
    assert not all(seen)


def test_a_policy_of_ones_own_simulates_on_both_engines():
    kw = dict(workers=hogkit.Workers(4, delays=DELAYS), steps=600, batch=8, seed=1)
    fused = simulate(MF, policy=Lockstep1(), engine="compiled", **kw)
    python = simulate(MF, policy=Lockstep1(), engine="python", **kw)
    _same(fused, python)
    assert fused.staleness["clock_lag"]["max"] == 1       # held to its bound, and met it
    ssp = simulate(MF, policy=SSP(1), engine="compiled", **kw)  # the kind it encodes as
    assert ssp.checksum() == fused.checksum() and ssp.staleness == fused.staleness


HOT = {"preset": "hot"}


@pytest.mark.process
@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_bounded_delay_holds_live(engine):
    k = 1
    run = train_two(BoundedDelay(k), engine)
    assert run.config["engine"] == engine
    assert run.staleness["clock_lag"]["max"] <= 2 * k + 1
    assert run.staleness["update_gap"]["max"] <= 4 * k + 1
    assert run.per_worker[0]["wait_fraction"] > 0.05       # the fast worker was held
    assert [w["iterations"] for w in run.per_worker] == [400, 400]


@pytest.mark.process
@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_a_policy_of_ones_own_runs_live(engine):
    run = train_two(Lockstep1(), engine)
    assert run.config["engine"] == engine
    assert run.staleness["clock_lag"]["max"] <= 1
    assert run.per_worker[0]["wait_fraction"] > 0.05


def train_two(policy, engine):
    from hogkit import train
    return train(hogkit.workload("mf", **HOT),
                 workers=hogkit.Workers(2, stragglers={1: Slowdown(3.0)}), engine=engine,
                 outputs=hogkit.Outputs(progress=False, eval_every=None), steps=800,
                 policy=policy)
