"""Workloads: kernels against numpy references, gradients against torch autograd,
keep_read, convergence of sequential SGD at the default lr/batch, determinism,
argument checks and the registry."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numba
import numpy as np
import pytest
import torch

import naive_workloads as naive
from hogkit.errors import InvalidArgument, InvalidType
from hogkit.kernels import logreg as klr
from hogkit.kernels import mf as kmf
from hogkit.workloads import NAMES, Workload, get, workload_class
from hogkit.workloads.logreg import SparseLogReg
from hogkit.workloads.mf import MatrixFactorization
from hogkit.workloads.mlp import DigitsMLP

jit_only = pytest.mark.skipif(numba.config.DISABLE_JIT,
                              reason="thousands of steps: too slow with NUMBA_DISABLE_JIT=1")

FLOATS = [np.float32, np.float64]


def tol(dtype):
    return dict(rtol=2e-5, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)


def tiny_mf(dtype="float64", **kw):
    kw = dict(n_rows=7, n_cols=5, rank=3, k_true=2, n_ratings=15, dtype=dtype,
              order="sweep") | kw
    return MatrixFactorization(**kw)


def tiny_logreg(dtype="float64", **kw):
    kw = dict(n_samples=40, n_features=12, min_nnz=2, max_nnz=6, dtype=dtype,
              init_scale=0.5) | kw
    return SparseLogReg(**kw)


def sgd_apply(params, grads, lr):
    for g in grads:
        if g.rows is None:
            params[g.name] -= lr * g.values
        else:
            np.subtract.at(params[g.name], g.rows, lr * g.values)


def sampled(rng_seed, n, batch):
    """The sample logreg and mlp draw from default_rng(rng_seed) (their first draw)."""
    return np.random.default_rng(rng_seed).integers(0, n, size=batch)


def swept(ctx, n, batch):
    """The samples the next ``gradient`` of a compiled workload takes: ``batch``
    consecutive ones from the worker's cursor, wrapping (a sweep)."""
    return (int(ctx.cursor[0]) + np.arange(batch)) % n


def protocol_buffers(params2d, rows, keep=True):
    """Gradient buffers of the step core protocol for ``rows`` rows per parameter."""
    G = tuple(np.full((rows, p.shape[1]), np.nan, p.dtype) for p in params2d)
    RD = tuple(np.full((rows, p.shape[1]), np.nan, p.dtype) for p in params2d)
    R = tuple(np.full(rows, -1, np.int64) for _ in params2d)
    return G, R, RD, np.zeros(len(params2d), np.int64)


# --- kernels against references --------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("keep", [True, False])
def test_mf_gradient_kernel_matches_numpy(dtype, index_dtype, keep):
    rng = np.random.default_rng(0)
    P = rng.standard_normal((6, 4)).astype(dtype)
    Q = rng.standard_normal((5, 4)).astype(dtype)
    u = np.array([0, 0, 3, 5, 3, 2], index_dtype)      # rows repeat across ratings
    i = np.array([1, 4, 1, 0, 4, 4], index_dtype)
    r = rng.standard_normal(6).astype(np.float32)
    sample = np.array([0, 2, 2, 5, 1, 0, 4], np.int64)  # ratings drawn twice
    B = len(sample)
    G, R, RD, cnt = protocol_buffers((P, Q), B + 2)
    kmf.mf_gradient(kmf.MFArrays(u, i, r, 0.1), (P, Q), sample, B, keep, G, R, RD, cnt)
    gP, gQ, ru, ri, readP, readQ = naive.mf_grad(P, Q, u, i, r, sample, 0.1)
    assert cnt.tolist() == [B, B]
    np.testing.assert_allclose(G[0][:B], gP, **tol(dtype))
    np.testing.assert_allclose(G[1][:B], gQ, **tol(dtype))
    np.testing.assert_array_equal(R[0][:B], ru)
    np.testing.assert_array_equal(R[1][:B], ri)
    assert (R[0][B:] == -1).all()                      # nothing past the fill
    if keep:
        np.testing.assert_array_equal(RD[0][:B], readP)
        np.testing.assert_array_equal(RD[1][:B], readQ)
    else:
        assert np.isnan(RD[0]).all()                   # not touched


