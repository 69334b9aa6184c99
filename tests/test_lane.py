"""The per-sample lane: each sample's update applied at once, on the compiled step core.

Checked against plain-numpy per-sample loops over the same samples in the same order
(one worker): the workloads' own lane kernels (mf, logreg) and the generic lane (any
rule, through the workload's gradient one sample at a time). Then what the lane keeps
of a step: one clock tick and one staleness event per step of ``batch`` samples, the
guard (nothing non-finite written), and the knobs it refuses, before anything runs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hogkit
from hogkit import workloads
from hogkit.engine.plan import make_plan
from hogkit.engine.step import CompiledStep, lane_support, resolve_lane
from hogkit.errors import InvalidArgument
from hogkit.kernels import layout as KL
from hogkit.rules.core import (SGD, AdaGrad, DelayCompensated, GapAware, RMSProp,
                               StalenessAware)
from hogkit.rules.density import Density
from tests.test_step import _control

MF = workloads.get("mf", preset="hot", order="sweep")


def _run(wl, rule, steps, batch, *, seed=0, lane="sample", nonfinite="raise", params=None,
         data=None, scale=1.0):
    """``steps`` steps of one worker on the compiled core; returns the parameters, the
    sample ids it drew (in order), the control views and the step object."""
    if params is None:
        params, data = wl.build(seed)
    views, clocks, log = _control()
    ctx = wl.setup(params, data, rank=0, seed=seed)
    start = int(ctx.cursor[0])
    core = CompiledStep(ctx, rank=0, batch=batch, rule=rule, rule_state=rule.init(params),
                        density=None, density_state=None, slots=clocks.slots,
                        rt=views["rt"], stop=clocks.stop, log=log.arrays(),
                        rng=np.random.default_rng([seed, 0]), quota=steps,
                        nonfinite=nonfinite, lane=lane, lane_lr_scale=scale)
    code = core.run(steps)
    n = len(data["r"] if "r" in data else data["y"])
    order = (start + np.arange(steps * batch)) % n        # the sweep: the stored order
    return params, order, views, clocks, log, core, code


def _mf_reference(params, data, order, lr, reg=0.0, momentum=0.0):
    """Per-rating SGD in numpy, float64 arithmetic, in ``order``."""
    P = params["P"].astype(np.float64)
    Q = params["Q"].astype(np.float64)
    mP, mQ = np.zeros_like(P), np.zeros_like(Q)
    for t in order:
        u, i = data["u"][t], data["i"][t]
        e = P[u] @ Q[i] - float(data["r"][t])
        gp, gq = e * Q[i] + reg * P[u], e * P[u] + reg * Q[i]
        if momentum:
            mP[u] = momentum * mP[u] + gp
            mQ[i] = momentum * mQ[i] + gq
            gp, gq = mP[u], mQ[i]
        P[u] -= lr * gp
        Q[i] -= lr * gq
    return P, Q


# float32 throughout: the step core is compiled per parameter dtype (~40 s a type, cold),
# and the other step tests compile these types already; the references are float64.
TOL = dict(rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("reg", [0.0, 0.02])
def test_mf_fused_lane_matches_per_rating_numpy(reg):
    """SGD in mf's lane kernel, with and without the L2 term (the kernel has a loop
    for each), against a per-rating numpy loop."""
    wl = workloads.get("mf", preset="hot", reg=reg, order="sweep")
    p0, data = wl.build(3)
    params = {k: v.copy() for k, v in p0.items()}
    out, order, views, clocks, log, core, code = _run(wl, SGD(0.05), 40, 32, params=params,
                                                      data=data)
    assert core.lane == "sample-fused" and code in (KL.CHUNK, KL.QUOTA_DONE)
    P, Q = _mf_reference(p0, data, order, 0.05, reg=reg)
    np.testing.assert_allclose(out["P"], P, **TOL)
    np.testing.assert_allclose(out["Q"], Q, **TOL)


def test_mf_generic_lane_with_momentum_matches_numpy():
    """SGD with momentum has no fused lane: the generic lane runs the workload's
    gradient one rating at a time through the rule (lazy momentum per row)."""
    wl = MF
    p0, data = wl.build(1)
    params = {k: v.copy() for k, v in p0.items()}
    out, order, *_, core, code = _run(wl, SGD(0.02, momentum=0.5), 30, 16, params=params,
                                      data=data)
    assert core.lane == "sample"
    P, Q = _mf_reference(p0, data, order, 0.02, momentum=0.5)
    np.testing.assert_allclose(out["P"], P, **TOL)
    np.testing.assert_allclose(out["Q"], Q, **TOL)


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 40), steps=st.integers(1, 12), seed=st.integers(0, 5))
def test_fused_and_generic_lane_agree(batch, steps, seed):
    """The workload's lane kernel and the generic lane apply the same per-sample SGD
    (up to FMA rounding) for any batch and start."""
    fused = _run(MF, SGD(0.05), steps, batch, seed=seed)
    # a DC-ASGD rule with lam = 0 is SGD's arithmetic through the generic lane
    generic = _run(MF, DelayCompensated(0.05, lam=0.0), steps, batch, seed=seed)
    assert fused[5].lane == "sample-fused" and generic[5].lane == "sample"
    for k in ("P", "Q"):
        np.testing.assert_allclose(fused[0][k], generic[0][k], **TOL)


def _adaptive_reference(params, data, order, lr, decay, fresh, eps, rowwise, s0=0.0,
                        reg=0.0):
    """Per-rating AdaGrad (decay = fresh = 1) / RMSProp in numpy (float64), row-wise
    (the mean of g*g feeds one accumulator per row) or per coordinate."""
    P = params["P"].astype(np.float64)
    Q = params["Q"].astype(np.float64)
    shape = (lambda W: (len(W), 1)) if rowwise else (lambda W: W.shape)
    SP, SQ = np.full(shape(P), float(s0)), np.full(shape(Q), float(s0))
    for t in order:
        u, i = data["u"][t], data["i"][t]
        e = P[u] @ Q[i] - float(data["r"][t])
        gp, gq = e * Q[i] + reg * P[u], e * P[u] + reg * Q[i]
        for W, S, row, g in ((P, SP, u, gp), (Q, SQ, i, gq)):
            S[row] = S[row] * decay + fresh * ((g * g).mean() if rowwise else g * g)
            W[row] -= lr * g / (np.sqrt(S[row]) + eps)
    return P, Q


@pytest.mark.parametrize("rule, decay, fresh", [
    (AdaGrad(0.1, rowwise=True, initial_accumulator_value=1.0), 1.0, 1.0),
    (AdaGrad(0.1), 1.0, 1.0),
    (RMSProp(0.01, alpha=0.9, rowwise=True), 0.9, 0.1),
    (RMSProp(0.01, alpha=0.9), 0.9, 0.1),
], ids=["adagrad-rowwise", "adagrad", "rmsprop-rowwise", "rmsprop"])
def test_mf_fused_adaptive_lane_matches_numpy(rule, decay, fresh):
    """AdaGrad and RMSProp fused into mf's lane kernel (LIBMF's per-row step with
    rowwise=True) against a per-rating numpy loop."""
    p0, data = MF.build(2)
    params = {k: v.copy() for k, v in p0.items()}
    out, order, *_, core, code = _run(MF, rule, 30, 16, params=params, data=data)
    assert core.lane == "sample-fused"
    P, Q = _adaptive_reference(p0, data, order, rule.lr, decay, fresh, rule.eps,
                               rule.rowwise, getattr(rule, "initial_accumulator_value", 0))
    np.testing.assert_allclose(out["P"], P, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(out["Q"], Q, rtol=1e-3, atol=1e-4)


def _lane_kernel(wl, p0, data, ids, rule, prefetch):
    """mf's lane kernel for ``rule`` (``kernels.mf``) called straight on the ratings
    ``ids`` (any ids, in order), with the prefetch distance ``prefetch``; returns P, Q
    and the state."""
    from hogkit.kernels.mf import mf_lane_adagrad, mf_lane_sgd
    params = {k: v.copy() for k, v in p0.items()}
    arrays = wl.compiled(params, data).arrays._replace(prefetch=prefetch)
    P, Q = params["P"], params["Q"]
    if isinstance(rule, SGD):
        lane, state = mf_lane_sgd, (P[:0], Q[:0])
    else:
        lane, cols = mf_lane_adagrad, 1 if rule.rowwise else P.shape[1]
        state = tuple(np.full((len(W), cols), 1.0, W.dtype) for W in (P, Q))
    idx = np.asarray(ids, dtype=np.int64)
    left_out = lane(arrays, (P, Q), idx, len(idx), rule.cfg(), state, True)
    return P, Q, state, left_out


_IDS = st.integers(1, 60).flatmap(lambda n: st.one_of(
    st.integers(0, 300 - n).map(lambda t0: list(range(t0, t0 + n))),   # a run
    st.lists(st.integers(0, 299), min_size=n, max_size=n),             # any ids
    st.integers(0, 300 - n).map(                   # a run's ends, a gap in between
        lambda t0: [t0] + list(range(t0 + 2, t0 + n)) + [t0 + n - 1] if n >= 3 else [t0])))


@settings(max_examples=40, deadline=None)
@given(ids=_IDS, prefetch=st.sampled_from([0, 1, 7, 32]), reg=st.sampled_from([0.0, 0.05]),
       rowwise=st.booleans(), sgd=st.booleans())
def test_mf_lane_kernel_any_ids_and_prefetch(ids, prefetch, reg, rowwise, sgd):
    """mf's lane kernel on any batch of rating ids (a run of consecutive ids, read by
    position; any other list, read through the ids, including one whose ends look like
    a run's): the per-rating numpy loop's result, and the prefetch distance changes no
    bit of it."""
    wl = workloads.get("mf", preset="hot", reg=reg, order="sweep")
    p0, data = wl.build(2)
    data = {k: v[:300] for k, v in data.items()}
    rule = SGD(0.05) if sgd else AdaGrad(0.1, rowwise=rowwise, initial_accumulator_value=1.0)
    P, Q, S, left_out = _lane_kernel(wl, p0, data, ids, rule, prefetch)
    assert left_out == 0
    if sgd:
        Pr, Qr = _mf_reference(p0, data, ids, 0.05, reg=reg)
    else:
        Pr, Qr = _adaptive_reference(p0, data, ids, 0.1, 1.0, 1.0, rule.eps, rowwise, 1.0,
                                     reg=reg)
    np.testing.assert_allclose(P, Pr, **TOL)
    np.testing.assert_allclose(Q, Qr, **TOL)
    P0, Q0, S0, _ = _lane_kernel(wl, p0, data, ids, rule, 0)
    assert np.array_equal(P, P0) and np.array_equal(Q, Q0)
    assert all(np.array_equal(a, b) for a, b in zip(S, S0))


def _rowvec_span(plain, prefetching):
    """A jitted caller of one of ``kernels.rowvec``'s spans (an intrinsic is called
    from compiled code only)."""
    from numba import njit

    from hogkit.kernels import rowvec as RV
    span = {(False, False): RV.sgd_span, (True, False): RV.sgd_span_plain,
            (False, True): RV.sgd_span_pf, (True, True): RV.sgd_span_pf_plain}[
        (plain, prefetching)]

    @njit
    def call(P, Q, u, i, r, t0, m, ahead, pf_end, a, keep, lim, skip):
        return span(P, Q, u, i, r, t0, m, ahead, pf_end, a, keep, lim, skip)
    return call


_SPANS = {}


@settings(max_examples=30, deadline=None)
@given(width=st.sampled_from([(np.float32, 8), (np.float32, 24), (np.float32, 32),
                              (np.float32, 64), (np.float32, 128), (np.float64, 4),
                              (np.float64, 12), (np.float64, 64)]),
       reg=st.sampled_from([0.0, 0.05]), ahead=st.sampled_from([0, 3]),
       t0=st.integers(0, 40), m=st.integers(0, 60), seed=st.integers(0, 3))
def test_vector_span_matches_per_rating_numpy(width, reg, ahead, t0, m, seed):
    """``kernels.rowvec``'s straight-line span, for every row width it covers (whole
    32-byte vectors, float32 and float64, one to eight of them or sixteen), with and without
    the L2 term and the prefetch: the per-rating numpy loop's result, and the
    prefetch changes no bit."""
    dtype, K = width
    rng = np.random.default_rng(seed)
    n = 120
    p0 = {"P": (rng.standard_normal((30, K)) * 0.3).astype(dtype),
          "Q": (rng.standard_normal((20, K)) * 0.3).astype(dtype)}
    data = {"u": rng.integers(0, 30, n).astype(np.int32),
            "i": rng.integers(0, 20, n).astype(np.int64),
            "r": rng.standard_normal(n).astype(dtype)}
    lr = 0.05
    out = []
    for pf in (False, True):
        key = (reg == 0.0, pf)
        span = _SPANS.setdefault(key, _rowvec_span(*key))
        P, Q = p0["P"].copy(), p0["Q"].copy()
        left = span(P, Q, data["u"], data["i"], data["r"], t0, m, ahead if pf else 0,
                    n if pf else 0, dtype(lr), dtype(1.0 - lr * reg), dtype(1e18), True)
        assert left == 0
        out.append((P, Q))
    Pr, Qr = _mf_reference(p0, data, np.arange(t0, t0 + m), lr, reg=reg)
    tol = TOL if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out[0][0], Pr, **tol)
    np.testing.assert_allclose(out[0][1], Qr, **tol)
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])


def test_vector_span_guard_and_uncovered_widths():
    """The vector span's guard leaves a NaN rating out (counted; without skip it stops
    there, nothing of it written), and a width it does not cover (not a whole number of
    vectors, or a number of them not covered) returns -1 having written nothing; mf's lane then
    runs its numba loops, whose result is the numpy loop's (rank 5)."""
    from hogkit.kernels import rowvec as RV
    span = _SPANS.setdefault((True, False), _rowvec_span(True, False))
    rng = np.random.default_rng(0)
    P0, Q0 = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal(
        (4, 8)).astype(np.float32)
    u = i = np.array([0, 1, 2, 3], np.int64)
    r = np.array([0.5, np.nan, 0.1, 0.2], np.float32)
    args = (u, i, r, 0, 4, 0, 0, np.float32(0.1), np.float32(1), np.float32(1e18))
    P, Q = P0.copy(), Q0.copy()
    assert span(P, Q, *args, True) == 1
    assert np.array_equal(P[1], P0[1]) and not np.array_equal(P[3], P0[3])
    P, Q = P0.copy(), Q0.copy()
    assert span(P, Q, *args, False) == 1
    assert np.array_equal(P[1:], P0[1:]) and not np.array_equal(P[0], P0[0])
    for dtype, lanes in ((np.float32, 8), (np.float64, 4)):     # fits() is VECTORS
        got = [RV.fits(np.zeros((2, lanes * n), dtype), np.zeros((3, lanes * n), dtype))
               for n in range(1, 20)]
        assert got == [n in RV.VECTORS for n in range(1, 20)]
    for K in (5, 12, 72, 136):
        A, B = np.ones((4, K), np.float32), np.ones((4, K), np.float32)
        assert span(A, B, *args, True) == -1 and (A == 1).all() and (B == 1).all()
        assert not RV.fits(A, B)
    wl = workloads.get("mf", preset="hot", rank=5)
    p0, data = wl.build(1)
    ids = list(range(50))
    P, Q, _, left_out = _lane_kernel(wl, p0, data, ids, SGD(0.05), 0)
    Pr, Qr = _mf_reference(p0, data, ids, 0.05)
    assert left_out == 0
    np.testing.assert_allclose(P, Pr, **TOL)
    np.testing.assert_allclose(Q, Qr, **TOL)


