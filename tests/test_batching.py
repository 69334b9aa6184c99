"""Batch sizing: integer shares, speed predictors, the weighted-gradient identity, CLI."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hogkit.rules.batching import AdaptiveBatch, EpochBalancedBatch, FixedBatch, shares, weights
from hogkit.parse import parse_batch
from hogkit.errors import InvalidArgument, InvalidType

speeds_st = st.lists(st.floats(0.01, 1e4, allow_nan=False), min_size=1, max_size=16)


# --------------------------------------------------------------------------- shares

@given(st.integers(1, 5000), speeds_st)
def test_shares_sum_to_B_and_round_by_largest_remainder(B, v):
    b = shares(B, v, min_batch=0)
    q = B * np.asarray(v) / np.sum(v)
    assert b.dtype == np.int64 and int(b.sum()) == B
    assert np.all(np.abs(b - q) < 1.0)
    faster = q[:, None] > q[None, :]
    assert np.all(b[:, None] >= b[None, :], where=faster)   # faster never gets less


@given(st.integers(1, 64), speeds_st, st.integers(0, 4))
def test_shares_respect_min_batch(extra, v, m):
    B = m * len(v) + extra
    b = shares(B, v, min_batch=m)
    assert int(b.sum()) == B and int(b.min()) >= m


def test_shares_proportional_and_unknown_speeds():
    assert shares(100, [1, 2, 3, 4]).tolist() == [10, 20, 30, 40]
    assert shares(12, [0, 0, 0]).tolist() == [4, 4, 4]          # nothing known: even
    assert shares(12, [2, np.nan, 2, -1]).tolist() == [3, 3, 3, 3]  # unknown = mean
    with pytest.raises(InvalidArgument, match="global_batch=3 cannot give 4 workers"):
        shares(3, [1, 1, 1, 1])
    with pytest.raises(InvalidArgument):
        shares(3, [])


# --------------------------------------------------------------------------- identity

def mean_grad(w, X, y):
    """Least squares 1/(2n)·||Xw − y||²: gradient X^T(Xw − y)/n."""
    return X.T @ (X @ w - y) / len(y)


@given(st.integers(0, 2**31 - 1), st.integers(1, 8), st.integers(0, 200))
def test_weighted_round_equals_one_batch_B_step(seed, W, extra):
    rng = np.random.default_rng(seed)
    B = W + extra
    d = 3
    X, y, w = rng.standard_normal((B, d)), rng.standard_normal(B), rng.standard_normal(d)
    policy = AdaptiveBatch(B)
    b = policy.sizes(rng.uniform(0.1, 10.0, W))
    parts = np.split(np.arange(B), np.cumsum(b)[:-1])
    g = sum(policy.weight(int(bi), workers=W) * mean_grad(w, X[p], y[p])
            for bi, p in zip(b, parts))
    np.testing.assert_allclose(g, mean_grad(w, X, y), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights(b), b / B)


def test_fixed_batch_is_the_equal_speed_case():
    f = FixedBatch(24)
    assert f.sizes(np.array([5.0, 1.0, 2.0])).tolist() == [8, 8, 8]
    assert f.global_batch(3) == 24 and f.weight(8, workers=3) == pytest.approx(1 / 3)
    assert FixedBatch(10).sizes(np.ones(3)).tolist() == [4, 3, 3]     # remainder: rank 0
    a = AdaptiveBatch(24)
    assert a.sizes([7.0, 7.0, 7.0]).tolist() == [8, 8, 8]
    assert a.weight(8, workers=3) == f.weight(8, workers=3)


# --------------------------------------------------------------------------- predictors

def feed(batcher, speeds, loads=None):
    out = []
    for t, v in enumerate(speeds):
        batcher.observe(0, 10, 10.0 / v, load=None if loads is None else loads[t])
        out.append(batcher.speed(0))
    return np.array(out)


@pytest.mark.parametrize("predictor, settle", [("last", 1), ("ema", 15), ("narx", 6)])
def test_predictors_track_a_step_change(predictor, settle):
    rng = np.random.default_rng(1)
    v = np.where(np.arange(80) < 40, 100.0, 50.0) * (1 + 0.01 * rng.standard_normal(80))
    pred = feed(AdaptiveBatch(256, predictor), v)
    assert abs(pred[38] - 100) < 5                      # steady before
    after = pred[39 + settle:]
    assert np.all(np.abs(after - 50) < 3), (predictor, pred[38:50])
    assert np.all(pred > 0)


def test_narx_uses_the_load_signal():
    rng = np.random.default_rng(2)
    loads = rng.integers(0, 3, 300).astype(float)
    v = (100 - 25 * loads) * (1 + 0.01 * rng.standard_normal(300))
    errs = {}
    for name in ("last", "narx"):
        b = AdaptiveBatch(256, name)
        e = []
        for t in range(300):
            guess = b.speed(0, load=loads[t])     # the load of the coming iteration
            if t > 50:
                e.append(abs(guess - v[t]) / v[t])
            b.observe(0, 10, 10.0 / v[t], load=loads[t])
        errs[name] = np.mean(e)
    assert errs["narx"] < 0.05 < errs["last"], errs


def test_adaptive_gives_the_straggler_less():
    a = AdaptiveBatch(128, "ema")
    for _ in range(10):
        a.observe(0, 16, 0.16)       # 100 samples/s
        a.observe(1, 16, 0.04)       # 400 samples/s
        a.observe(2, 16, 0.04)
    b = a.sizes([a.speed(r) for r in range(3)])
    assert b.sum() == 128 and b[0] < b[1] == b[2]
    assert b.tolist() == shares(128, [1, 4, 4]).tolist()
    assert a.speed(7) == 0.0                         # never observed: unknown


def test_epoch_balanced_recomputes_once_per_epoch():
    e = EpochBalancedBatch(30)
    assert e.sizes([e.speed(r) for r in range(3)]).tolist() == [10, 10, 10]
    for _ in range(5):
        e.observe(0, 10, 1.0)        # 10/s
        e.observe(1, 10, 0.5)        # 20/s
        e.observe(2, 10, 0.5)
    assert [e.speed(r) for r in range(3)] == [0.0, 0.0, 0.0]   # not until epoch end
    for r in range(3):
        e.end_epoch(r)
    assert [e.speed(r) for r in range(3)] == [10.0, 20.0, 20.0]
    e.observe(0, 10, 0.1)            # mid-epoch change does not move the shares
    assert e.sizes([e.speed(r) for r in range(3)]).tolist() == [6, 12, 12]


def test_bad_arguments():
    with pytest.raises(InvalidArgument):
        AdaptiveBatch(0)
    with pytest.raises(InvalidArgument, match="predictor"):
        AdaptiveBatch(10, "arima")
    with pytest.raises(InvalidType):
        FixedBatch(2.5)
    with pytest.raises(InvalidArgument, match="seconds"):
        AdaptiveBatch(10).observe(0, 10, 0.0)


def test_config_and_pickle():
    for b in (FixedBatch(4), AdaptiveBatch(64, "narx"), AdaptiveBatch(64, "ema"),
              EpochBalancedBatch(32)):
        json.dumps(b.config())
        b.observe(0, 4, 0.1)
        c = pickle.loads(pickle.dumps(b))
        assert c.config() == b.config() and repr(c) == repr(b)
        assert c.speed(0) in (0.0, 1.0)              # per-process state is not shipped


# --------------------------------------------------------------------------- CLI

@pytest.mark.parametrize("text, config", [
    ("fixed", {"name": "fixed", "global_batch": 64, "min_batch": 1}),
    ("fixed:8", {"name": "fixed", "global_batch": 8, "min_batch": 1}),
    ("adaptive", {"name": "adaptive", "global_batch": 64, "predictor": "last",
                  "min_batch": 1}),
    ("Adaptive:128:narx", {"name": "adaptive", "global_batch": 128, "predictor": "narx",
                           "min_batch": 1, "lags": 2, "forget": 0.9}),
    ("epoch:96", {"name": "epoch", "global_batch": 96, "min_batch": 1}),
])
def test_parse_batch(text, config):
    assert parse_batch(text, per_worker=16, workers=4).config() == config


@pytest.mark.parametrize("text, match", [
    ("dynamic", "unknown batch"), ("fixed:x", "not an int"), ("fixed:0", "global_batch=0"),
    ("epoch:8:1", "too many"), ("adaptive:64:arima", "predictor"),
])
def test_parse_batch_errors(text, match):
    with pytest.raises(InvalidArgument, match=match):
        parse_batch(text)


def test_the_pacer_reports_its_load_as_the_narx_input():
    """What a live worker hands NARX: the slowdown its straggler model imposes now."""
    from hogkit.engine.delays import Load, Pauses, Slowdown
    p = Load(2.0, 4.0).start(0, 1)
    t0 = int(p.row[3])
    assert p.load(t0) == pytest.approx(2.0)                  # 1 + A/2 at t = 0
    assert p.load(t0 + 1_000_000_000) == pytest.approx(3.0)  # a quarter period: 1 + A
    assert p.load(t0 + 3_000_000_000) == pytest.approx(1.0)  # three quarters: no load
    assert Slowdown(3.0).start(0, 0).load() == 3.0
    assert Pauses(0.5, 0.01).start(0, 0).load() == 1.0


@pytest.mark.parametrize("text, model", [
    ("1:3", ("slowdown", 3.0)), ("0:load:2:5", ("load", 2.0, 5.0)),
    ("2:pauses:0.1:0.01", ("pauses", 0.1, 0.01))])
def test_parse_straggler_forms(text, model):
    from hogkit.parse import parse_straggler
    rank, m = parse_straggler(text)
    assert rank == int(text.split(":")[0])
    assert (m.kind, *[v for k, v in m.config().items() if k != "kind"]) == model


@pytest.mark.parametrize("text", ["1", "1:load:2", "1:fast:1:2", "x:3", "1:load:a:2"])
def test_parse_straggler_errors_name_every_form(text):
    from hogkit.parse import parse_straggler
    with pytest.raises(InvalidArgument, match="RANK:load:AMPLITUDE:PERIOD"):
        parse_straggler(text)
