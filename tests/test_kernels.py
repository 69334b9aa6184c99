"""Every kernel in kernels/{sparse,dense,delayed,density,guard,exchange}.py against its
plain-numpy reference in tests/naive.py (float64), on random shapes with duplicate rows, empty
batches, single rows and extreme values. Also run with NUMBA_DISABLE_JIT=1 by
tests/test_nojit.py so coverage sees the kernel bodies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

from hogkit.kernels import delayed, dense, density, exchange, guard, sparse
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


@given(flat_cases(lim=1e4), st.integers(1, 64))
def test_merge_flat_is_numpys_merge_bit_for_bit(case, workers):
    """A local phase's one-pass merge equals the numpy two-step merge it replaced
    (``shared += (replica - base) / W``, then ``replica = base = shared``) exactly, in
    the buffer's own dtype; ``workers=1`` is the sum merge."""
    from hogkit.policy.local_sgd import local_delta, merge
    dtype, shared, replica = case
    base = (replica[::-1] * 0.5).astype(dtype)
    want = shared.copy()
    merge(want, local_delta(replica, base), workers=workers)
    dense.merge_flat(shared, replica, base, workers)
    np.testing.assert_array_equal(shared, want)
    np.testing.assert_array_equal(replica, want)
    np.testing.assert_array_equal(base, want)


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
        density.hold_rows(S, rows, E, 0)
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
def test_hold_rows_is_add_at_on_the_first_n_rows(case):
    dtype, R, rows, G = case
    n = rows.shape[0] - rows.shape[0] // 3         # the rest of the batch stays out
    want = R.astype(np.float64)
    np.add.at(want, rows[:n], G[:n].astype(np.float64))
    density.hold_rows(R, rows, G, n)
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


# --- delayed: the one-pass row kernels on duplicate-heavy batches --------------------

@st.composite
def dup_heavy_cases(draw):
    """Batches of up to 64 rows drawn from a few rows: most rows repeat, often."""
    dtype = draw(DTYPES)
    n = draw(st.integers(1, 5))
    d = draw(st.integers(1, 20))
    b = draw(st.integers(0, 64))
    rows = draw(arrays(np.int64, b, elements=st.integers(0, n - 1)))
    W = draw(values(dtype, (n, d), 10.0))
    G = draw(values(dtype, (b, d), 10.0))
    return dtype, W, rows, G


@given(dup_heavy_cases(), st.sampled_from([0.0, 0.04, 1.0]), st.integers(0, 99))
def test_dc_rows_duplicate_heavy(case, lam, seed):
    dtype, W, rows, G = case
    B = _read_of(W[rows], 0.3, seed)
    W2, MS, MS2 = W.copy(), np.full_like(W, 0.25), np.full_like(W, 0.25)
    want = naive.dc_rows(W, rows, G, B, 0.1, lam)
    want_w, want_ms = naive.dc_adaptive_rows(W, MS, rows, G, B, 0.1, 2.0, 0.95, 1e-7)
    delayed.dc_rows(W, rows, G, B, 0.1, lam)
    delayed.dc_adaptive_rows(W2, MS2, rows, G, B, 0.1, 2.0, 0.95, 1e-7)
    s = (1 + len(rows))
    assert_close(W, want, dtype, mag(W, G, lam * G * G * 20) * s)
    assert_close(MS2, want_ms, dtype, mag(G * G))
    assert_close(W2, want_w, dtype, mag(W2, G) * 100 * s)


@given(dup_heavy_cases(), st.sampled_from([0.0, 0.9]), st.integers(1, 5), st.integers(0, 99))
def test_gap_aware_rows_duplicate_heavy(case, mu, k, seed):
    dtype, W, rows, G = case
    R = _read_of(W[rows], 0.3, seed)
    V = np.full_like(W, 0.5)
    M = (0.1 * W).astype(dtype) if mu else np.empty((0, 0), dtype)
    want_w, want_m, want_v = naive.gap_aware_rows(W, M, V, rows, G, R, 0.1, mu, 0.999,
                                                  0.1, k)
    delayed.gap_aware_rows(W, M, V, rows, G, R, 0.1, mu, 0.999, 0.1, k)
    s = mag(W, G, V) * (1 + len(rows))
    assert_close(V, want_v, dtype, s * s)
    if mu:
        assert_close(M, want_m, dtype, s)
    assert_close(W, want_w, dtype, s)


