"""hogkit.rules.density.Density against tests/naive.py: density 1.0 is no filter, residual
mode loses no mass, top-k / threshold / random keep what they say, temporal density
holds updates back, and bad input raises without touching the residual."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import naive
from hogkit.rules.density import Density
from hogkit.errors import InvalidArgument, InvalidType
from hogkit.rules.grads import Grad
from hogkit.rules.core import SGD

HOWS = [("topk", {}), ("random", {}), ("threshold", {"threshold": 0.5})]


def make(dtype=np.float32, seed=0, rows=(2, 0, 2, 5)):
    rng = np.random.default_rng(seed)
    params = {"emb": np.zeros((6, 3), dtype), "w": np.zeros((4, 5), dtype),
              "v": np.zeros(7, dtype)}
    rows = np.asarray(rows, np.int64)
    grads = [Grad("emb", rng.normal(size=(len(rows), 3)).astype(dtype), rows),
             Grad("w", rng.normal(size=(4, 5)).astype(dtype)),
             Grad("v", rng.normal(size=3).astype(dtype), np.array([6, 1, 6]))]
    return params, grads


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("how", ["topk", "random"])
def test_density_one_is_no_filter(how, residual):
    params, grads = make()
    d = Density(1.0, how=how, residual=residual)
    state = d.init(params)
    out = d.filter(grads, state, step=3)
    assert len(out) == len(grads)
    for a, b in zip(out, grads):
        assert a.name == b.name and a.rows is b.rows
        np.testing.assert_array_equal(a.values, b.values)
    assert all(not v.any() for v in state.values())
    # and through a rule: identical to applying the unfiltered grads
    p1, p2 = copy.deepcopy(params), copy.deepcopy(params)
    SGD(0.1).apply(p1, out, {})
    SGD(0.1).apply(p2, grads, {})
    for k in p1:
        np.testing.assert_array_equal(p1[k], p2[k])


def test_threshold_zero_keeps_every_nonzero():
    params, grads = make(np.float64)
    d = Density(1.0, how="threshold", threshold=0.0)
    out = d.filter(grads, d.init(params), step=0)
    for a, b in zip(out, grads):
        np.testing.assert_array_equal(a.values, b.values)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("how, kw", HOWS)
def test_residual_mode_loses_no_mass(how, kw, dtype):
    frac = 1.0 if how == "threshold" else 0.3
    d = Density(frac, how=how, residual=True, **kw)
    params, _ = make(dtype)
    state = d.init(params)
    total = {k: np.zeros(v.shape) for k, v in params.items()}
    sent = copy.deepcopy(total)
    for step in range(5):
        _, grads = make(dtype, seed=step)
        before = copy.deepcopy(state)
        out = d.filter(grads, state, step=step)
        for g, o in zip(grads, out):
            key = f"r/{g.name}"
            if g.rows is None:
                # exact, entry by entry: sent + residual == gradient + old residual
                np.testing.assert_array_equal(o.values + state[key],
                                              g.values + before[key])
                assert np.all((o.values == 0) | (state[key] == 0))
                total[g.name] += g.values
                sent[g.name] += o.values
            else:
                np.add.at(total[g.name], g.rows, g.values.astype(np.float64))
                np.add.at(sent[g.name], g.rows, o.values.astype(np.float64))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for k in total:
        np.testing.assert_allclose(sent[k] + state[f"r/{k}"], total[k], atol=tol)


@given(st.sampled_from([np.float32, np.float64]), st.floats(0.05, 1.0),
       st.sampled_from(["topk", "random"]), st.booleans(), st.integers(0, 2**20),
       st.lists(st.integers(0, 5), max_size=8))
def test_filter_matches_reference(dtype, frac, how, residual, seed, rows):
    params, grads = make(dtype, seed, rows)
    d = Density(frac, how=how, residual=residual, seed=seed)
    state = d.init(params)
    for r in state.values():                         # a non-trivial old residual
        r[...] = np.random.default_rng(seed).normal(size=r.shape)
    before = copy.deepcopy(state)
    out = d.filter(grads, state, step=seed % 7)
    for pos, (g, o) in enumerate(zip(grads, out)):
        n = g.values.size
        k = min(n, max(1, math.ceil(frac * n - 1e-9 * n))) if n else 0
        r_old = before.get(f"r/{g.name}")
        if g.rows is None:
            x = g.values + (r_old if residual else 0)
        else:
            x = naive.filter_rows(g.values, g.rows, r_old if residual else
                                  np.zeros((6, 3)), np.ones(n, bool), residual)[0]
        if how == "topk":
            mask = naive.topk_mask(x.astype(dtype).reshape(-1), k)
        else:
            mask = naive.random_mask(n, k, naive.mask_seed(seed, seed % 7, pos))
        assert mask.sum() == k
        if g.rows is None:
            want, want_r = naive.filter_dense(g.values, r_old, mask, residual)
        else:
            want, want_r = naive.filter_rows(g.values, g.rows, r_old, mask, residual)
        tol = 1e-6 if dtype == np.float32 else 1e-14
        np.testing.assert_allclose(o.values, want, rtol=tol, atol=tol)
        if residual:
            np.testing.assert_allclose(state[f"r/{g.name}"], want_r, rtol=tol, atol=tol)
        assert o.values.dtype == dtype and o.values.shape == g.values.shape


def test_topk_keeps_the_largest():
    g = Grad("w", np.array([[0.1, -5.0, 2.0], [3.0, -0.2, 0.0]]))
    out = Density(0.5, residual=False).filter([g], {}, step=0)[0]
    np.testing.assert_array_equal(out.values, [[0, -5.0, 2.0], [3.0, 0, 0]])  # k = 3
    np.testing.assert_array_equal(g.values, [[0.1, -5.0, 2.0], [3.0, -0.2, 0.0]])  # input


def test_random_is_seeded_and_changes_with_step():
    g = [Grad("w", np.arange(1, 101, dtype=np.float64))]
    d = Density(0.2, how="random", residual=False, seed=5)
    a = d.filter(g, {}, step=1)[0].values
    b = d.filter(g, {}, step=1)[0].values
    c = d.filter(g, {}, step=2)[0].values
    e = Density(0.2, how="random", residual=False, seed=6).filter(g, {}, step=1)[0].values
    np.testing.assert_array_equal(a, b)
    assert np.count_nonzero(a) == np.count_nonzero(c) == 20
    assert not np.array_equal(a, c) and not np.array_equal(a, e)


def test_dropping_mode_loses_the_rest():
    params, grads = make(np.float64)
    d = Density(0.25, residual=False)
    assert d.init(params) == {}
    out = d.filter(grads, {}, step=0)
    for g, o in zip(grads, out):
        assert np.count_nonzero(o.values) == max(1, math.ceil(0.25 * g.values.size))
        assert np.abs(o.values).sum() < np.abs(g.values).sum()


@pytest.mark.parametrize("residual", [True, False])
def test_temporal_density_every_k(residual):
    params, _ = make(np.float64)
    d = Density(1.0, residual=residual, every=3)
    state = d.init(params)
    total = {k: np.zeros(v.shape) for k, v in params.items()}
    for step in range(1, 4):
        _, grads = make(np.float64, seed=step)
        for g in grads:
            if g.rows is None:
                total[g.name] += g.values
            else:
                np.add.at(total[g.name], g.rows, g.values)
        out = d.filter(grads, state, step=step)
        if step < 3:
            assert out == []
    sent = {k: np.zeros(v.shape) for k, v in params.items()}
    for o in out:
        if o.rows is None:
            sent[o.name] += o.values
        else:
            np.add.at(sent[o.name], o.rows, o.values)
    if residual:
        for k in total:
            np.testing.assert_allclose(sent[k] + state[f"r/{k}"], total[k], atol=1e-12)
        np.testing.assert_allclose(sent["w"], total["w"], atol=1e-12)  # dense: all sent
    else:
        _, last = make(np.float64, seed=3)
        np.testing.assert_array_equal(sent["w"], last[1].values)


@pytest.mark.parametrize("make_density, err", [
    (lambda: Density(0.0), InvalidArgument), (lambda: Density(1.5), InvalidArgument),
    (lambda: Density(float("nan")), InvalidArgument), (lambda: Density("0.5"), InvalidType),
    (lambda: Density(0.5, how="bottomk"), InvalidArgument),
    (lambda: Density(1.0, how="threshold"), InvalidArgument),
    (lambda: Density(0.5, how="threshold", threshold=0.1), InvalidArgument),
    (lambda: Density(1.0, how="threshold", threshold=-1.0), InvalidArgument),
    (lambda: Density(0.5, threshold=0.1), InvalidArgument),
    (lambda: Density(0.5, every=0), InvalidArgument),
    (lambda: Density(0.5, residual="yes"), InvalidType),
    (lambda: Density(0.5, seed=-1), InvalidArgument),
])
def test_bad_configuration(make_density, err):
    with pytest.raises(err):
        make_density()


def test_bad_input_raises_and_keeps_the_residual():
    params, grads = make(np.float32)
    d = Density(0.3)
    state = d.init(params)
    d.filter(grads, state, step=0)
    before = copy.deepcopy(state)
    f32 = np.float32
    cases = {
        "row out of range": [grads[1], Grad("emb", np.ones((1, 3), f32), np.array([6]))],
        "negative row": [grads[1], Grad("emb", np.ones((1, 3), f32), np.array([-1]))],
        "float rows": [grads[1], Grad("emb", np.ones((1, 3), f32), np.array([1.0]))],
        "dtype": [grads[1], Grad("w", np.ones((4, 5), np.float64))],
        "shape": [grads[1], Grad("w", np.ones((5, 4), f32))],
        "unknown": [grads[1], Grad("x", np.ones(3, f32))],
        "not a grad": [grads[1], np.ones(3)],
    }
    for what, bad in cases.items():
        with pytest.raises((InvalidArgument, InvalidType)):
            d.filter(bad, state, step=1)
        for k in state:
            np.testing.assert_array_equal(state[k], before[k], err_msg=what)
    with pytest.raises(InvalidArgument):
        d.filter(grads, state, step=-1)
    with pytest.raises(InvalidType):
        d.filter(grads[0], state, step=1)
    with pytest.raises(InvalidArgument, match="density.init"):
        d.filter(grads, {}, step=1)


@pytest.mark.parametrize("how", ["topk", "random"])
def test_full_density_flushes_a_nonzero_residual(how):
    """fraction=1 in residual mode sends gradient + old residual and empties it (the
    residual may be non-zero: a state carried over from a lower fraction)."""
    g = [Grad("w", np.ones((2, 2), np.float32)),
         Grad("e", np.ones((2, 3), np.float32), np.array([1, 1]))]
    d = Density(1.0, how=how, residual=True)
    state = d.init({"w": np.zeros((2, 2), np.float32), "e": np.zeros((3, 3), np.float32)})
    state["r/w"][...] = 5
    state["r/e"][...] = 2
    out = d.filter(g, state, step=0)
    np.testing.assert_array_equal(out[0].values, 6)
    np.testing.assert_array_equal(out[1].values, [[3, 3, 3], [1, 1, 1]])  # once per row
    assert not state["r/w"].any()
    np.testing.assert_array_equal(state["r/e"], [[2, 2, 2], [0, 0, 0], [2, 2, 2]])


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**40), st.integers(0, 64))
def test_mask_seed_kernel_equals_the_big_integer_formula(seed, step, pos):
    from hogkit.kernels.density import mask_seed
    assert mask_seed(seed, step, pos) == naive.mask_seed(seed, step, pos)