def test_logreg_lane_steps_lr_over_batch_per_sample():
    """logreg's gradient is a batch mean: its lane steps lr/batch per sample."""
    wl = workloads.get("logreg", n_samples=300, n_features=80, min_nnz=2, max_nnz=9)
    p0, data = wl.build(0)
    params = {k: v.copy() for k, v in p0.items()}
    batch, lr = 16, 2.0
    out, order, *_, core, code = _run(wl, SGD(lr), 20, batch, params=params, data=data,
                                      scale=1.0 / batch)
    assert core.lane == "sample-fused"
    w = p0["w"].astype(np.float64).copy()
    a = lr / batch
    for s in order:
        lo, hi = data["indptr"][s], data["indptr"][s + 1]
        f, x = data["indices"][lo:hi], data["values"][lo:hi].astype(np.float64)
        m = w[f] @ x
        d = 1.0 / (1.0 + np.exp(-m)) - float(data["y"][s])
        w[f] -= a * (d * x + wl.reg * w[f])
    np.testing.assert_allclose(out["w"], w, **TOL)


def test_one_tick_and_one_event_per_step():
    steps, batch = 25, 8
    _, _, views, clocks, log, core, code = _run(MF, SGD(0.05), steps, batch)
    assert int(clocks.updates[0]) == steps == int(clocks.iterations[0])
    assert int(log.arrays()[2][0, 4]) == steps            # stats COUNT: one event a step
    assert int(views["rt"][0, KL.RT_SAMPLES]) == steps * batch