def _fresh_duplicates(dtype, seed=0):
    """A batch where every row repeats and every read is fresh (B = W at the start)."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(5, 37)).astype(dtype)
    rows = np.array([3, 1, 3, 3, 0, 1, 4, 3], np.int64)
    G = rng.normal(size=(len(rows), 37)).astype(dtype)
    return W, rows, G, W[rows].copy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fresh_read_with_duplicates_is_plain_sgd_exactly(dtype):
    """The later occurrences of a row must not see its earlier steps as staleness:
    with fresh reads every rule reduces to plain SGD, bit for bit, duplicates or not
    (the path that saves repeated rows' start values against the plain one)."""
    W, rows, G, B = _fresh_duplicates(dtype)
    want = W.copy()
    sparse.sgd_rows(want, rows, G, 0.1)
    for run in (lambda X: delayed.dc_rows(X, rows, G, B, 0.1, 1.0),
                lambda X: delayed.dc_adaptive_rows(X, np.ones_like(X), rows, G, B, 0.1,
                                                   2.0, 0.95, 1e-7),
                lambda X: delayed.gap_aware_rows(X, np.empty((0, 0), dtype),
                                                 np.ones_like(X), rows, G, B, 0.1, 0.0,
                                                 0.999, 0.1, 3)):
        X = W.copy()
        run(X)
        np.testing.assert_array_equal(X, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unique_rows_do_not_depend_on_batch_order(dtype):
    """A batch without duplicates (the path with no saved rows): permuting it gives
    bit-identical tables, and it equals the same rows applied one call at a time."""
    rng = np.random.default_rng(1)
    W = rng.normal(size=(50, 9)).astype(dtype)
    rows = rng.permutation(50)[:20].astype(np.int64)
    G = rng.normal(size=(20, 9)).astype(dtype)
    B = _read_of(W[rows], 0.3, 2)
    perm = rng.permutation(20)
    for f, extra in ((delayed.dc_rows, ()), (delayed.gap_aware_rows, ())):
        a, b, c = W.copy(), W.copy(), W.copy()
        if f is delayed.dc_rows:
            f(a, rows, G, B, 0.1, 0.5)
            f(b, rows[perm], G[perm], B[perm], 0.1, 0.5)
            for i in range(20):
                f(c, rows[i:i + 1], G[i:i + 1], B[i:i + 1], 0.1, 0.5)
        else:
            E = np.empty((0, 0), dtype)
            Va, Vb, Vc = (np.full_like(W, 0.5) for _ in range(3))
            f(a, E, Va, rows, G, B, 0.1, 0.0, 0.999, 0.1, 2)
            f(b, E, Vb, rows[perm], G[perm], B[perm], 0.1, 0.0, 0.999, 0.1, 2)
            for i in range(20):
                f(c, E, Vc, rows[i:i + 1], G[i:i + 1], B[i:i + 1], 0.1, 0.0, 0.999, 0.1, 2)
            np.testing.assert_array_equal(Va, Vb)
            np.testing.assert_array_equal(Va, Vc)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


# --- density: top-k on arrays large enough for the sampled bracket -------------------

@st.composite
def big_topk_cases(draw):
    """n > 4 * _SAMPLE, so topk_mask brackets the k-th magnitude from a sample; data
    continuous, tie-heavy, or built so the strided sample misses (the fallback)."""
    dtype = draw(DTYPES)
    n = draw(st.integers(4 * density._SAMPLE + 1, 6 * density._SAMPLE))
    kind = draw(st.sampled_from(["normal", "ties", "adversarial", "signed_zeros"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "normal":
        x = rng.normal(scale=draw(st.sampled_from([1e-3, 1.0, 1e20])), size=n)
    elif kind == "ties":
        x = rng.choice([0.0, 1.0, -1.0, 2.0, -2.5, 0.5], size=n)
    elif kind == "adversarial":            # the strided sample sees only zeros
        x = rng.normal(size=n) + 10.0
        x[::n // density._SAMPLE] = 0.0
    else:
        x = rng.choice([0.0, -0.0, 1e-30, -1e-30], size=n)
    k = draw(st.one_of(st.integers(0, n + 2), st.sampled_from([1, n - 1, n // 10, n // 2])))
    return x.astype(dtype), k


@given(big_topk_cases())
def test_topk_mask_large(case):
    x, k = case
    mask = np.zeros(x.size, np.bool_)
    count = density.topk_mask(x, k, mask)
    want = naive.topk_mask(x, k)
    np.testing.assert_array_equal(mask, want)
    assert count == want.sum() == min(k, x.size)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("frac", [0.1, 0.3, 0.5])
def test_topk_mask_gradient_like(dtype, frac):
    """The benchmark's case: 4096 x 64 normal gradients, k = frac * n."""
    x = np.random.default_rng(7).standard_normal(4096 * 64).astype(dtype) * 1e-3
    k = int(frac * x.size)
    mask = np.zeros(x.size, np.bool_)
    assert density.topk_mask(x, k, mask) == k
    np.testing.assert_array_equal(mask, naive.topk_mask(x, k))


@given(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=300), st.data())
def test_radix_kth_is_the_sorted_rank(keys, data):
    keys = np.asarray(keys, np.int64)
    r = data.draw(st.integers(1, keys.size))
    want = np.sort(keys)[::-1][r - 1]
    assert density._radix_kth(keys.copy(), keys.size, r, 31) == want


# --- the fill count n: the step core's buffers are filled to a prefix ----------------------

def _row_kernel_calls(W, S, V, rows, G, B, n):
    """Every row kernel that takes the fill count, called with it."""
    return [
        lambda: sparse.sgd_rows(W, rows, G, 0.1, n),
        lambda: sparse.momentum_rows(W, S, rows, G, 0.1, 0.9, 1.0, n),
        lambda: delayed.staleness_aware_rows(W, rows, G, 0.1, 3, n),
        lambda: delayed.staleness_aware_momentum_rows(W, S, rows, G, 0.1, 0.9, 3, n),
        lambda: delayed.dc_rows(W, rows, G, B, 0.1, 0.04, n),
        lambda: delayed.dc_adaptive_rows(W, S, rows, G, B, 0.1, 2.0, 0.95, 1e-7, n),
        lambda: delayed.gap_aware_rows(W, S, V, rows, G, B, 0.1, 0.9, 0.999, 0.1, 1, n),
    ]


@pytest.mark.parametrize("which", range(7))
def test_row_kernels_apply_only_the_first_n_entries(which):
    """Entries past n hold garbage (out-of-range rows, NaN values): a kernel that read
    them would crash or poison the table. The first n entries give what the same
    call on exactly those n entries gives."""
    rng = np.random.default_rng(which)
    n, cap = 5, 9
    rows = np.full(cap, 10**9, np.int64)
    rows[:n] = rng.integers(0, 6, n)
    G = np.full((cap, 3), np.nan)
    G[:n] = rng.standard_normal((n, 3))
    B = np.full((cap, 3), np.nan)
    B[:n] = rng.standard_normal((n, 3))
    W0, S0, V0 = (rng.standard_normal((6, 3)) for _ in range(3))
    S0, V0 = np.abs(S0), np.abs(V0)       # dc_adaptive's S and gap_aware's V are mean squares
    got = [W0.copy(), S0.copy(), V0.copy()]
    _row_kernel_calls(*got, rows, G, B, n)[which]()
    want = [W0.copy(), S0.copy(), V0.copy()]
    _row_kernel_calls(*want, rows[:n].copy(), G[:n].copy(), B[:n].copy(), -1)[which]()
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@st.composite
def changed_cases(draw):
    """(cur, base): some rows equal, some differing in one or all entries, extremes."""
    dtype = draw(DTYPES)
    n, d = draw(st.integers(1, 8)), draw(st.integers(1, 4))
    base = draw(values(dtype, (n, d), extreme=True))
    cur = base.copy()
    touched = draw(arrays(np.bool_, (n, d)))
    cur[touched] = draw(values(dtype, (n, d), extreme=True))[touched]
    return cur, base


@given(changed_cases())
def test_take_changed_rows_matches_numpy(case):
    cur, base = case
    want_rows, want_vals, want_base = naive.changed_rows(cur, base)
    n, m = cur.shape
    rows = np.full(n, -1, np.int64)
    vals = np.full(n * m, np.nan, cur.dtype)
    got_base = base.copy()
    k = exchange.take_changed_rows(cur.reshape(-1), got_base.reshape(-1), m, rows, vals)
    np.testing.assert_array_equal(rows[:k], want_rows)
    np.testing.assert_array_equal(vals[:k * m].reshape(k, m), want_vals)
    np.testing.assert_array_equal(got_base, want_base)
    # what is left unsent is exactly cur - base, in the same arithmetic as numpy
    np.testing.assert_array_equal(cur - got_base, cur - want_base)


@pytest.mark.parametrize("dtype, big", [(np.float32, 1e20), (np.float64, 1e160)])
@pytest.mark.parametrize("adaptive", [False, True], ids=["dc", "dc-adaptive"])
def test_dc_asgd_fresh_read_is_plain_sgd_even_for_a_gradient_whose_square_overflows(
        dtype, big, adaptive):
    """On a fresh read (``w == w_bak``) DC-ASGD's step is exactly ``lr·g``, through the
    dispatch every engine uses, row and flat. Under the engines' reassociation LLVM
    may form ``lam·gap·(g·g)``: ``0·inf = NaN`` when ``g·g`` overflows, and the
    parameters were lost to NaN (caught here before ``delayed._dc_step``)."""
    from hogkit.kernels import rule as R
    from hogkit.kernels.delayed import DCAdaptiveCfg, DCCfg
    cfg = DCAdaptiveCfg(1e-30, 2.0, 0.95, 1e-7) if adaptive else DCCfg(1e-30, 0.5)
    W = np.linspace(-1, 1, 24).astype(dtype).reshape(3, 8)
    G = np.full((3, 8), big, dtype) * np.array([1, -1, 1], dtype)[:, None]
    want = W - dtype(1e-30) * G
    got, ms = W.copy(), np.ones_like(W)
    R.rows_now(cfg, got, ms, got[:0], np.zeros(1, np.int64), 0, np.arange(3), G,
               W.copy(), 3, 0, False, -1)
    np.testing.assert_array_equal(got, want)
    flat, msf = W.reshape(-1).copy(), np.ones(24, dtype)
    R.flat_now(cfg, flat, msf, flat[:0], np.zeros(1, np.int64), 0, G.reshape(-1),
               W.reshape(-1).copy(), 0, -1)
    np.testing.assert_array_equal(flat, want.reshape(-1))


_HISTORY = """
import hashlib, sys
import numpy as np
from numba import njit
from hogkit.kernels import delayed

@njit(fastmath={"reassoc"})
def engine_like(W, rows, G, D, n):       # a caller with the engines' flags
    delayed.dc_gap_rows(W, rows, G, D, 0.05, 0.5, n)

rng = np.random.default_rng(0)
W = rng.normal(size=(500, 8)).astype(np.float32)
rows = np.arange(500)
G = rng.normal(size=(500, 8)).astype(np.float32)
D = (rng.normal(size=(500, 8)) * 0.5).astype(np.float32)
if sys.argv[1] == "direct":              # compiled (and cached) by a direct call first
    delayed.dc_gap_rows(W.copy(), rows, G, D, 0.05, 0.5, 500)
engine_like(W, rows, G, D, 500)
print(hashlib.sha256(W.tobytes()).hexdigest())
"""


def test_a_rule_kernels_bits_do_not_depend_on_what_compiled_it_first(tmp_path):
    """Two fresh numba caches: in one the engine-flagged caller compiles DC-ASGD's update
    pass, in the other a direct call does first. The caller's numbers are the same: a
    kernel that stated no flags took the first caller's and cached them, so a direct
    call once changed every later run's bits on that machine."""
    import os
    import subprocess
    import sys
    script = tmp_path / "history.py"
    script.write_text(_HISTORY)
    out = {}
    for first in ("engine", "direct"):
        env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / f"cache-{first}")}
        out[first] = subprocess.run([sys.executable, str(script), first], env=env,
                                    capture_output=True, text=True, timeout=240,
                                    check=True).stdout.strip()
    assert len(out["engine"]) == 64 and out["engine"] == out["direct"]


def _mf_case(dtype, K, bad_at, bad_value):
    """Factors (12 and 9 rows of width ``K``) and 80 ratings, one of them ``bad_value``."""
    rng = np.random.default_rng(K)
    P0 = (rng.standard_normal((12, K)) * 0.3).astype(dtype)
    Q0 = (rng.standard_normal((9, K)) * 0.3).astype(dtype)
    u, i = rng.integers(0, 12, 80), rng.integers(0, 9, 80)
    r = rng.standard_normal(80).astype(dtype)
    r[bad_at] = bad_value
    return P0, Q0, u, i, r


@pytest.mark.parametrize("dtype, K, reg", [(np.float32, 16, 0.0), (np.float32, 32, 0.05),
                                           (np.float64, 8, 0.05)])
def test_vector_sgd_span_is_the_lane_loops_arithmetic(dtype, K, reg):
    """``rowvec``'s straight-line span (compiled: LLVM IR; under NUMBA_DISABLE_JIT: its
    numpy twin) against mf's numba span on the same ratings, to rounding: the same
    per-rating SGD with the L2 term, guard and count."""
    from numba import njit

    from hogkit.kernels import mf, rowvec

    @njit
    def vec(P, Q, u, i, r, a, keep, lim):
        if reg == 0.0:
            return rowvec.sgd_span_plain(P, Q, u, i, r, 0, r.shape[0], 0, 0, a, keep, lim,
                                         True)
        return rowvec.sgd_span(P, Q, u, i, r, 0, r.shape[0], 0, 0, a, keep, lim, True)

    P0, Q0, u, i, r = _mf_case(dtype, K, 17, np.inf)
    a, lim = dtype(0.05), dtype(1e18)
    P, Q = P0.copy(), Q0.copy()
    assert vec(P, Q, u, i, r, a, dtype(1.0 - 0.05 * reg), lim) == 1
    Pn, Qn = P0.copy(), Q0.copy()
    span = mf._sgd_span_plain if reg == 0.0 else mf._sgd_span
    assert span(Pn, Qn, u, i, r, 0, 80, 0, 0, a, dtype(reg), lim, True) == 1
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(P, Pn, rtol=tol, atol=tol)
    np.testing.assert_allclose(Q, Qn, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype, K, reg, decay", [(np.float32, 8, 0.0, 1.0),
                                                  (np.float32, 32, 0.05, 0.9),
                                                  (np.float64, 16, 0.05, 1.0)])
def test_vector_rowwise_span_is_the_lane_loops_arithmetic(dtype, K, reg, decay):
    """``rowvec``'s row-wise AdaGrad / RMSProp span (LIBMF's per-row step) against mf's
    numba span on the same ratings, to rounding: the error, the guard, each row's mean
    square into its one-column state, and the step."""
    from numba import njit

    from hogkit.kernels import mf, rowvec

    @njit
    def vec(P, Q, u, i, r, a, lim, SP, SQ, fresh):
        return rowvec.rowwise_span(P, Q, u, i, r, 0, r.shape[0], 0, 0, a, P.dtype.type(reg),
                                   lim, True, SP, SQ, P.dtype.type(decay), fresh,
                                   P.dtype.type(1e-8))

    P0, Q0, u, i, r = _mf_case(dtype, K, 5, np.nan)
    a, lim, fresh = dtype(0.1), dtype(1e18), dtype(1.0 if decay == 1.0 else 1.0 - decay)
    out = []
    for run in ("vector", "numba"):
        P, Q = P0.copy(), Q0.copy()
        SP, SQ = np.ones((12, 1), dtype), np.ones((9, 1), dtype)
        if run == "vector":
            assert vec(P, Q, u, i, r, a, lim, SP, SQ, fresh) == 1
        else:
            assert mf._adaptive_span(P, Q, SP, SQ, u, i, r, 0, 80, 0, 0, a, dtype(reg),
                                     dtype(decay), fresh, dtype(1e-8), lim, True) == 1
        out.append((P, Q, SP, SQ))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for x, y in zip(*out):
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol)


def _strided(A):
    """``A``'s values in a view whose rows are not contiguous (every other element of a
    twice-as-wide table): ``gapvec.fits`` refuses it, so the numba loops run."""
    wide = np.zeros((A.shape[0], 2 * A.shape[1]), A.dtype)
    wide[:, ::2] = A
    return wide[:, ::2]


def _rows_case(seed, dtype, width, big):
    """A rule's row batch: ``(rng, n, W0, S0, rows, G)``: a table of ``width`` columns
    (4,000 rows, prefetched, when ``big``; else 6), its state, ``n`` < 40 entries on
    random rows (repeats likely) and their gradient."""
    rng = np.random.default_rng(seed)
    nrows = 4000 if big else 6
    n = int(rng.integers(1, 40))
    W0 = rng.standard_normal((nrows, width)).astype(dtype)
    S0 = (rng.random((nrows, width)) * 0.1).astype(dtype)
    rows = rng.integers(0, nrows, n)
    return rng, n, W0, S0, rows, rng.standard_normal((n, width)).astype(dtype)


@given(seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([np.float32, np.float64]),
       vectors=st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 16]), big=st.booleans())
def test_vector_rule_passes_give_the_numba_loops_bits(seed, dtype, vectors, big):
    """``gapvec``'s gap pass, Gap-Aware's and adaptive DC-ASGD's update passes and their
    undamped step (the straight-line vector code a contiguous table of a covered width
    takes) give every bit the numba loops give on the same values (a strided copy of the
    tables takes the loops): repeated rows, half the entries moved since their read with some
    coordinates not, a NaN gap, a gradient whose square overflows, both dtypes, every
    covered width, a table small enough to stay in cache and one prefetched."""
    from hogkit.kernels import gapvec
    K = vectors * 32 // np.dtype(dtype).itemsize
    rng, n, W0, S0, rows, G = _rows_case(seed, dtype, K, big)
    R = W0[rows]
    moved = rng.random(n) < 0.5
    R[moved, K // 2:] += (rng.standard_normal((moved.sum(), K - K // 2)) * 0.01).astype(dtype)
    R[0, 0], G[-1, -1] = np.nan, dtype(1e30) if dtype == np.float32 else 1e300
    out = {}
    for path, view in (("vector", np.array), ("numba", _strided)):
        W, S1, S2, S3, B = view(W0), view(S0), view(S0), view(S0), view(R)
        assert gapvec.fits(W, S1, G, B) == (path == "vector")
        with np.errstate(all="ignore"):
            delayed.gaps_into(W, rows, B, n)
            gaps = B.copy()
            delayed.gap_aware_gap_rows(W, S1[:0], S1, rows, G, B, 0.05, 0.0, 0.99, 0.1, 7, n)
            delayed.dc_adaptive_gap_rows(W, S2, rows, G, B, 0.05, 2.0, 0.95, 1e-7, n)
            delayed.undamped_rows(W, S3, rows, G, 0.05, 0.95, n)
        out[path] = [np.ascontiguousarray(x).view(np.uint8) for x in (gaps, W, S1, S2, S3)]
    for x, y in zip(out["vector"], out["numba"]):
        np.testing.assert_array_equal(x, y)


@given(seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([np.float32, np.float64]),
       width=st.sampled_from([1, 3, 8, 32, 64]), big=st.booleans())
def test_the_undamped_step_gives_the_gap_passes_bits_on_a_fresh_read(seed, dtype, width, big):
    """``delayed.undamped_rows`` (the step core's fresh step, no gap rows) gives every
    bit adaptive DC-ASGD's and Gap-Aware's update passes give from all-zero gaps, and
    ``sparse.sgd_rows`` (constant DC-ASGD's fresh step) constant DC-ASGD's, on
    the vector code and on the numba loops (a strided copy), a one-column table,
    repeated rows, a gradient whose square overflows and a NaN one, both dtypes."""
    from hogkit.kernels import gapvec
    _, n, W0, S0, rows, G = _rows_case(seed, dtype, width, big)
    G[-1, -1] = dtype(1e30) if dtype == np.float32 else 1e300
    G[0, 0] = np.nan if n > 1 else G[0, 0]
    views = (("vector", np.array), ("numba", _strided)) if width > 1 else (("one", np.array),)
    for path, view in views:     # zero gaps laid out as the tables (types compiled once)
        W, S, Wu, Su, Z = (view(x) for x in (W0, S0, W0, S0, np.zeros_like(G)))
        if path == "vector":
            assert gapvec.fits(W, S, G, G) == (width * np.dtype(dtype).itemsize % 32 == 0)
        with np.errstate(all="ignore"):
            delayed.dc_adaptive_gap_rows(W, S, rows, G, Z, 0.05, 2.0, 0.95, 1e-7, n)
            delayed.undamped_rows(Wu, Su, rows, G, 0.05, 0.95, n)
            for a, b in ((W, Wu), (S, Su)):
                np.testing.assert_array_equal(np.ascontiguousarray(a).view(np.uint8),
                                              np.ascontiguousarray(b).view(np.uint8))
            delayed.gap_aware_gap_rows(W, S[:0], S, rows, G, Z, 0.05, 0.0, 0.99, 0.1, 7, n)
            delayed.undamped_rows(Wu, Su, rows, G, 0.05, 0.99, n)
            delayed.dc_gap_rows(W, rows, G, Z, 0.05, 2.0, n)   # constant: SGD's step
            sparse.sgd_rows(Wu, rows, G, 0.05, n)
        for a, b in ((W, Wu), (S, Su)):
            np.testing.assert_array_equal(np.ascontiguousarray(a).view(np.uint8),
                                          np.ascontiguousarray(b).view(np.uint8))


def _halved(v):
    """rowvec's lane halving on each row of ``v``: ``v[:, :h] += v[:, h:n]`` down to one
    lane, then ``-0 + v[:, 0]``."""
    v, n = v.copy(), v.shape[1]
    while n > 1:
        v[:, :n // 2] = v[:, :n // 2] + v[:, n // 2:n]
        n //= 2
    return v.dtype.type(-0.0) + v[:, 0]


def _dot_in_rowvec_order(p, q):
    """Each row's ``p·q`` summed in the order ``rowvec._dot_in_llvm_order`` documents, in
    numpy (each operation rounded in the rows' dtype): four accumulators of one 32-byte
    vector over blocks of four vectors, the first from ``<0, -0, ...>``, summed ``((a1 +
    a0) + a2) + a3`` and halved; then a 4-lane epilogue over the rest, halved."""
    rows, lanes = p.shape[0], 32 // p.itemsize
    prods = [p[:, c:c + lanes] * q[:, c:c + lanes] for c in range(0, p.shape[1], lanes)]
    total, main = np.zeros(rows, p.dtype), len(prods) // 4
    if main:
        accs = [np.tile(np.array([0.0] + [-0.0] * (lanes - 1), p.dtype), (rows, 1))]
        accs += [np.full((rows, lanes), -0.0, p.dtype) for _ in range(3)]
        for j in range(main):
            accs = [a + prods[4 * j + c] for c, a in enumerate(accs)]
        total = _halved(((accs[1] + accs[0]) + accs[2]) + accs[3])
    if prods[4 * main:]:
        acc = np.full((rows, 4), -0.0, p.dtype)
        acc[:, 0] = total
        for v in prods[4 * main:]:
            for lo in range(0, lanes, 4):
                acc = acc + v[:, lo:lo + 4]
        total = _halved(acc)
    return total


@given(seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([np.float32, np.float64]),
       vectors=st.sampled_from([1, 4, 16]),
       bad=st.sampled_from(["none", "nan rating", "inf factor", "overflow", "unused inf"]))
def test_the_mf_gradient_vouches_finite_exactly_when_the_guard_scan_would(seed, dtype,
                                                                         vectors, bad):
    """``mf_gradient`` returns True (the step core's ``compute`` then skips its guard's
    scan of the buffers) only from the vector rows, which check every value they write
    as they write it: True exactly when the scan finds every value finite (not after a
    NaN rating, an inf factor or a product that overflows; yes with an inf in a row no
    sample reads), and False from the numba loops (strided tables), whose buffers the
    core scans. (``tests/test_step.py``'s guard test runs it through the core.)"""
    from numba import config

    from hogkit.kernels import guard, mf, rowvec
    rng = np.random.default_rng(seed)
    K = vectors * 32 // np.dtype(dtype).itemsize
    P0 = (rng.standard_normal((30, K)) * 0.3).astype(dtype)
    Q0 = (rng.standard_normal((20, K)) * 0.3).astype(dtype)
    ns, nb = 200, int(rng.integers(2, 70))
    u, i = rng.integers(0, 29, ns).astype(np.int32), rng.integers(0, 20, ns)
    r = rng.standard_normal(ns).astype(dtype)        # row 29 of P: no sample reads it
    idx = rng.integers(0, ns, nb)
    if bad == "nan rating":
        r[idx[-1]] = np.nan
    elif bad == "inf factor":
        P0[u[idx[0]], K - 1] = np.inf
    elif bad == "overflow":
        P0[u[idx[0]]] = np.finfo(dtype).max / 4
    elif bad == "unused inf":
        P0[29, 0] = np.inf
    wl = mf.MFArrays(u, i, r, 0.05)
    for path, view in (("vector", np.array), ("numba", _strided)):
        P, Q = view(P0), view(Q0)
        GF = (np.zeros(nb * K, dtype), np.zeros(nb * K, dtype))
        G = tuple(g.reshape(nb, K) for g in GF)
        RD = (np.zeros((nb, K), dtype), np.zeros((nb, K), dtype))
        R, cnt = (np.zeros(nb, np.int64), np.zeros(nb, np.int64)), np.zeros(2, np.int64)
        assert rowvec.grad_fits(P, Q, *G, *RD) == (path == "vector")
        with np.errstate(all="ignore"):
            said = mf.mf_gradient(wl, (P, Q), idx, nb, True, G, R, RD, cnt)
        scanned = all(guard.finite_prefix(g, nb * K) for g in GF)
        assert scanned == (bad in ("none", "unused inf"))
        assert said == (scanned and path == "vector" and not config.DISABLE_JIT)


@given(seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([np.float32, np.float64]),
       rdtype=st.sampled_from([np.float32, np.float64]),
       vectors=st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 16]), reg=st.sampled_from([0.0, 0.05]))
def test_vector_mf_gradient_sums_in_its_documented_order(seed, dtype, rdtype, vectors, reg):
    """mf's minibatch gradient with the read copies as straight-line vector code
    (``rowvec.grad_rows``) gives every bit of a numpy reference of the order it spells
    out (``_dot_in_rowvec_order``): ``ne = T(p·q - r)``, ``GP = ne·q + p·reg``, ``GQ =
    ne·p + q·reg``, rows of zeros and negative zeros among them. That order is what
    LLVM's loop vectoriser gave numba's loop on the Intel Xeon it was read on (32-byte
    vectors); numba compiles for the host, and on an AMD EPYC (Zen 4) its loop sums in
    another order, so the loop (strided factor tables take it) is held to the same
    copies, rows and counts and to a gradient within its rounding, not to its bits.
    Under NUMBA_DISABLE_JIT both paths are the loop (``grad_rows`` returns -1 from
    Python), held to the same."""
    from numba import config

    from hogkit.kernels import mf, rowvec
    rng = np.random.default_rng(seed)
    K = vectors * 32 // np.dtype(dtype).itemsize
    P0 = (rng.standard_normal((30, K)) * 0.3).astype(dtype)
    Q0 = (rng.standard_normal((20, K)) * 0.3).astype(dtype)
    P0[3], P0[4, ::2] = 0.0, -0.0
    ns, nb = 200, int(rng.integers(1, 70))
    wl = mf.MFArrays(rng.integers(0, 30, ns).astype(np.int32), rng.integers(0, 20, ns),
                     rng.standard_normal(ns).astype(rdtype), reg)
    idx = rng.integers(0, ns, nb)
    out = {}
    for path, view in (("vector", np.array), ("numba", _strided)):
        P, Q = view(P0), view(Q0)
        G = (np.zeros((nb, K), dtype), np.zeros((nb, K), dtype))
        RD = (np.zeros((nb, K), dtype), np.zeros((nb, K), dtype))
        R, cnt = (np.zeros(nb, np.int64), np.zeros(nb, np.int64)), np.zeros(2, np.int64)
        assert rowvec.grad_fits(P, Q, *G, *RD) == (path == "vector")
        mf.mf_gradient(wl, (P, Q), idx, nb, True, G, R, RD, cnt)
        out[path] = (G, [x.view(np.uint8) for x in RD] + list(R) + [cnt])
    for x, y in zip(out["vector"][1], out["numba"][1]):
        np.testing.assert_array_equal(x, y)
    T, eps = dtype, np.finfo(dtype).eps
    p, q = P0[wl.u[idx]], Q0[wl.i[idx]]
    ne = (_dot_in_rowvec_order(p, q).astype(np.float64)
          - wl.r[idx].astype(np.float64)).astype(T)[:, None]
    want = (ne * q + p * T(reg), ne * p + q * T(reg))
    # numba's loop: the same products summed in any order, |error| <= K·eps·sum|p·q|
    slack = (2 * K * eps * np.abs(p.astype(float) * q).sum(1, keepdims=True)
             + 4 * eps * np.abs(ne))
    for side, (w, other) in enumerate(zip(want, (q, p))):
        if not config.DISABLE_JIT:
            np.testing.assert_array_equal(out["vector"][0][side].view(np.uint8),
                                          w.view(np.uint8))
        bound = slack * np.abs(other).max(1, keepdims=True) + 4 * eps * np.abs(w) + 1e-30
        for path in ("numba",) if not config.DISABLE_JIT else ("vector", "numba"):
            assert np.all(np.abs(out[path][0][side] - w) <= bound), path


def test_a_line_ping_pong_counts_its_hand_overs_and_gives_up_at_its_deadline():
    """kernels.probe.line_pingpong: two threads alternate on flag[0] until it reads
    2 * rounds; side 0 returns the time of the hand-overs after the warm rounds, side 1
    zero; a side whose peer never comes returns -1 once the deadline passed."""
    import threading
    import time

    from hogkit.kernels.probe import line_pingpong
    flag = np.zeros(8, np.int64)
    assert line_pingpong(flag, 0, 3, 0, 0) == -1 and flag[0] == 1   # nobody answered
    flag[0] = 0
    out = [None, None]
    deadline = time.monotonic_ns() + 60 * 10**9

    def side(k):
        out[k] = line_pingpong(flag, k, 50, 5, deadline)

    threads = [threading.Thread(target=side, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert flag[0] == 100 and out[1] == 0 and out[0] > 0