def test_sweep_sample_wraps_and_visits_every_sample_once_per_pass():
    cursor = np.array([5], np.int64)
    idx = np.empty(4, np.int64)
    seen = []
    for _ in range(7):                                  # 28 draws over 7 samples: 4 passes
        kmf.sweep_sample(7, cursor, 4, idx)
        seen += idx.tolist()
    assert seen[:4] == [5, 6, 0, 1] and cursor[0] == (5 + 28) % 7
    assert [sorted(seen[k:k + 7]) for k in range(0, 28, 7)] == [list(range(7))] * 4


@pytest.mark.parametrize("dtype", FLOATS)
def test_mf_sse_and_predict_kernels_match_numpy(dtype):
    rng = np.random.default_rng(1)
    P = rng.standard_normal((9, 3)).astype(dtype)
    Q = rng.standard_normal((4, 3)).astype(dtype)
    u = rng.integers(0, 9, 30).astype(np.int32)
    i = rng.integers(0, 4, 30).astype(np.int32)
    r = rng.standard_normal(30).astype(np.float32)
    rel = 1e-6 if dtype == np.float32 else 1e-12
    assert kmf.mf_sse(P, Q, u, i, r) == pytest.approx(naive.mf_sse(P, Q, u, i, r), rel=rel)
    out = np.empty(30)
    kmf.mf_predict(P, Q, u, i, out)
    np.testing.assert_allclose(out, np.sum(P[u].astype(float) * Q[i], axis=1), rtol=1e-6)


def small_csr(rng, n=8, d=6, dup=True):
    lengths = rng.integers(0, 5, n)
    lengths[0] = 0                                       # an empty row
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=indptr[1:])
    indices = rng.integers(0, d, indptr[-1]).astype(np.int32)
    if dup and indptr[2] - indptr[1] >= 2:
        indices[indptr[1]] = indices[indptr[1] + 1]      # a duplicate inside one row
    values = rng.standard_normal(indptr[-1]).astype(np.float32)
    y = (rng.random(n) < 0.5).astype(np.float32)
    return indptr, indices, values, y


@pytest.mark.parametrize("dtype", FLOATS)
def test_logreg_gradient_kernel_matches_numpy(dtype):
    rng = np.random.default_rng(2)
    indptr, indices, values, y = small_csr(rng)
    w = (3 * rng.standard_normal(6)).astype(dtype)
    sample = np.array([1, 0, 3, 1, 7, 7, 2], np.int64)
    G, R, RD, cnt = protocol_buffers((w.reshape(6, 1),), len(sample) * 5)
    klr.logreg_gradient(klr.LogRegArrays(indptr, indices, values, y, 0.3), (w.reshape(6, 1),),
                        sample, len(sample), True, G, R, RD, cnt)
    # the kernel scales by 1 / nb: the mean over the batch
    g_ref, rows_ref, read_ref = naive.logreg_grad(w, indptr, indices, values, y, sample,
                                                  0.3, 1 / len(sample))
    t = int(cnt[0])
    assert t == len(rows_ref)
    np.testing.assert_allclose(G[0][:t, 0], g_ref, **tol(dtype))
    np.testing.assert_array_equal(R[0][:t], rows_ref)
    np.testing.assert_array_equal(RD[0][:t, 0], read_ref)


@pytest.mark.parametrize("dtype", FLOATS)
def test_logreg_loss_kernel_matches_numpy_including_huge_margins(dtype):
    rng = np.random.default_rng(3)
    indptr, indices, values, y = small_csr(rng, n=20)
    for scale in (1.0, 1e3):                             # 1e3: exp would overflow naively
        w = (scale * rng.standard_normal(6)).astype(dtype)
        total, right = klr.logreg_loss(w, indptr, indices, values, y)
        total_ref, right_ref = naive.logreg_loss(w, indptr, indices, values, y)
        assert np.isfinite(total)
        assert total == pytest.approx(total_ref, rel=1e-6)
        assert right == right_ref