def test_guard_leaves_out_nonfinite_ratings():
    """NaN ratings: the lane leaves them out (skip) or stops (raise); the factors stay
    finite either way."""
    wl = workloads.get("mf", preset="hot", order="sweep")
    params, data = wl.build(0)
    data = dict(data, r=data["r"].copy())
    data["r"][::7] = np.nan
    p = {k: v.copy() for k, v in params.items()}
    out, order, views, *_, code = _run(wl, SGD(0.05), 10, 16, params=p, data=data,
                                       nonfinite="skip")
    bad = int(np.isnan(data["r"][order]).sum())
    assert code in (KL.CHUNK, KL.QUOTA_DONE) and bad > 0
    assert int(views["rt"][0, KL.RT_NONFINITE]) == bad
    assert all(np.isfinite(v).all() for v in out.values())
    p = {k: v.copy() for k, v in params.items()}
    out, *_, code = _run(wl, SGD(0.05), 10, 16, params=p, data=data)
    assert code == KL.NONFINITE
    assert all(np.isfinite(v).all() for v in out.values())


def test_guard_stops_a_diverging_lr():
    out, *_, views, _c, _l, _core, code = _run(MF, SGD(50.0), 200, 64, nonfinite="skip")
    assert all(np.isfinite(v).all() for v in out.values())
    assert int(views["rt"][0, KL.RT_NONFINITE]) > 0


