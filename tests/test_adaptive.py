"""AdaGrad and RMSProp (issue 25 part 2), per coordinate and row-wise, on every path: the
kernels against a plain-numpy reference (hypothesis over shapes and duplicate rows),
``rule.apply`` on parameters of every rank, the compiled step core against the Python
step (the rows in ``test_step.py`` and a density case here), both simulator engines, a
live run, ``hogkit.optim`` against ``torch.optim``, ``compose``, the CLI's names, the
checkpoint store, and bad input that must raise and leave everything as it was."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.kernels import adaptive as ka
from hogkit.kernels import rule as kr
from hogkit.kernels.adaptive import RMSPropCfg
from hogkit.rules.compose import (adagrad, chain, delay_compensation, gap_aware, momentum,
                                  rmsprop, scale_by_staleness)
from hogkit.rules.core import AdaGrad, RMSProp
from hogkit.rules.density import Density
from hogkit.rules.grads import Grad
import hogkit

TOL = {np.float32: 2e-5, np.float64: 1e-12}


# --------------------------------------------------------------------------- reference

def ref_rows(alpha, P, S, rows, G, lr, eps, gs=1.0):
    """Plain numpy, float64: the rule on rows ``rows`` of ``P`` (``(n, d)``) in batch
    order; ``alpha`` None is AdaGrad. ``S`` ``(n, d)`` per coordinate, ``(n, 1)``
    row-wise (fed the row's mean of g*g)."""
    P, S = P.astype(np.float64), S.astype(np.float64)
    for i, r in enumerate(rows):
        g = gs * G[i].astype(np.float64)
        v = g * g if S.shape[1] == P.shape[1] else np.array([np.mean(g * g)])
        S[r] = S[r] + v if alpha is None else alpha * S[r] + (1 - alpha) * v
        P[r] = P[r] - lr * g / (np.sqrt(S[r]) + eps)
    return P, S


def close(actual, expected, dtype):
    tol = TOL[dtype]
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=tol, atol=tol)


# --------------------------------------------------------------------------- kernels

@settings(deadline=None, max_examples=25)
@given(n=st.integers(1, 6), d=st.integers(1, 5), rows=st.lists(st.integers(0, 5), max_size=9),
       rowwise=st.booleans(), rms=st.booleans(), f32=st.booleans(),
       tau=st.integers(0, 3), seed=st.integers(0, 2**32 - 1))
def test_row_kernels_match_the_reference(n, d, rows, rowwise, rms, f32, tau, seed):
    """Any shape, duplicate rows processed one after the other, both variants."""
    dtype = np.float32 if f32 else np.float64
    rng = np.random.default_rng(seed)
    rows = np.array([r % n for r in rows], np.int64)
    W = rng.normal(size=(n, d)).astype(dtype)
    S = rng.uniform(0, 1, size=(n, 1 if rowwise else d)).astype(dtype)
    G = rng.normal(size=(len(rows), d)).astype(dtype)
    gs = 1.0 / max(tau, 1)
    want_w, want_s = ref_rows(0.9 if rms else None, W, S, rows, G, 0.1, 1e-6, gs)
    if rms:
        ka.rmsprop_rows(W, S, rows, G, 0.1, 0.9, 1e-6, gs)
    else:
        ka.adagrad_rows(W, S, rows, G, 0.1, 1e-6, gs)
    close(W, want_w, dtype)
    close(S, want_s, dtype)


@settings(deadline=None, max_examples=15)
@given(n=st.integers(1, 6), d=st.integers(1, 5), rowwise=st.booleans(), rms=st.booleans(),
       f32=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_flat_kernels_are_the_row_kernels_over_every_row(n, d, rowwise, rms, f32, seed):
    """A dense gradient of an (n, d) parameter: the flat kernel (state as long as w, or
    one entry per row) computes bit for bit what the row kernel does on rows 0..n-1."""
    dtype = np.float32 if f32 else np.float64
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(n, d)).astype(dtype)
    S = rng.uniform(0, 1, size=(n, 1 if rowwise else d)).astype(dtype)
    G = rng.normal(size=(n, d)).astype(dtype)
    w, s = W.reshape(-1).copy(), S.reshape(-1).copy()
    if rms:
        ka.rmsprop_rows(W, S, np.arange(n), G, 0.05, 0.99, 1e-8)
        ka.rmsprop_flat(w, s, G.reshape(-1), 0.05, 0.99, 1e-8)
    else:
        ka.adagrad_rows(W, S, np.arange(n), G, 0.05, 1e-10)
        ka.adagrad_flat(w, s, G.reshape(-1), 0.05, 1e-10)
    np.testing.assert_array_equal(w, W.reshape(-1))
    np.testing.assert_array_equal(s, S.reshape(-1))