def test_csr_matvec_matches_dense():
    rng = np.random.default_rng(4)
    indptr, indices, values, _ = small_csr(rng)
    w = rng.standard_normal(6)
    out = np.empty(8)
    klr.csr_matvec(indptr, indices, values, w, out)
    np.testing.assert_allclose(out, naive.csr_dense(indptr, indices, values, 6) @ w,
                               rtol=1e-6, atol=1e-12)


# --- gradients are gradients of the loss (torch autograd) -------------------------------

def test_mf_gradient_is_autograd_of_half_squared_error_plus_l2():
    wl = tiny_mf(reg=0.05)
    params, data = wl.build(3)
    ctx = wl.setup(params, data, rank=0, seed=0)
    batch = 9
    sample = torch.from_numpy(swept(ctx, len(data["r"]), batch))
    grads = wl.gradient(ctx, np.random.default_rng(11), batch)
    P = torch.tensor(params["P"], requires_grad=True)
    Q = torch.tensor(params["Q"], requires_grad=True)
    u, i = torch.from_numpy(data["u"]).long()[sample], torch.from_numpy(data["i"]).long()[sample]
    e = torch.from_numpy(data["r"]).double()[sample] - (P[u] * Q[i]).sum(1)
    obj = 0.5 * (e ** 2 + 0.05 * ((P[u] ** 2).sum(1) + (Q[i] ** 2).sum(1))).sum()
    obj.backward()
    for g, ref in zip(grads, (P.grad, Q.grad)):
        dense = np.zeros_like(params[g.name])
        np.add.at(dense, g.rows, g.values)               # duplicates add up
        np.testing.assert_allclose(dense, ref.numpy(), rtol=1e-10, atol=1e-12)
    assert [g.name for g in grads] == ["P", "Q"]
    assert all(g.rows.dtype == np.int64 and g.read is None for g in grads)