@pytest.mark.parametrize("knobs, words", [
    (dict(density=Density(0.5)), "density"),
    (dict(rule=StalenessAware(0.05)), "StalenessAware"),
    (dict(rule=hogkit.rules.compose.chain(hogkit.rules.compose.scale_by_staleness(),
                                          hogkit.rules.compose.adagrad(), lr=0.1)),
     "scales each update by its gap"),
    (dict(shards=4), "shards=4"),
    (dict(batch=hogkit.AdaptiveBatch(128)), "adaptive"),
    (dict(engine="python"), "compiled step core"),
])
def test_sample_lane_refuses_what_it_cannot_run(knobs, words):
    args = dict(rule=SGD(0.05), density=None, batch=64, shards=1, engine="compiled")
    args.update(knobs)
    assert words in lane_support(MF, **args)
    with pytest.raises(InvalidArgument, match="lane='sample' cannot run"):
        resolve_lane("sample", MF, **args)
    assert resolve_lane("auto", MF, **args) == "batch"


def test_auto_follows_the_workload_default():
    args = dict(rule=GapAware(0.05), density=None, batch=64, shards=1, engine="compiled")
    expect = getattr(MF, "default_lane", "batch")
    assert resolve_lane("auto", MF, **args) == expect
    assert resolve_lane("batch", MF, **args) == "batch"
    with pytest.raises(InvalidArgument, match="lane"):
        resolve_lane("fast", MF, **args)


