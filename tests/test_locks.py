"""logreg's locking baselines (``lock="model"|"feature"``): the runs Hogwild! is measured
against. One worker gets lock-free Hogwild!'s bits; every lock taken is given back;
what cannot hold the locks is refused before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

import hogkit
from hogkit import simulate, train, workloads
from hogkit.errors import InvalidArgument
from hogkit.kernels import logreg as klr
from hogkit.kernels.sgd import SGDCfg

SMALL = {"n_samples": 2_000, "n_features": 300}


def _lane(lock, nb=500, seed=0):
    wl = workloads.get("logreg", lock=lock, **SMALL)
    params, data = wl.build(seed)
    parts = wl.compiled(params, data)
    w = params["w"].reshape(-1, 1)
    idx = np.random.default_rng(seed).integers(0, SMALL["n_samples"], nb).astype(np.int64)
    bad = klr.logreg_lane(parts.arrays, (w,), idx, nb, SGDCfg(0.05), (), False)
    return w.ravel().copy(), parts.arrays.locks, bad


@pytest.mark.parametrize("lock", ["model", "feature"])
def test_a_locked_lane_writes_hogwilds_bits_and_frees_every_lock(lock):
    free, _, bad0 = _lane("none")
    got, locks, bad = _lane(lock)
    np.testing.assert_array_equal(got, free)
    assert bad == bad0 == 0
    assert len(locks) == (1 if lock == "model" else SMALL["n_features"])
    assert not locks.any()                       # every lock given back


@pytest.mark.process
def test_two_locked_workers_learn_and_one_matches_lock_free():
    kw = dict(steps=1_000, outputs=hogkit.Outputs(progress=False, eval_every=None), seed=2)
    free = train("logreg", workers=1, **kw)
    one = train(hogkit.workload("logreg", lock="feature"), workers=1, **kw)
    np.testing.assert_array_equal(one.params["w"], free.params["w"])
    assert one.config["workload_config"]["lock"] == "feature"
    assert "lock" not in free.config["workload_config"]      # a lock-free config as before
    two = train(hogkit.workload("logreg", lock="model"), workers=2, **kw)
    assert two.final_loss < two.initial_loss and np.isfinite(two.params["w"]).all()


def test_what_cannot_hold_the_locks_is_refused():
    opts = {"lock": "model"}
    with pytest.raises(InvalidArgument, match="lane='batch' cannot run this: lock='model'"):
        train(hogkit.workload("logreg", **opts), steps=10,
              engine=hogkit.Engine(lane="batch"))
    with pytest.raises(InvalidArgument, match="engine='python'"):
        train(hogkit.workload("logreg", **opts), steps=10, engine="python")
    with pytest.raises(InvalidArgument, match="the simulator cannot run this"):
        simulate(hogkit.workload("logreg", **opts), steps=10)
    with pytest.raises(InvalidArgument, match="lock"):
        workloads.get("logreg", lock="row")
    wl = workloads.get("logreg", lock="feature", **SMALL)
    params, data = wl.build(0)
    data.pop("locks")
    with pytest.raises(InvalidArgument, match="lacks its lock words"):
        wl.compiled(params, data)


def test_feature_locks_need_increasing_features_per_sample():
    wl = workloads.get("logreg", lock="feature", **SMALL)
    data = {"indptr": np.array([0, 2, 4]), "indices": np.array([3, 1, 2, 5], np.int32)}
    with pytest.raises(InvalidArgument, match="increasing order without repeats"):
        wl._locks(data)
    data["indices"] = np.array([1, 3, 2, 5], np.int32)      # a new sample may go down
    assert wl._locks(data).shape == (SMALL["n_features"],)
