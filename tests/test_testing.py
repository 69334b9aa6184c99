"""hogkit.testing: the strategies generate what they promise, the replayer shows lost
updates and torn reads exactly, and planted lost-update bugs are found and shrunk to
the smallest example ("quality" tests: the tools must catch known bugs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis.errors import NoSuchExample

import hogkit
from hogkit import workloads
from hogkit.engine.delays import StepTimes
from hogkit.errors import InvalidArgument
from hogkit.policy import Async
from hogkit.engine.simulator import simulate
from hogkit.testing import (CI_PROFILE, Step, assert_staleness_bounded, delay_models,
                            interleave, replay, schedules, sequential_sum, sparse_updates,
                            staleness_bounds)

ZEROS = np.zeros(3)


# --------------------------------------------------------------------------- replay

def test_lost_update_is_replayed_exactly():
    s = [Step("load", 0, 0), Step("load", 1, 0), Step("store", 0, 0, 1.0),
         Step("store", 1, 0, 2.0)]
    r = replay(s, ZEROS)
    assert r.table.tolist() == [2.0, 0.0, 0.0] and r.lost == 1
    assert r.lost_at == [(3, 1, 0, 1)]
    assert replay(s, ZEROS, atomic=True).table.tolist() == [3.0, 0.0, 0.0]
    assert ZEROS.tolist() == [0.0, 0.0, 0.0]      # input untouched


def test_torn_read_is_flagged_with_the_versions_seen():
    table = np.zeros((2, 2))
    s = [Step("read", 0, 0), Step("load", 1, 0), Step("store", 1, 0, [1.0, 1.0]),
         Step("load", 1, 1), Step("store", 1, 1, [1.0, 1.0]), Step("read", 0, 1)]
    (rec,) = replay(s, table).reads
    assert rec.torn and rec.versions == (0, 1) and rec.positions == (0, 5)
    np.testing.assert_array_equal(rec.values, [[0, 0], [1, 1]])
    # the same read with only row 0 written in between is a snapshot (of the old row 1)
    s2 = [Step("read", 0, 1), Step("load", 1, 0), Step("store", 1, 0, [1.0, 1.0]),
          Step("read", 0, 0)]
    (rec2,) = replay(s2, table).reads
    assert not rec2.torn and rec2.versions == (0, 1)


def test_replay_rejects_bad_schedules():
    with pytest.raises(InvalidArgument, match="without a load"):
        replay([Step("store", 0, 1, 1.0)], ZEROS)
    with pytest.raises(InvalidArgument, match="row=3"):
        replay([Step("read", 0, 3)], ZEROS)
    with pytest.raises(InvalidArgument, match="needs value"):
        replay([Step("add", 0, 0)], ZEROS)
    with pytest.raises(InvalidArgument, match="kind"):
        replay([Step("swap", 0, 0, 1.0)], ZEROS)
    with pytest.raises(InvalidArgument, match="needs value"):
        replay([Step("write", 0, 0)], ZEROS)


def test_write_stores_a_value_and_counts_what_it_overwrote():
    """A ``write`` stores its value; after the same worker's load it loses the stores
    others made since (as ``store`` does); a blind write loses nothing."""
    r = replay([Step("load", 0, 1), Step("add", 1, 1, 2.0), Step("write", 0, 1, 5.0),
                Step("write", 1, 2, 7.0)], ZEROS)
    assert list(r.table) == [0.0, 5.0, 7.0]
    assert r.lost == 1 and r.lost_at == [(2, 0, 1, 1)]
    with pytest.raises(InvalidArgument, match="name each worker"):
        interleave([[Step("read", 0, 0)]], [0, 0])


# --------------------------------------------------------------------------- strategies

@given(schedules(min_workers=2, max_workers=3, max_steps=3, rows=3))
def test_generated_schedules_are_valid_and_atomic_replay_is_the_sum(s):
    workers = {step.rank for step in s}
    assert 1 <= len(workers) <= 3
    r = replay(s, ZEROS, atomic=True)
    total = np.zeros(3)
    for step in s:
        if step.kind == "store":
            total[step.row] += step.value
    np.testing.assert_array_equal(r.table, total)
    assert r.lost == 0
    # without atomicity the result is the sum minus exactly the lost deltas
    racy = replay(s, ZEROS)
    assert racy.table.sum() <= total.sum() and (racy.lost == 0) == np.array_equal(
        racy.table, total)


@given(sparse_updates((5, 2), min_rows=2, max_rows=6))
def test_sparse_updates_respect_shape_and_bounds(u):
    rows, values = u
    assert rows.dtype == np.int64 and 2 <= len(rows) <= 6
    assert values.shape == (len(rows), 2) and ((0 <= rows) & (rows < 5)).all()


@given(staleness_bounds(min_value=1, max_value=3))
def test_staleness_bounds(s):
    assert s == math.inf or 1 <= s <= 3


@given(delay_models(max_workers=3))
def test_delay_models_are_step_times(m):
    assert isinstance(m, StepTimes)
    speed, amp, period = m.arrays(3)
    assert (speed >= 1.0).all() and m.mean(0) >= 0.0


@pytest.mark.parametrize("strategy", [
    lambda: schedules(min_workers=3, max_workers=2),
    lambda: schedules(min_steps=-1),
    lambda: sparse_updates((3,), min_rows=4, max_rows=2),
    lambda: sparse_updates((3,), min_rows=4, unique=True),
    lambda: staleness_bounds(min_value=5, max_value=1),
    lambda: delay_models(min_seconds=1.0, max_seconds=0.1),
])
def test_impossible_combinations_raise(strategy):
    with pytest.raises(InvalidArgument):
        strategy()


def test_ci_profile_is_registered():
    assert settings.get_profile(CI_PROFILE).deadline is None


def test_assert_staleness_bounded():
    wl = workloads.get("logreg", n_samples=200, n_features=50, min_nnz=2, max_nnz=4)
    run = simulate(wl, workers=hogkit.Workers(3, delays="lognormal:1e-3:0.8"), steps=60,
                   batch=2, policy=Async(), seed=0)
    assert_staleness_bounded(run, math.inf)
    assert_staleness_bounded(run, run.staleness["clock_lag"]["max"])
    with pytest.raises(AssertionError, match="exceeds the bound s=0"):
        assert_staleness_bounded(run, 0)
    with pytest.raises(AssertionError, match="update gap"):
        assert_staleness_bounded(run.summary(), math.inf, gap=0)


# --------------------------------------------------------------------------- quality

def buggy_apply(W, rows, G, lr):
    """A planted lost-update bug: fancy assignment drops duplicate-row contributions."""
    W[rows] -= lr * G


def good_apply(W, rows, G, lr):
    np.subtract.at(W, rows, lr * G)


def _disagrees(apply):
    def bad(u):
        rows, G = u
        W1, W2 = np.zeros((4, 2)), np.zeros((4, 2))
        apply(W1, rows, G, 0.5)
        good_apply(W2, rows, G, 0.5)
        return not np.array_equal(W1, W2)
    return bad


def test_planted_duplicate_index_bug_is_found_and_shrunk():
    small = find(sparse_updates((4, 2), max_rows=8), _disagrees(buggy_apply),
                 settings=settings(max_examples=500, database=None, derandomize=True))
    rows, G = small
    assert len(rows) == 2 and rows[0] == rows[1]          # the minimal duplicate
    assert np.count_nonzero(G) == 1                        # and one nonzero entry
    with pytest.raises(NoSuchExample):           # the correct apply never disagrees
        find(sparse_updates((4, 2)), _disagrees(good_apply),
             settings=settings(max_examples=200, database=None, derandomize=True))


def test_planted_bug_fails_a_property_test():
    @settings(max_examples=200, database=None)
    @given(sparse_updates((4, 2)))
    def prop(u):
        assert not _disagrees(buggy_apply)(u)

    with pytest.raises(AssertionError):
        prop()


def test_non_atomic_update_race_is_found_and_shrunk_to_four_steps():
    def loses(s):
        return not np.array_equal(replay(s, ZEROS).table, sequential_sum(s, ZEROS))

    small = find(schedules(reads=False), loses,
                 settings=settings(max_examples=500, database=None, derandomize=True))
    # minimal is load/load/store/store by two workers; shrinking is a search, so
    # allow one spare update
    assert len(small) <= 6 and len({x.rank for x in small}) == 2
    assert replay(small, ZEROS).lost >= 1


def test_torn_read_is_found_and_shrunk():
    small = find(schedules(rows=2), lambda s: replay(s, ZEROS[:2]).torn > 0,
                 settings=settings(max_examples=1000, database=None, derandomize=True))
    # the smallest torn read: read row a, another worker rewrites a then b, read b
    # (6 steps); allow one spare operation
    assert len(small) <= 8
    assert [x.kind for x in small].count("read") == 2
    (rec,) = [r for r in replay(small, ZEROS[:2]).reads if r.torn]
    assert len(rec.rows) == 2