def test_simulator_refuses_the_sample_lane():
    with pytest.raises(InvalidArgument, match="the simulator models whole steps"):
        make_plan("mf", steps=10, engine=hogkit.Engine(lane="sample"), mode="sim")


def test_live_sample_lane_two_workers():
    run = hogkit.train(MF, workers=2, engine=hogkit.Engine(lane="sample"),
                       outputs=hogkit.Outputs(eval_every=None, progress=False), steps=400,
                       batch=32)
    assert run.config["lane"] == "sample"
    assert run.final_loss < run.initial_loss
    assert run.updates == 400                     # one update a step of 32 samples
    assert run.extra["samples"] == 400 * 32
    assert sum(w["updates"] for w in run.per_worker) == 400
    # the histograms count one event per update (the record stays on)
    assert run.staleness["update_gap"]["count"] == 400


def test_defaults_take_the_lane_and_its_batch():
    """mf and logreg default to the per-sample lane, mf with its 4,096-rating steps; a
    run that cannot take the lane (the Python engine) keeps the same rule on the batch
    lane, with the batch lane's minibatch, and says why; mlp has the batch lane."""
    plan = make_plan("mf")
    assert (plan.lane, plan.batch, plan.engine) == ("sample", 4096, "compiled")
    assert MF.default_sample_batch == 4096 and "lane" not in plan.chosen
    assert make_plan("mf", batch=32).batch == 32
    py = make_plan("mf", engine="python")
    assert (py.lane, py.batch, py.rule) == ("batch", MF.default_batch, plan.rule) == (
        "batch", 64, plan.rule)
    assert py.chosen["lane"] == (
        "batch: engine='python' (the per-sample lane runs on the compiled step core); "
        "mf's default lane is 'sample', with the same rule; a step of 64 samples, the "
        "batch lane's minibatch (the sample lane's: 4096)")
    given = make_plan("mf", engine="python", batch=128).chosen["lane"]
    assert given.endswith("with the same rule")
    lr = make_plan("logreg")
    assert (lr.lane, lr.batch) == ("sample", workloads.get("logreg").default_batch)
    assert make_plan("mlp", engine="python").lane == "batch"