def test_duplicates_take_one_accumulator_step_each():
    W = np.ones((3, 2))
    S = np.zeros((3, 1))
    G = np.full((3, 2), 2.0)
    ka.adagrad_rows(W, S, np.array([1, 1, 1]), G, 0.5, 1e-10)
    assert S[:, 0].tolist() == [0.0, 12.0, 0.0]          # 4 + 4 + 4
    want = 1.0 - 0.5 * 2 * (1 / (2 + 1e-10) + 1 / (np.sqrt(8) + 1e-10)
                            + 1 / (np.sqrt(12) + 1e-10))
    np.testing.assert_allclose(W[1], [want, want], rtol=1e-14)
    assert W[0].tolist() == W[2].tolist() == [1.0, 1.0]   # untouched rows: lazy


def test_the_dispatch_sends_each_configuration_to_its_kernel():
    """``kernels.rule``: ``n`` limits the rows, ``stale`` divides g by max(tau, 1)."""
    rng = np.random.default_rng(0)
    W = rng.normal(size=(4, 3))
    S = np.zeros((4, 1))
    G = rng.normal(size=(3, 3))
    rows = np.array([0, 2, 0])
    cfg = RMSProp(0.1, alpha=0.8, rowwise=True, scale_by_staleness=True).cfg()
    assert cfg == RMSPropCfg(lr=0.1, alpha=0.8, eps=1e-8, stale=True)
    want_w, want_s = ref_rows(0.8, W, S, rows[:2], G[:2], 0.1, 1e-8, 1 / 3)
    e, k = np.empty((0, 3)), np.zeros(1, np.int64)
    kr.rows_now(cfg, W, S, e, k, 0, rows, G, e, 2, 3, False, -1)
    np.testing.assert_allclose(W, want_w, rtol=1e-13)
    np.testing.assert_allclose(S, want_s, rtol=1e-13)


# --------------------------------------------------------------------------- rule.apply

