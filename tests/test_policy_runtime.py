"""Consistency policies, local SGD and adaptive batches on real worker processes.

The evidence is the reader's own record: every read's clock lag lands in the
shared histogram, so "no read ever lagged more than s" is checked on all of them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hogkit
from hogkit import train
from hogkit.rules.batching import AdaptiveBatch, FixedBatch
from hogkit.engine.delays import Slowdown
from hogkit.policy import BSP, DSSP, SSP, Async, LocalSGD

pytestmark = pytest.mark.process
HOT = {"preset": "hot"}


@pytest.mark.parametrize("policy, bound", [(BSP(), 0), (SSP(1), 1), (SSP(3), 3),
                                           (DSSP(1, 4), 4)])
def test_no_read_lags_more_than_the_bound(policy, bound):
    run = train(hogkit.workload("mf", **HOT),
                workers=hogkit.Workers(2, stragglers={1: Slowdown(3.0)}),
                outputs=hogkit.Outputs(progress=False, eval_every=None), steps=800,
                policy=policy)
    lag = run.staleness["clock_lag"]
    assert lag["count"] == run.updates == 800
    assert lag["max"] <= bound
    assert max(int(k) for k in lag["histogram"]) <= bound
    # the fast worker did wait for the straggler
    assert run.per_worker[0]["wait_fraction"] > 0.05


def test_dssp_reports_its_grants():
    run = train(hogkit.workload("mf", **HOT),
                workers=hogkit.Workers(2, stragglers={1: Slowdown(3.0)}),
                outputs=hogkit.Outputs(progress=False, eval_every=None), steps=800,
                policy=DSSP(0, 3))
    grants = run.summary()["dssp_grants"]
    assert sum(grants.values()) > 0
    assert all(0 <= int(r) <= 3 for r in grants)


def test_async_with_a_straggler_lags_beyond_small_bounds():
    run = train(hogkit.workload("mf", **HOT),
                workers=hogkit.Workers(2, stragglers={1: Slowdown(3.0)}),
                outputs=hogkit.Outputs(progress=False, eval_every=None), steps=2000,
                policy=Async())
    assert run.staleness["clock_lag"]["max"] > 3     # the harness can see lag


@pytest.mark.parametrize("overlap", [False, True])
def test_local_sgd_merges_and_converges(overlap):
    run = train(hogkit.workload("mf", **HOT), workers=2,
                outputs=hogkit.Outputs(progress=False, eval_every=None), steps=4000,
                policy=LocalSGD(8, overlap=overlap))
    assert run.final_loss < 0.3 * run.initial_loss
    # one shared update per merge: 2000 iterations / h=8 per worker
    assert [w["updates"] for w in run.per_worker] == [250, 250]
    assert all(np.isfinite(v).all() for v in run.params.values())


def test_local_sgd_merges_with_a_paced_cost_and_the_simulator_refuses_it():
    """A merge that costs its phase's time again (overlapped and not) changes when the
    merges land, not what they add: the run merges as often and converges."""
    from hogkit import simulate
    from hogkit.errors import InvalidArgument
    for overlap in (False, True):
        run = train(hogkit.workload("mf", **HOT), workers=2,
                    outputs=hogkit.Outputs(progress=False, eval_every=None), steps=1600,
                    policy=LocalSGD(8, overlap=overlap, cost=1.0))
        assert [w["updates"] for w in run.per_worker] == [100, 100]
        assert run.final_loss < 0.5 * run.initial_loss
        assert run.config["policy"]["cost"] == 1.0
    with pytest.raises(InvalidArgument, match="paced on live runs"):
        simulate("mf", workers=2, steps=16, policy=LocalSGD(8, cost=1.0))


def test_adaptive_batch_gives_the_straggler_a_smaller_share():
    kw = dict(workers=hogkit.Workers(2, stragglers={1: Slowdown(2.5)}),
              outputs=hogkit.Outputs(progress=False, eval_every=None), steps=400,
              policy=BSP())
    fixed = train("mlp", batch=FixedBatch(1024), **kw)
    adaptive = train("mlp", batch=AdaptiveBatch(1024), **kw)
    assert fixed.summary()["samples"] == adaptive.summary()["samples"] == 400 * 512
    assert adaptive.final_loss < adaptive.initial_loss
    # a fixed batch splits evenly; LB-BSP sees the straggler's speed (its pauses
    # included) and moves most of the global batch to the fast worker
    assert [w["samples"] for w in fixed.per_worker] == [400 * 256] * 2
    fast, slow = (w["samples"] for w in adaptive.per_worker)
    assert slow < 0.75 * fast, (fast, slow)


@settings(max_examples=5, deadline=None)
@given(s=st.integers(0, 3), workers=st.integers(2, 4), slow=st.sampled_from([1.0, 2.0, 4.0]),
       steps=st.integers(40, 200))
def test_ssp_bound_holds_for_any_workers_and_straggler(s, workers, slow, steps):
    """Property, on real processes: whatever s, W and the straggler, the reader's
    record of every read has clock lag <= s, and every worker finishes its share."""
    run = train(hogkit.workload("mf", **HOT),
                workers=hogkit.Workers(workers, stragglers={workers - 1: Slowdown(slow)}),
                outputs=hogkit.Outputs(progress=False, eval_every=None, keep_params=False),
                steps=steps * workers, policy=SSP(s))
    assert run.staleness["clock_lag"]["max"] <= s
    assert [w["iterations"] for w in run.per_worker] == [steps] * workers