def test_one_set_of_defaults_by_name_or_as_an_object():
    """mf's defaults (row-wise AdaGrad from 1, the block order, 4,096 ratings a step,
    the per-sample lane) are the same whether the workload is named or built; what the
    caller gave (a rule, an order, a batch, the batch lane) is kept."""
    rule = AdaGrad(MF.default_rule_lr, rowwise=True, initial_accumulator_value=1.0)
    for wl in ("mf", workloads.get("mf"), hogkit.workload("mf")):
        p = make_plan(wl)
        assert (p.rule, p.batch, p.lane) == (rule, 4096, "sample")
        assert (p.workload.order, p.workload.blocks, p.workload.preset) == (
            "blocks", 8, "default")
        assert p.chosen == {"rule": "default", "batch": "default", "steps": "default",
                            "why": MF.defaults_why}
    assert make_plan(hogkit.workload("mf", preset="hot")).workload.order == "blocks"
    kept = make_plan(hogkit.workload("mf", order="sweep"))
    assert kept.workload.order == "sweep" and kept.rule == rule
    assert make_plan("mf", rule=SGD(0.1)).rule == SGD(0.1)
    batch_lane = make_plan("mf", engine=hogkit.Engine(lane="batch"))
    assert (batch_lane.rule, batch_lane.batch, batch_lane.lane) == (rule, 64, "batch")
    assert "lane" not in batch_lane.chosen            # the caller chose the lane
    # logreg has no rule of its own: SGD at its default lr on either lane
    assert make_plan("logreg").rule == SGD(workloads.get("logreg").default_lr)


