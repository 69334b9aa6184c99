"""hogkit.state.worker_state: a worker's stream and state survive it (publish -> restore)."""

from __future__ import annotations

import numpy as np

from hogkit import SGD, Density, GapAware
from hogkit.state import worker_state as ws
def _views(rule, density=None, workers=2):
    params = {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}
    return params, {k: np.array(v, copy=True)
                    for k, v in ws.initial(rule, density, params, workers).items()}


def test_a_published_stream_restores_to_the_same_next_draws():
    _, views = _views(SGD(lr=0.1))
    rng = np.random.default_rng(7)
    rng.random(5)
    rng.integers(0, 10, 3)
    ws.publish(views, 1, rng=rng, cursor=np.array([42]))
    expected = rng.random(4)
    fresh, cursor = np.random.default_rng(0), np.zeros(1, np.int64)
    assert ws.restore(views, 1, rng=fresh, cursor=cursor)
    np.testing.assert_array_equal(fresh.random(4), expected)
    assert cursor[0] == 42
    assert not ws.restore(views, 0, rng=np.random.default_rng(0))   # rank 0: never published


def test_bound_state_writes_the_store_and_counts_are_published():
    rule, density = GapAware(lr=0.1), Density(0.5)
    params, views = _views(rule, density)
    state = ws.bind(views, 1, "rule")
    dstate = ws.bind(views, 1, "density")
    assert set(state) == set(rule.init(params)) and set(dstate) == set(density.init(params))
    state["v/w"][2, 1] = 3.0
    dstate["r/b"][0] = 5.0
    assert views["1/rule/v/w"][2, 1] == 3.0 and views["0/rule/v/w"][2, 1] == 0.0
    assert views["1/density/r/b"][0] == 5.0
    ws.publish(views, 1, counts=(["b", "w"], np.array([4, 9]), state))
    assert views["1/rule/k/b"][0] == 4 and views["1/rule/k/w"][0] == 9


def test_a_resume_with_another_rule_keeps_only_what_fits():
    _, saved = _views(SGD(lr=0.1, momentum=0.9))
    saved["0/rule/m/w"][:] = 1.0
    _, views = _views(GapAware(lr=0.1, momentum=0.9))
    done = ws.load_into(views, saved)
    assert "0/rule/m/w" in done and "0/rule/v/w" not in done
    assert (views["0/rule/m/w"] == 1.0).all()