def make_params(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return {"emb": rng.normal(size=(6, 2, 3)).astype(dtype),     # ndim 3, sparse rows
            "w": rng.normal(size=(4, 5)).astype(dtype),           # dense 2-D
            "b": rng.normal(size=5).astype(dtype),                # 1-D, sparse rows
            "c": rng.normal(size=5).astype(dtype)}                # 1-D, dense


def make_grads(params, rng):
    return [Grad("emb", rng.normal(size=(4, 2, 3)).astype(params["emb"].dtype),
                 np.array([1, 4, 1, 0], np.int64)),
            Grad("w", rng.normal(size=(4, 5)).astype(params["w"].dtype)),
            Grad("b", rng.normal(size=2).astype(params["b"].dtype), np.array([3, 3])),
            Grad("c", rng.normal(size=5).astype(params["c"].dtype))]


def reference(rule, params, grads, state, tau):
    alpha = getattr(rule, "alpha", None)
    gs = 1.0 / max(tau, 1) if rule.scale_by_staleness else 1.0
    out_p, out_s = {}, {}
    for g in grads:
        p = params[g.name]
        n = p.shape[0]
        P = p.reshape(n, -1)
        rows = np.arange(n) if g.rows is None else g.rows
        G = g.values.reshape(len(rows), P.shape[1])
        S = state[f"s/{g.name}"].reshape(n, -1)
        out_p[g.name], out_s[g.name] = ref_rows(alpha, P, S, rows, G, rule.lr, rule.eps, gs)
    return out_p, out_s


RULES = {"adagrad": lambda rw: AdaGrad(0.1, initial_accumulator_value=0.1, rowwise=rw),
         "adagrad-stale": lambda rw: AdaGrad(0.1, rowwise=rw, scale_by_staleness=True),
         "rmsprop": lambda rw: RMSProp(0.02, alpha=0.9, rowwise=rw)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rowwise", [False, True], ids=["per-coordinate", "rowwise"])
@pytest.mark.parametrize("key", sorted(RULES))
def test_rule_apply_matches_the_reference(key, rowwise, dtype):
    """Sparse rows (3-D, duplicates), dense 2-D (row-wise over its rows) and 1-D
    parameters (one column: the same numbers either way)."""
    rule = RULES[key](rowwise)
    params = make_params(dtype)
    state = rule.init(params)
    assert set(state) == {f"s/{n}" for n in params}
    for n, p in params.items():
        shape = (p.shape[0], 1) if rowwise else p.shape
        assert state[f"s/{n}"].shape == shape and state[f"s/{n}"].dtype == dtype
        assert (state[f"s/{n}"] == getattr(rule, "initial_accumulator_value", 0.0)).all()
    rng = np.random.default_rng(1)
    for step in range(3):
        grads = make_grads(params, rng)
        want_p, want_s = reference(rule, params, grads, state, 2 * step)
        rule.apply(params, grads, state, staleness=2 * step)
        for n in want_p:
            close(params[n].reshape(want_p[n].shape), want_p[n], dtype)
            close(state[f"s/{n}"].reshape(want_s[n].shape), want_s[n], dtype)


def test_rowwise_on_a_1d_parameter_is_per_coordinate():
    p1, p2 = {"b": np.linspace(-1, 1, 7)}, {"b": np.linspace(-1, 1, 7)}
    a, b = AdaGrad(0.1), AdaGrad(0.1, rowwise=True)
    sa, sb = a.init(p1), b.init(p2)
    g = [Grad("b", np.arange(7.0) - 3), Grad("b", np.array([0.5, -1.0]), np.array([2, 2]))]
    a.apply(p1, g, sa)
    b.apply(p2, g, sb)
    np.testing.assert_array_equal(p1["b"], p2["b"])
    np.testing.assert_array_equal(sa["s/b"], sb["s/b"].reshape(-1))


@pytest.mark.parametrize("make, match", [
    (lambda: AdaGrad(-0.1), "lr=-0.1 must be > 0"),
    (lambda: AdaGrad(0.1, eps=-1e-10), "eps=-1e-10 must be > 0"),
    (lambda: AdaGrad(0.1, eps=0.0), "eps=0.0 must be > 0"),
    (lambda: AdaGrad(0.1, initial_accumulator_value=-1.0), "initial_accumulator_value"),
    (lambda: RMSProp(0.0), "lr=0.0 must be > 0"),
    (lambda: RMSProp(0.1, alpha=1.0), "alpha=1.0 must be < 1"),
    (lambda: RMSProp(0.1, alpha=0.0), "alpha=0.0 must be > 0"),
    (lambda: RMSProp(0.1, eps=float("nan")), "must be finite"),
])
def test_bad_hyper_parameters_are_refused(make, match):
    with pytest.raises(InvalidArgument, match=match):
        make()
    with pytest.raises(InvalidType, match="rowwise"):
        AdaGrad(0.1, rowwise="yes")


@pytest.mark.parametrize("rowwise", [False, True])
def test_a_wrong_state_is_refused_and_nothing_is_written(rowwise):
    rule = AdaGrad(0.1, rowwise=rowwise)
    params = make_params(np.float64)
    good = rule.init(params)
    other = AdaGrad(0.1, rowwise=not rowwise).init(params)
    rng = np.random.default_rng(2)
    grads = make_grads(params, rng)
    for bad_key in ("emb", "c"):              # sparse-rows and dense parameters
        state = dict(good, **{f"s/{bad_key}": other[f"s/{bad_key}"]})
        before_p, before_s = copy.deepcopy(params), copy.deepcopy(state)
        with pytest.raises((InvalidArgument, InvalidType), match=f"s/{bad_key}"):
            rule.apply(params, grads, state)
        for n in params:
            np.testing.assert_array_equal(params[n], before_p[n])
        for k in state:
            np.testing.assert_array_equal(state[k], before_s[k])
    with pytest.raises(InvalidArgument, match="no 's/w'"):
        rule.apply(params, grads, {k: v for k, v in good.items() if k != "s/w"})


def test_the_compiled_core_refuses_a_wrong_state_shape():
    from hogkit.engine.step import encode_rule
    P = np.zeros((5, 3))
    rule = RMSProp(0.1, rowwise=True)
    enc = encode_rule(rule, rule.init({"P": P}), ["P"], (P,))
    assert type(enc.cfg) is RMSPropCfg and enc.S1[0].shape == (5, 1)
    with pytest.raises(InvalidArgument, match=r"needs \(5, 1\)"):
        encode_rule(rule, {"s/P": np.zeros((5, 3))}, ["P"], (P,))
    with pytest.raises(InvalidArgument, match=r"needs \(5, 3\)"):
        encode_rule(RMSProp(0.1), {"s/P": np.zeros((5, 1))}, ["P"], (P,))


# --------------------------------------------------------------------------- compose

@pytest.mark.parametrize("pieces, expect", [
    ((adagrad(),), AdaGrad(0.1)),
    ((adagrad(1e-6, 1.0, rowwise=True),),
     AdaGrad(0.1, eps=1e-6, initial_accumulator_value=1.0, rowwise=True)),
    ((rmsprop(alpha=0.9),), RMSProp(0.1, alpha=0.9)),
    ((scale_by_staleness(), adagrad(rowwise=True)),
     AdaGrad(0.1, rowwise=True, scale_by_staleness=True)),
    ((scale_by_staleness(), rmsprop()), RMSProp(0.1, scale_by_staleness=True)),
])
def test_an_adaptive_pipeline_is_its_rule(pieces, expect):
    rule = chain(*pieces, lr=0.1)
    assert type(rule) is type(expect) and rule == expect
    assert rule.cfg() == expect.cfg() and type(rule.cfg()) is type(expect.cfg())


@pytest.mark.parametrize("pieces, match", [
    ((adagrad(), momentum(0.9)), "no momentum term"),
    ((momentum(0.9), rmsprop()), "no momentum term"),
    ((delay_compensation(), adagrad()), "delay_compensation.*without it"),
    ((gap_aware(), rmsprop()), "gap_aware.*without it"),
    ((adagrad(), scale_by_staleness()), "put scale_by_staleness\\(\\) first"),
    ((adagrad(), rmsprop()), "two adaptive scalings"),
])
def test_undefined_adaptive_pipelines_are_refused(pieces, match):
    with pytest.raises(InvalidArgument, match=match):
        chain(*pieces, lr=0.1)


# --------------------------------------------------------------------------- parse, store

def test_the_cli_names_build_the_rules():
    from hogkit.parse import parse_rule, rule_names
    assert {"adagrad", "adagrad-rowwise", "rmsprop", "rmsprop-rowwise"} <= set(rule_names())
    assert parse_rule("adagrad", lr=0.1) == AdaGrad(0.1)
    assert parse_rule("rmsprop-rowwise", lr=0.1) == RMSProp(0.1, rowwise=True)
    with pytest.raises(InvalidArgument, match="no momentum term"):
        parse_rule("adagrad", lr=0.1, momentum=0.9)
    import hogkit
    assert hogkit.AdaGrad is AdaGrad and hogkit.RMSProp is RMSProp
    assert {"AdaGrad", "RMSProp"} <= set(hogkit.__all__)


def test_the_cli_simulates_with_an_adaptive_rule(tmp_path, capsys):
    import json
    from hogkit.cli import main
    assert main(["sim", "--workload", "logreg", "--workers", "4", "--steps", "200",
                 "--rule", "adagrad-rowwise", "--lr", "0.1", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert "AdaGrad" in json.dumps(s["config"]) and s["final_loss"] < s["initial_loss"]
    assert main(["sim", "--rule", "rmsprop", "--momentum", "0.9", "--steps", "10",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "no momentum term" in capsys.readouterr().err


def test_the_worker_state_store_keeps_a_rowwise_accumulator():
    from hogkit.state import worker_state
    params = {"P": np.zeros((7, 4), np.float32)}
    arrays = worker_state.initial(AdaGrad(0.1, initial_accumulator_value=1.0, rowwise=True),
                                  None, params, 2)
    assert arrays["1/rule/s/P"].shape == (7, 1) and (arrays["1/rule/s/P"] == 1).all()
    views = {k: np.zeros_like(v) for k, v in arrays.items()}
    assert "0/rule/s/P" in worker_state.load_into(views, arrays)
    stale = {"0/rule/s/P": np.zeros((7, 4), np.float32)}     # per-coordinate: starts fresh
    assert worker_state.load_into(views, stale) == []


# --------------------------------------------------------------------------- engines

def test_the_compiled_core_and_the_python_step_agree_under_density():
    from test_step import MF, run_compiled, run_python
    rule, density = AdaGrad(0.1, rowwise=True, scale_by_staleness=True), Density(0.5)
    pc, log_c, _, _ = run_compiled(MF, rule, density, 40, 16)
    pp, log_p = run_python(MF, rule, density, 40, 16)
    for name in pc:
        np.testing.assert_array_equal(pc[name], pp[name])
    np.testing.assert_array_equal(log_c.count, log_p.count)


@pytest.mark.parametrize("rule", [AdaGrad(0.1, rowwise=True, scale_by_staleness=True),
                                  RMSProp(0.01)], ids=["adagrad-rowwise-stale", "rmsprop"])
def test_both_simulator_engines_run_the_rule_identically(rule):
    from hogkit import workloads
    from hogkit.engine.simulator import simulate, strip_wall
    from hogkit.policy import SSP
    wl = workloads.get("mf", preset="hot")
    kw = dict(workers=4, steps=300, batch=8, rule=rule, policy=SSP(2), seed=3)
    fused, python = simulate(wl, engine="compiled", **kw), simulate(wl, engine="python",
                                                                    **kw)
    assert fused.extra["engine"] == "compiled" and python.extra["engine"] == "python"
    assert fused.checksum() == python.checksum()
    a, b = strip_wall(fused.summary()), strip_wall(python.summary())
    a.pop("engine"), b.pop("engine")
    assert a == b and fused.staleness["update_gap"]["max"] > 0


@pytest.mark.process
def test_a_live_rowwise_adagrad_run_lowers_the_loss(tmp_path):
    from hogkit import train
    run = train(hogkit.workload("mf", preset="hot"), workers=2,
                outputs=hogkit.Outputs(tmp_path, progress=False), steps=3000,
                rule=AdaGrad(0.1, rowwise=True), seed=1)
    assert run.updates == 3000
    assert run.final_loss < 0.7 * run.initial_loss
    assert all(np.isfinite(v).all() for v in run.params.values())


# --------------------------------------------------------------------------- optim

def _fit(make, dtype, sparse=False, steps=15):
    import torch
    dtype = getattr(torch, dtype)
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4, sparse=sparse).to(dtype)
    lin = torch.nn.Linear(4, 1).to(dtype)
    params = list(emb.parameters()) + list(lin.parameters())
    opt = make(params)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        idx = torch.randint(0, 10, (6,), generator=gen)
        y = torch.randn(6, 1, generator=gen, dtype=dtype)
        opt.zero_grad()
        ((lin(emb(idx)) - y) ** 2).mean().backward()
        opt.step()
    return params, opt


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name, kw", [
    ("Adagrad", dict(lr=0.1)),
    ("Adagrad", dict(lr=0.1, initial_accumulator_value=0.5, eps=1e-6)),
    ("RMSprop", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, alpha=0.9, eps=1e-6)),
])
def test_optim_matches_torch(name, kw, dtype):
    """Same model, same data, the torch optimizer and hogkit's: parameters and the
    accumulator agree to rtol = atol = 1e-5 (float32) / 1e-12 (float64), i.e. within a
    few ulps (measured: 1 ulp)."""
    torch = pytest.importorskip("torch")
    import hogkit.optim
    tol = 1e-5 if dtype == "float32" else 1e-12
    pt, ot = _fit(lambda p: getattr(torch.optim, name)(p, **kw), dtype)
    ph, oh = _fit(lambda p: getattr(hogkit.optim, name)(p, **kw), dtype)
    slot = {"Adagrad": "sum", "RMSprop": "square_avg"}[name]
    for a, b in zip(pt, ph):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=tol, atol=tol)
        torch.testing.assert_close(oh.state[b][slot], ot.state[a][slot], rtol=tol, atol=tol)


def test_optim_sparse_rowwise_and_refusals():
    torch = pytest.importorskip("torch")
    import hogkit.optim
    pt, _ = _fit(lambda p: torch.optim.Adagrad(p, lr=0.1), "float64", sparse=True)
    ph, _ = _fit(lambda p: hogkit.optim.Adagrad(p, lr=0.1), "float64", sparse=True)
    for a, b in zip(pt, ph):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=1e-12, atol=1e-12)
    ph, oh = _fit(lambda p: hogkit.optim.RMSprop(p, lr=0.01, rowwise=True), "float64",
                  sparse=True)
    assert oh.state[ph[0]]["square_avg"].shape == (10, 1)
    with pytest.raises(InvalidArgument, match="momentum"):
        hogkit.optim.RMSprop(ph, lr=0.01, momentum=0.9)
    with pytest.raises(InvalidArgument, match="weight_decay"):
        hogkit.optim.Adagrad(ph, lr=0.01, weight_decay=1e-4)
    with pytest.raises(InvalidArgument, match="alpha"):
        hogkit.optim.RMSprop(ph, lr=0.01, alpha=1.5)
