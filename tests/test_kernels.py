"""Every kernel in kernels/{sparse,dense,delayed,density,guard}.py against its plain-numpy
reference in tests/naive.py (float64), on random shapes with duplicate rows, empty
batches, single rows and extreme values. Also run with NUMBA_DISABLE_JIT=1 by
tests/test_nojit.py so coverage sees the kernel bodies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

from hogkit.kernels import delayed, dense, density, guard, sparse
import naive

DTYPES = st.sampled_from([np.float32, np.float64])
EXTREMES = [0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30, 1.0, -3.5]


def floats(lim):
    return st.floats(-lim, lim, width=32, allow_subnormal=False)


def values(dtype, shape, lim=1e3, extreme=False):
    elements = st.one_of(floats(lim), st.sampled_from(EXTREMES)) if extreme else floats(lim)
    return arrays(np.float64, shape, elements=elements).map(lambda a: a.astype(dtype))


@st.composite
def row_cases(draw, lim=1e3, extreme=False, max_n=6, max_d=4, max_b=8):
    """(dtype, W (n, d), rows (b,), G (b, d)); rows repeat often, b may be 0."""
    dtype = draw(DTYPES)
    n = draw(st.integers(1, max_n))
    d = draw(st.integers(1, max_d))
    b = draw(st.integers(0, max_b))
    rows = draw(arrays(np.int64, b, elements=st.integers(0, n - 1)))
    W = draw(values(dtype, (n, d), lim, extreme))
    G = draw(values(dtype, (b, d), lim, extreme))
    return dtype, W, rows, G


@st.composite
def flat_cases(draw, lim=1e3, extreme=False, max_n=40):
    dtype = draw(DTYPES)
    n = draw(st.integers(0, max_n))
    return dtype, draw(values(dtype, n, lim, extreme)), draw(values(dtype, n, lim, extreme))


LR = st.sampled_from([1e-3, 0.1, 0.5, 1.0])
MU = st.sampled_from([0.5, 0.9, 0.99])
TAU = st.integers(0, 6)


def assert_close(actual, expected, dtype, scale):
    """Within a few dozen ulps of the dtype, relative to the magnitudes involved."""
    eps = float(np.finfo(dtype).eps)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=64 * eps,
                               atol=64 * eps * scale)


def mag(*arrays):
    return 1.0 + sum(float(np.abs(np.asarray(a, np.float64)).sum()) for a in arrays)


# --- sparse rows ---------------------------------------------------------------------

@given(row_cases(extreme=True), LR)
def test_sgd_rows_matches_subtract_at(case, lr):
    dtype, W, rows, G = case
    want = naive.sgd_rows(W, rows, G, lr)
    sparse.sgd_rows(W, rows, G, lr)
    assert W.dtype == dtype
    assert_close(W, want, dtype, mag(W, lr * G))


@given(row_cases(lim=1e4), LR, MU)
def test_momentum_rows(case, lr, mu):
    dtype, W, rows, G = case
    M = (0.5 * G[:1].sum() + np.zeros_like(W)).astype(dtype)
    want_w, want_m = naive.momentum_rows(W, M, rows, G, lr, mu)
    sparse.momentum_rows(W, M, rows, G, lr, mu)
    s = mag(W, M, G) * (1 + len(rows))
    assert_close(M, want_m, dtype, s)
    assert_close(W, want_w, dtype, s)


def test_sgd_rows_duplicates_add_up_exactly():
    W = np.zeros((3, 2), np.float32)
    sparse.sgd_rows(W, np.array([2, 2, 2, 0]), np.ones((4, 2), np.float32), 0.5)
    np.testing.assert_array_equal(W, [[-0.5, -0.5], [0, 0], [-1.5, -1.5]])


# --- dense ---------------------------------------------------------------------------

@given(flat_cases(extreme=True), LR)
def test_sgd_flat(case, lr):
    dtype, w, g = case
    want = naive.sgd_flat(w, g, lr)
    dense.sgd_flat(w, g, lr)
    assert_close(w, want, dtype, 1.0)
    # element-wise: compare each with its own magnitude too
    assert np.all(np.abs(w.astype(np.float64) - want)
                  <= 64 * np.finfo(dtype).eps * (1 + np.abs(want) + lr * np.abs(g)))


@given(flat_cases(lim=1e4), LR, MU)
def test_momentum_flat(case, lr, mu):
    dtype, w, g = case
    m = (g[::-1] * 0.25).astype(dtype)
    want_w, want_m = naive.momentum_flat(w, m, g, lr, mu)
    dense.momentum_flat(w, m, g, lr, mu)
    assert_close(m, want_m, dtype, mag(g))
    assert_close(w, want_w, dtype, mag(w, g))


def test_dense_crosses_chunk_boundaries():
    w = np.arange(10_000, dtype=np.float64)
    g = np.ones_like(w)
    dense.sgd_flat(w, g, 2.0)
    np.testing.assert_array_equal(w, np.arange(10_000) - 2.0)


# --- delayed: staleness-aware --------------------------------------------------------

@given(flat_cases(), LR, TAU)
def test_staleness_aware_flat(case, lr, tau):
    dtype, w, g = case
    want = naive.staleness_aware_flat(w, g, lr, tau)
    delayed.staleness_aware_flat(w, g, lr, tau)
    assert_close(w, want, dtype, mag(w, g))


@given(row_cases(), LR, TAU)
def test_staleness_aware_rows(case, lr, tau):
    dtype, W, rows, G = case
    want = naive.staleness_aware_rows(W, rows, G, lr, tau)
    delayed.staleness_aware_rows(W, rows, G, lr, tau)
    assert_close(W, want, dtype, mag(W, G))


@given(flat_cases(), LR, MU, TAU)
def test_staleness_aware_momentum_flat(case, lr, mu, tau):
    dtype, w, g = case
    m = (0.5 * g).astype(dtype)
    want_w, want_m = naive.staleness_aware_momentum_flat(w, m, g, lr, mu, tau)
    delayed.staleness_aware_momentum_flat(w, m, g, lr, mu, tau)
    assert_close(m, want_m, dtype, mag(g))
    assert_close(w, want_w, dtype, mag(w, g))


@given(row_cases(), LR, MU, TAU)
def test_staleness_aware_momentum_rows(case, lr, mu, tau):
    dtype, W, rows, G = case
    M = (0.1 * W).astype(dtype)
    want_w, want_m = naive.staleness_aware_momentum_rows(W, M, rows, G, lr, mu, tau)
    delayed.staleness_aware_momentum_rows(W, M, rows, G, lr, mu, tau)
    s = mag(W, G) * (1 + len(rows))
    assert_close(M, want_m, dtype, s)
    assert_close(W, want_w, dtype, s)


# --- delayed: DC-ASGD ----------------------------------------------------------------

def _read_of(W, frac_fresh, rng_seed):
    """A 'read' copy of W: some entries fresh (equal), others perturbed."""
    rng = np.random.default_rng(rng_seed)
    R = W + rng.normal(scale=0.5, size=W.shape) * (rng.random(W.shape) > frac_fresh)
    return R.astype(W.dtype)


@given(flat_cases(lim=10.0), LR, st.sampled_from([0.0, 0.04, 1.0]), st.integers(0, 99))
def test_dc_flat(case, lr, lam, seed):
    dtype, w, g = case
    b = _read_of(w, 0.3, seed)
    want = naive.dc_flat(w, g, b, lr, lam)
    dc = delayed.dc_flat
    dc(w, g, b, lr, lam)
    assert_close(w, want, dtype, mag(w, g, lam * g * g * 20))


@given(row_cases(lim=10.0), LR, st.sampled_from([0.0, 0.04, 1.0]), st.integers(0, 99))
def test_dc_rows(case, lr, lam, seed):
    dtype, W, rows, G = case
    B = _read_of(W[rows] if len(rows) else np.zeros((0, W.shape[1]), dtype), 0.3, seed)
    want = naive.dc_rows(W, rows, G, B, lr, lam)
    delayed.dc_rows(W, rows, G, B, lr, lam)
    assert_close(W, want, dtype, mag(W, G, lam * G * G * 20) * (1 + len(rows)))


@given(flat_cases(lim=10.0), LR, st.integers(0, 99))
def test_dc_adaptive_flat(case, lr, seed):
    dtype, w, g = case
    b = _read_of(w, 0.3, seed)
    ms = (np.abs(g[::-1]) * 0.5).astype(dtype)
    want_w, want_ms = naive.dc_adaptive_flat(w, ms, g, b, lr, 2.0, 0.95, 1e-7)
    delayed.dc_adaptive_flat(w, ms, g, b, lr, 2.0, 0.95, 1e-7)
    assert_close(ms, want_ms, dtype, mag(g * g))
    # lam_t * g * g <= lam0 * |g| / sqrt(1 - m): bounded correction
    assert_close(w, want_w, dtype, mag(w, g) * 100)


@given(row_cases(lim=10.0), LR, st.integers(0, 99))
def test_dc_adaptive_rows(case, lr, seed):
    dtype, W, rows, G = case
    B = _read_of(W[rows] if len(rows) else np.zeros((0, W.shape[1]), dtype), 0.3, seed)
    MS = np.full_like(W, 0.25)
    want_w, want_ms = naive.dc_adaptive_rows(W, MS, rows, G, B, lr, 2.0, 0.95, 1e-7)
    delayed.dc_adaptive_rows(W, MS, rows, G, B, lr, 2.0, 0.95, 1e-7)
    assert_close(MS, want_ms, dtype, mag(G * G))
    assert_close(W, want_w, dtype, mag(W, G) * 100 * (1 + len(rows)))


# --- delayed: Gap-Aware ---------------------------------------------------------------

@given(flat_cases(lim=10.0), LR, st.sampled_from([0.0, 0.9]), st.integers(1, 5),
       st.integers(0, 99))
def test_gap_aware_flat(case, lr, mu, k, seed):
    dtype, w, g = case
    r = _read_of(w, 0.3, seed)
    v = (0.1 * np.abs(g[::-1])).astype(dtype)
    mom = (0.2 * g[::-1]).astype(dtype) if mu else np.empty(0, dtype)
    want_w, want_m, want_v = naive.gap_aware_flat(w, mom, v, g, r, lr, mu, 0.999, lr, k)
    delayed.gap_aware_flat(w, mom, v, g, r, lr, mu, 0.999, lr, k)
    assert_close(v, want_v, dtype, mag(g * g, v))
    if mu:
        assert_close(mom, want_m, dtype, mag(g))
    assert_close(w, want_w, dtype, mag(w, g))


@given(row_cases(lim=10.0), LR, st.sampled_from([0.0, 0.9]), st.integers(1, 5),
       st.integers(0, 99))
def test_gap_aware_rows(case, lr, mu, k, seed):
    dtype, W, rows, G = case
    R = _read_of(W[rows] if len(rows) else np.zeros((0, W.shape[1]), dtype), 0.3, seed)
    V = np.full_like(W, 0.5)
    M = (0.1 * W).astype(dtype) if mu else np.empty((0, 0), dtype)
    want_w, want_m, want_v = naive.gap_aware_rows(W, M, V, rows, G, R, lr, mu, 0.999,
                                                  lr, k)
    delayed.gap_aware_rows(W, M, V, rows, G, R, lr, mu, 0.999, lr, k)
    s = mag(W, G, V) * (1 + len(rows))
    assert_close(V, want_v, dtype, s * s)
    if mu:
        assert_close(M, want_m, dtype, s)
    assert_close(W, want_w, dtype, s)


def test_gap_aware_penalises_a_stale_read():
    """A read far from the current value divides the step by G > 1."""
    w = np.zeros(4)
    fresh, stale = w.copy(), w.copy()
    g = np.ones(4)
    v = np.zeros(4)
    delayed.gap_aware_flat(fresh, np.empty(0), v.copy(), g, w.copy(), 0.1, 0.0, 0.9, 0.1, 1)
    delayed.gap_aware_flat(stale, np.empty(0), v.copy(), g, w + 1.0, 0.1, 0.0, 0.9, 0.1, 1)
    np.testing.assert_array_equal(fresh, -0.1)
    assert np.all(np.abs(stale) < 0.1 / 5)     # |Δ| = 10 C  ->  G = 11


def test_empty_batch_leaves_everything_alone():
    for dtype in (np.float32, np.float64):
        W = np.arange(6, dtype=dtype).reshape(3, 2)
        S = np.ones_like(W)
        rows = np.zeros(0, np.int64)
        E = np.zeros((0, 2), dtype)
        sparse.sgd_rows(W, rows, E, 0.1)
        sparse.momentum_rows(W, S, rows, E, 0.1, 0.9)
        delayed.staleness_aware_rows(W, rows, E, 0.1, 3)
        delayed.staleness_aware_momentum_rows(W, S, rows, E, 0.1, 0.9, 3)
        delayed.dc_rows(W, rows, E, E, 0.1, 0.04)
        delayed.dc_adaptive_rows(W, S, rows, E, E, 0.1, 2.0, 0.95, 1e-7)
        delayed.gap_aware_rows(W, S, S, rows, E, E, 0.1, 0.9, 0.999, 0.1, 1)
        density.accumulate_rows(S, rows, E)
        np.testing.assert_array_equal(W, np.arange(6).reshape(3, 2))
        np.testing.assert_array_equal(S, 1)


# --- density -------------------------------------------------------------------------

TIES = arrays(np.float64, st.integers(0, 30),
              elements=st.sampled_from([0.0, 1.0, -1.0, 2.0, -2.5, 0.5]))


@given(DTYPES, st.one_of(TIES, arrays(np.float64, st.integers(0, 30), elements=floats(1e3))),
       st.integers(0, 35))
def test_topk_mask(dtype, x, k):
    x = x.astype(dtype)
    mask = np.ones(x.size, np.bool_)
    count = density.topk_mask(x, k, mask)
    want = naive.topk_mask(x, k)
    np.testing.assert_array_equal(mask, want)
    assert count == want.sum() == min(k, x.size)


@given(DTYPES, arrays(np.float64, st.integers(0, 30), elements=floats(1e3)),
       st.sampled_from([0.0, 0.5, 1.0, 100.0]))
def test_threshold_mask(dtype, x, t):
    x = x.astype(dtype)
    mask = np.zeros(x.size, np.bool_)
    count = density.threshold_mask(x, t, mask)
    np.testing.assert_array_equal(mask, naive.threshold_mask(x, t))
    assert count == mask.sum()


@given(st.integers(0, 60), st.integers(0, 70), st.integers(1, 2**31 - 2))
def test_random_mask(n, k, seed):
    mask = np.zeros(n, np.bool_)
    count = density.random_mask(n, k, seed, mask)
    assert count == mask.sum() == min(k, n)
    np.testing.assert_array_equal(mask, naive.random_mask(n, k, seed))


def test_random_mask_is_roughly_uniform():
    n, k, trials = 20, 5, 2000
    hits = np.zeros(n)
    mask = np.zeros(n, np.bool_)
    for s in range(1, trials + 1):
        density.random_mask(n, k, s * 7919, mask)
        hits += mask
    freq = hits / trials
    assert np.all(np.abs(freq - k / n) < 0.05), freq


@given(DTYPES, arrays(np.float64, st.integers(0, 30), elements=floats(1e3)),
       st.integers(0, 99))
def test_fold_and_split_flat_conserve_mass(dtype, g, seed):
    g = g.astype(dtype)
    rng = np.random.default_rng(seed)
    r = rng.normal(size=g.size).astype(dtype)
    mask = rng.random(g.size) < 0.4
    want_sent, want_r = naive.filter_dense(g, r, mask, residual=True)
    x = np.empty_like(g)
    density.fold_flat(g, r, x)
    folded = x.copy()
    density.split_flat(x, mask, r)
    # exact: every entry of the folded update is either sent or kept
    np.testing.assert_array_equal(x + r, folded)
    assert np.all((x == 0) | (r == 0))
    assert_close(x, want_sent, dtype, mag(g, r))
    assert_close(r, want_r, dtype, mag(g, r))


@given(row_cases(), st.integers(0, 99), st.booleans())
def test_fold_and_split_rows(case, seed, residual):
    dtype, R, rows, G = case
    rng = np.random.default_rng(seed)
    mask = rng.random(G.size) < 0.5
    want_sent, want_r = naive.filter_rows(G, rows, R, mask, residual)
    before = G.astype(np.float64).sum(0) + R.astype(np.float64)[np.unique(rows)].sum(0)
    X = np.empty_like(G)
    if residual:
        density.fold_rows(G, rows, R, X)
        density.split_rows(X, rows, mask, R)
        assert_close(R, want_r, dtype, mag(G, R))
        after = X.astype(np.float64).sum(0) + R.astype(np.float64)[np.unique(rows)].sum(0)
        assert_close(after, before, dtype, mag(G, R))
    else:
        X[...] = G
        density.drop_flat(X.reshape(-1), mask)
    assert_close(X, want_sent, dtype, mag(G, R))


@given(row_cases())
def test_accumulate_rows_is_add_at(case):
    dtype, R, rows, G = case
    want = R.astype(np.float64)
    np.add.at(want, rows, G.astype(np.float64))
    density.accumulate_rows(R, rows, G)
    assert_close(R, want, dtype, mag(R, G))


# --- guard ---------------------------------------------------------------------------

@given(DTYPES, st.integers(0, 3000), st.sampled_from([None, np.nan, np.inf, -np.inf]),
       st.floats(0, 1))
def test_all_finite(dtype, n, bad, where):
    x = np.linspace(-1e30, 1e30, n).astype(dtype)
    if bad is not None and n:
        x[int(where * (n - 1))] = bad
    assert guard.all_finite(x) == naive.all_finite(x) == (bad is None or n == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_finite_extremes(dtype):
    big = np.finfo(dtype).max
    assert guard.all_finite(np.array([big, -big, 0.0, -0.0, np.finfo(dtype).tiny], dtype))
    assert guard.all_finite(np.zeros(0, dtype))