def test_train_by_name_runs_the_lane_defaults():
    run = hogkit.train(hogkit.workload("mf", preset="hot"), workers=2,
                       outputs=hogkit.Outputs(eval_every=None, progress=False), steps=200)
    cfg = run.config
    assert (cfg["lane"], cfg["batch"], cfg["rule"]["name"]) == ("sample", 4096, "AdaGrad")
    assert cfg["workload_config"]["order"] == "blocks"
    assert run.final_loss < run.initial_loss
    assert run.extra["metrics"]["block_claims"] > 0


def test_the_default_budget_keeps_the_samples():
    """Given no budget a run takes the workload's samples (mf: 15,625 steps of 4,096
    ratings), in steps of the batch it runs (the simulator's: the batch lane's 64)."""
    assert make_plan("mf").steps == MF.default_steps == 15_625
    assert make_plan("mf", batch=64).steps == 15_625 * 4096 // 64
    assert make_plan("mf", mode="sim").steps == 15_625 * 4096 // 64
    assert make_plan("mf", steps=10).steps == 10 and make_plan("mf", seconds=1.0).steps is None


def test_mf_prefetch_follows_the_tables_size_against_the_l2_cache():
    """The lane prefetches when P and Q together outgrow one core's L2 (as /sys lists
    it), not when they fit; a given distance is kept, a bad one refused up front."""
    from hogkit.procfs import cache_bytes
    from hogkit.workloads.mf import PREFETCH_AHEAD
    l2 = cache_bytes(2)
    assert l2 > 0 and cache_bytes(level=9, default=123) == 123
    wl = workloads.get("mf", preset="hot", order="sweep")
    small = {"P": np.zeros((4, 2), np.float32), "Q": np.zeros((4, 2), np.float32)}
    big = {"P": np.zeros((l2 // 4 + 1, 1), np.float32), "Q": np.zeros((1, 1), np.float32)}
    assert wl.prefetch_ahead(small) == 0
    assert wl.prefetch_ahead(big) == PREFETCH_AHEAD
    assert workloads.get("mf", preset="hot", prefetch=5).prefetch_ahead(big) == 5
    assert workloads.get("mf", preset="hot", prefetch=0).prefetch_ahead(big) == 0
    with pytest.raises(InvalidArgument, match="prefetch"):
        workloads.get("mf", preset="hot", prefetch=-1)


def test_the_rule_reaches_the_lane_loop_as_a_type():
    """A rule's configuration is a NamedTuple whose numba type names its class (so the
    lane loop compiles only the lane kernel its rule runs), importable by name
    (numba's cache pickles it); mf registers a kernel for each rule it runs."""
    import pickle

    import numba

    from hogkit.kernels import step as ks
    from hogkit.kernels.adaptive import AdaGradCfg, RMSPropCfg
    from hogkit.kernels.mf import MFArrays, mf_lane_adagrad, mf_lane_rmsprop, mf_lane_sgd
    from hogkit.kernels.sgd import SGDCfg
    cfgs = [SGD(0.1).cfg(), AdaGrad(0.1).cfg(), RMSProp(0.1).cfg()]
    assert len({numba.typeof(c) for c in cfgs}) == 3
    assert pickle.loads(pickle.dumps(type(cfgs[1]))) is type(cfgs[1])
    assert ks._LANES[MFArrays] == {SGDCfg: mf_lane_sgd, AdaGradCfg: mf_lane_adagrad,
                                   RMSPropCfg: mf_lane_rmsprop}
    assert ks.lane_rules(MFArrays) == (SGDCfg, AdaGradCfg, RMSPropCfg)