def test_logreg_gradient_is_autograd_of_mean_logloss_plus_touched_l2():
    wl = tiny_logreg(reg=0.1)
    params, data = wl.build(4)
    ctx = wl.setup(params, data, rank=0, seed=0)
    batch = 6
    sample = swept(ctx, len(data["y"]), batch)
    (g,) = wl.gradient(ctx, np.random.default_rng(5), batch)
    w = torch.tensor(params["w"], requires_grad=True)
    obj = 0
    for s in sample:
        sl = slice(data["indptr"][s], data["indptr"][s + 1])
        cols = torch.from_numpy(data["indices"][sl]).long()
        x = torch.from_numpy(data["values"][sl]).double()
        m = (w[cols] * x).sum()
        obj = obj + torch.nn.functional.softplus(m) - float(data["y"][s]) * m \
            + 0.05 * (w[cols] ** 2).sum()
    (obj / batch).backward()
    dense = np.zeros_like(params["w"])
    np.add.at(dense, g.rows, g.values)
    np.testing.assert_allclose(dense, w.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_mlp_gradient_is_autograd_of_mean_cross_entropy():
    wl = DigitsMLP(hidden=8, dtype="float64")
    params, data = wl.build(0)
    ctx = wl.setup(params, data, rank=0, seed=0)
    grads = wl.gradient(ctx, np.random.default_rng(6), 16)
    idx = torch.from_numpy(sampled(6, len(data["y"]), 16))
    ref = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    X, y = torch.from_numpy(data["X"])[idx], torch.from_numpy(data["y"])[idx]
    h = torch.relu(X @ ref["0.weight"].T + ref["0.bias"])
    torch.nn.functional.cross_entropy(h @ ref["2.weight"].T + ref["2.bias"], y).backward()
    assert [g.name for g in grads] == list(params)
    for g in grads:
        assert g.rows is None and g.read is None and g.values.shape == params[g.name].shape
        np.testing.assert_allclose(g.values, ref[g.name].grad.numpy(), rtol=1e-10, atol=1e-12)


# --- keep_read -----------------------------------------------------------------------

@pytest.mark.parametrize("make", [tiny_mf, tiny_logreg,
                                  lambda dtype: DigitsMLP(hidden=8, dtype=dtype)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_keep_read_holds_the_params_read_and_does_not_change_the_gradient(make, dtype):
    wl = make(dtype=dtype)
    params, data = wl.build(1)
    ctx = wl.setup(params, data, rank=0, seed=0)
    cursor = getattr(ctx, "cursor", np.zeros(1)).copy()
    with_read = [(g.name, g.values.copy(), None if g.rows is None else g.rows.copy(),
                  g.read.copy()) for g in wl.gradient(ctx, np.random.default_rng(7), 10,
                                                      keep_read=True)]
    if hasattr(ctx, "cursor"):
        ctx.cursor[...] = cursor                     # the same samples again
    plain = wl.gradient(ctx, np.random.default_rng(7), 10)
    for (name, values, rows, read), g in zip(with_read, plain):
        assert name == g.name and g.read is None
        expected = params[name] if rows is None else params[name][rows]
        assert read.dtype == params[name].dtype
        np.testing.assert_array_equal(read, expected)
        np.testing.assert_array_equal(values, g.values)
        if rows is not None:
            np.testing.assert_array_equal(rows, g.rows)


def test_mlp_setup_binds_shared_params_zero_copy():
    wl = DigitsMLP(hidden=8)
    params, data = wl.build(0)
    ctx = wl.setup(params, data, rank=0, seed=0)
    for name, p in ctx.module.named_parameters():
        assert p.data_ptr() == params[name].ctypes.data
    before = wl.gradient(ctx, np.random.default_rng(0), 4)[0].values.copy()
    params["0.weight"][...] = 0.0                        # another worker's write...
    after = wl.gradient(ctx, np.random.default_rng(0), 4)[0].values
    assert not np.allclose(before, after)                # ...is seen by the next step


# --- batches and buffers ---------------------------------------------------------------

@pytest.mark.parametrize("make", [tiny_mf, tiny_logreg])
def test_gradient_grows_for_a_larger_batch_and_rejects_batch_zero(make):
    wl = make()
    params, data = wl.build(0)
    ctx = wl.setup(params, data, rank=0, seed=0)
    rng = np.random.default_rng(0)
    big = wl.default_batch * 3 + 1
    grads = wl.gradient(ctx, rng, big)
    if wl.name == "mf":
        assert all(len(g.rows) == big for g in grads)
    assert all(len(g.rows) >= 1 for g in wl.gradient(ctx, rng, 1))
    with pytest.raises(InvalidArgument, match="batch=0"):
        wl.gradient(ctx, rng, 0)


# --- sequential SGD with the defaults converges ------------------------------------------

@jit_only
@pytest.mark.parametrize("name, steps, factor, batch", [("mf", 20_000, 0.3, 64),
                                                        ("logreg", 4000, 0.6, None),
                                                        ("mlp", 600, 0.1, None)])
def test_sequential_sgd_at_the_default_lr_reduces_the_loss(name, steps, factor, batch):
    """SGD at ``default_lr`` (mf's: the lr of a rule named without one, on minibatches
    of 64; its default rule is row-wise AdaGrad) trains sequentially."""
    wl = get(name)
    batch = batch or wl.default_batch
    params, data = wl.build(0)
    ctx = wl.setup(params, data, rank=0, seed=0)
    rng = np.random.default_rng(0)
    start = wl.loss(params, data)
    for _ in range(steps):
        sgd_apply(params, wl.gradient(ctx, rng, batch), wl.default_lr)
    end = wl.loss(params, data)
    assert np.isfinite(end)
    assert end < factor * start, (start, end)


@jit_only
def test_hot_preset_builds_small_and_skewed_and_trains():
    wl = get("mf", preset="hot")
    params, data = wl.build(0)
    assert params["P"].shape == (200, 8)
    ctx = wl.setup(params, data, rank=0, seed=0)
    rng = np.random.default_rng(0)
    start = wl.loss(params, data)
    for _ in range(1000):
        sgd_apply(params, wl.gradient(ctx, rng, wl.default_batch), wl.default_lr)
    assert wl.loss(params, data) < 0.1 * start


# --- data ----------------------------------------------------------------------------

def build_small(name):
    return {"mf": lambda: tiny_mf("float32", n_rows=50, n_cols=40, n_ratings=300),
            "logreg": lambda: tiny_logreg("float32"),
            "mlp": lambda: DigitsMLP(hidden=4),
            "rnn": lambda: get("rnn", text="markov", hidden=8, embed=4, bptt=8,
                               chars=5000)}[name]()


@pytest.mark.parametrize("name", NAMES)
def test_build_is_deterministic_and_seeds_differ(name):
    wl = build_small(name)
    p1, d1 = wl.build(5)
    p2, d2 = wl.build(5)
    p3, d3 = wl.build(6)
    for a, b in ((p1, p2), (d1, d2)):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    assert any(not np.array_equal(p1[k], p3[k]) for k in p1)
    if name in ("mlp", "rnn"):   # digits split / text fixed by their own seeds
        assert all(np.array_equal(d1[k], d3[k]) for k in d1)
    else:
        assert any(d1[k].shape != d3[k].shape or not np.array_equal(d1[k], d3[k]) for k in d1)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_build_returns_contiguous_params_of_the_dtype_and_store_friendly_data(name, dtype):
    wl = workload_class(name)(dtype=dtype) if name == "mlp" else build_small(name)
    if name != "mlp":
        wl = type(wl)(**{**{k: v for k, v in wl.config().items()
                            if k in wl._fields}, "dtype": dtype})
    params, data = wl.build(0)
    for a in params.values():
        assert a.dtype == np.dtype(dtype) and a.flags.c_contiguous and a.ndim >= 1
    for a in data.values():
        assert a.dtype in (np.int32, np.int64, np.float32, np.float64)
        assert a.flags.c_contiguous
    assert np.isfinite(wl.loss(params, data))
    assert json.loads(json.dumps(wl.metrics(params, data)))["loss"] == wl.loss(params, data)


def test_mf_ratings_are_distinct_cells_with_zipf_skew():
    skewed = MatrixFactorization(n_rows=1000, n_cols=1000, n_ratings=20_000, rank=4)
    flat = MatrixFactorization(n_rows=1000, n_cols=1000, n_ratings=20_000, rank=4, zipf=0.0)
    _, d = skewed.build(0)
    _, f = flat.build(0)
    keys = d["u"].astype(np.int64) * 1000 + d["i"]
    assert len(np.unique(keys)) == len(keys) == 20_000
    top = lambda a: np.sort(np.bincount(a, minlength=1000))[::-1]
    assert top(d["u"])[0] > 10 * np.median(top(d["u"]))   # hot rows
    assert top(f["u"])[0] < 3 * np.median(top(f["u"]))    # uniform
    assert abs(np.var(d["r"]) - 1.0) < 0.3                 # ratings of unit scale


def test_logreg_data_is_valid_csr_with_zipf_features_and_both_labels():
    wl = SparseLogReg(n_samples=2000, n_features=500, min_nnz=10, max_nnz=30)
    _, d = wl.build(0)
    lengths = np.diff(d["indptr"])
    assert d["indptr"][0] == 0 and d["indptr"][-1] == len(d["indices"]) == len(d["values"])
    assert lengths.max() <= 30 and lengths.min() >= 1
    for s in range(0, 2000, 97):                           # features distinct in a row
        row = d["indices"][d["indptr"][s]:d["indptr"][s + 1]]
        assert len(np.unique(row)) == len(row)
    counts = np.sort(np.bincount(d["indices"], minlength=500))[::-1]
    assert counts[0] > 10 * np.median(counts)
    assert 0.2 < d["y"].mean() < 0.8
    assert set(np.unique(d["y"])) == {0.0, 1.0}


def test_mlp_data_is_standardised_digits():
    wl = DigitsMLP()
    params, data = wl.build(0)
    assert data["X"].shape == (1438, 64) and data["X_test"].shape == (359, 64)
    assert set(np.unique(data["y"])) == set(range(10))
    np.testing.assert_allclose(data["X"].mean(axis=0), 0.0, atol=1e-5)
    assert sorted(params) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert params["0.weight"].shape == (64, 64)


def test_mlp_build_leaves_the_global_torch_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    DigitsMLP(hidden=4).build(9)
    assert torch.equal(torch.rand(3), expected)


# --- registry, config, pickling ---------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_registry_config_and_pickle(name):
    wl = get(name)
    assert isinstance(wl, Workload) and wl.name == name
    assert wl.needs_torch == (name in ("mlp", "rnn"))
    assert wl.default_lr > 0 and wl.default_batch >= 1
    assert wl.grad_reduction == ("sum" if name == "mf" else "mean")
    cfg = json.loads(json.dumps(wl.config()))
    assert cfg["name"] == name
    again = pickle.loads(pickle.dumps(wl))
    assert again == wl and again.config() == wl.config()
    assert get(wl) is wl
    assert repr(wl).startswith(type(wl).__name__ + "(")


def test_large_preset_is_at_least_100_mb_of_factors():
    wl = get("mf", preset="large")
    assert (wl.n_rows + wl.n_cols) * wl.rank * 4 >= 100e6
    assert wl.n_ratings >= 2_000_000
    assert get("mf", preset="large", rank=8).rank == 8      # explicit settings win


def test_unknown_names_and_settings_are_rejected():
    with pytest.raises(InvalidArgument, match="unknown workload 'nope'.*'mf', 'logreg', 'mlp'"):
        get("nope")
    with pytest.raises(InvalidType):
        get(3)
    with pytest.raises(InvalidArgument, match="no setting.*'ranks'"):
        get("mf", ranks=3)
    with pytest.raises(InvalidArgument, match="instance"):
        get(get("mf"), rank=3)


@pytest.mark.parametrize("name, kwargs, error, text", [
    ("mf", dict(rank=0), InvalidArgument, "rank=0 must be >= 1"),
    ("mf", dict(n_rows=10, n_cols=10, rank=11), InvalidArgument, "rank=11 must be <= 10"),
    ("mf", dict(n_rows=10, n_cols=10, rank=2, k_true=2, n_ratings=51), InvalidArgument,
     "n_ratings=51 must be <= 50"),
    ("mf", dict(zipf=-0.5), InvalidArgument, "zipf=-0.5 must be >= 0"),
    ("mf", dict(noise=float("nan")), InvalidArgument, "finite"),
    ("mf", dict(init_scale=0.0), InvalidArgument, "saddle"),
    ("mf", dict(n_rows=2.5), InvalidType, "must be an int"),
    ("mf", dict(preset="huge"), InvalidArgument, "'default', 'hot', 'large'"),
    ("mf", dict(dtype="float16"), InvalidArgument, "'float32', 'float64'"),
    ("mf", dict(dtype="nonsense"), InvalidType, "not a numpy dtype"),
    ("logreg", dict(n_samples=0), InvalidArgument, "n_samples=0 must be >= 1"),
    ("logreg", dict(min_nnz=5, max_nnz=4), InvalidArgument, "max_nnz=4 must be >= 5"),
    ("logreg", dict(n_features=8, min_nnz=2, max_nnz=9), InvalidArgument,
     "max_nnz=9 must be <= 8"),
    ("logreg", dict(values="ternary"), InvalidArgument, "'binary', 'real'"),
    ("logreg", dict(normalize=1), InvalidType, "True or False"),
    ("logreg", dict(reg=-1), InvalidArgument, "reg=-1.0 must be >= 0"),
    ("mlp", dict(hidden=0), InvalidArgument, "hidden=0 must be >= 1"),
    ("mlp", dict(test_fraction=0.95), InvalidArgument, "test_fraction=0.95 must be <= 0.9"),
])
def test_bad_settings_raise_clear_errors(name, kwargs, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        get(name, **kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_setup_and_build_reject_bad_inputs(name):
    wl = build_small(name)
    with pytest.raises(InvalidType):
        wl.build(1.5)
    with pytest.raises(InvalidArgument):
        wl.build(-1)
    params, data = wl.build(0)
    with pytest.raises(InvalidArgument, match="lacks"):
        wl.setup({}, data, rank=0, seed=0)
    first = next(iter(params))
    bad = dict(params, **{first: params[first].astype(np.float16)})
    with pytest.raises(InvalidType, match="dtype"):
        wl.setup(bad, data, rank=0, seed=0)
    bad = dict(params, **{first: params[first][..., :1].copy()})
    with pytest.raises(InvalidArgument, match="shape"):
        wl.setup(bad, data, rank=0, seed=0)
    ro = params[first].copy()
    ro.flags.writeable = False
    with pytest.raises(InvalidArgument, match="read-only"):
        wl.setup(dict(params, **{first: ro}), data, rank=0, seed=0)


def test_setup_rejects_indices_outside_the_tables():
    wl = tiny_mf()
    params, data = wl.build(0)
    bad = dict(data, u=data["u"] + np.int32(wl.n_rows))
    with pytest.raises(InvalidArgument, match="outside"):
        wl.setup(params, bad, rank=0, seed=0)
    lr = tiny_logreg()
    params, data = lr.build(0)
    bad = dict(data, indices=data["indices"] + np.int32(lr.n_features))
    with pytest.raises(InvalidArgument, match="outside"):
        lr.setup(params, bad, rank=0, seed=0)
    bad = dict(data, indptr=data["indptr"][::-1].copy())
    with pytest.raises(InvalidArgument, match="CSR"):
        lr.setup(params, bad, rank=0, seed=0)


def test_only_mlp_imports_torch():
    code = ("import sys, numpy as np; from hogkit.workloads import get\n"
            "for n in ('mf', 'logreg'):\n"
            "    w = get(n, **({'n_rows': 20, 'n_cols': 20, 'rank': 2, 'k_true': 2,"
            " 'n_ratings': 50} if n == 'mf' else {'n_samples': 30, 'n_features': 100}))\n"
            "    p, d = w.build(0); c = w.setup(p, d, rank=0, seed=0)\n"
            "    w.gradient(c, np.random.default_rng(0), 4); w.loss(p, d)\n"
            "import hogkit.workloads.mlp\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("make", [tiny_mf, tiny_logreg])
def test_batches_sweep_the_stored_order_from_a_per_worker_start(make):
    wl = make()
    params, data = wl.build(0)
    n = len(data["u"] if wl.name == "mf" else data["y"])
    starts = {int(wl.setup(params, data, rank=r, seed=0).cursor[0]) for r in range(6)}
    assert len(starts) > 1                           # workers start apart
    ctx = wl.setup(params, data, rank=0, seed=0)
    batch = n - 1
    expected = swept(ctx, n, 2 * batch)
    got = []
    for _ in range(2):
        grads = wl.gradient(ctx, np.random.default_rng(0), batch)
        if wl.name == "mf":
            got += [np.flatnonzero((data["u"] == u) & (data["i"] == i))[0]
                    for u, i in zip(grads[0].rows, grads[1].rows)]
    if wl.name == "mf":                              # cells are distinct: rows name them
        np.testing.assert_array_equal(got, expected)
        assert len(np.unique(expected[:batch])) == batch  # no rating twice in one batch


@pytest.mark.parametrize("kw", [{}, {"preset": "hot"}, {"preset": "default", "order": "blocks"},
                                {"dtype": "float64", "n_rows": 300, "n_cols": 200,
                                 "n_ratings": 5000}])
def test_mf_planned_bytes_is_a_lower_bound_known_before_building(kw):
    """A live run checks /dev/shm against it before building: exact for the factors
    and the ratings, never more than what build() makes."""
    from hogkit import workloads
    wl = workloads.get("mf", **kw)
    params, data = wl.build(0)
    made = sum(a.nbytes for a in {**params, **data}.values())
    exact = sum(a.nbytes for a in params.values()) + sum(
        data[k].nbytes for k in ("u", "i", "r"))
    assert wl.planned_bytes() == exact <= made
