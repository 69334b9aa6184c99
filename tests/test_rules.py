"""hogkit.rules.core against the references in tests/naive.py: one conformance test over a
table of every rule, the degenerate cases (SA with tau=0, DC and Gap-Aware with a
fresh read are SGD), shared vs private state, and bad inputs that must raise and
leave parameters and state untouched."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
from hypothesis import given, strategies as st

import naive
from hogkit.errors import InvalidArgument, InvalidType
from hogkit.rules.grads import Grad
from hogkit.rules.adam import Adam
from hogkit.rules.core import SGD, DelayCompensated, GapAware, StalenessAware
from hogkit.validation import grads_finite

RULES = {
    "sgd": lambda: SGD(0.1),
    "sgd-momentum": lambda: SGD(0.1, momentum=0.9),
    "sa": lambda: StalenessAware(0.1),
    "sa-momentum": lambda: StalenessAware(0.1, momentum=0.9),
    "dc": lambda: DelayCompensated(0.1, lam=0.5),
    "dc-adaptive": lambda: DelayCompensated(0.1, adaptive=True),
    "ga": lambda: GapAware(0.1),
    "ga-momentum": lambda: GapAware(0.1, momentum=0.9),
    "adam": lambda: Adam(0.05, betas=(0.8, 0.99)),
}
SLOTS = {"sgd": set(), "sgd-momentum": {"m"}, "sa": set(), "sa-momentum": {"m"},
         "dc": set(), "dc-adaptive": {"ms"}, "ga": {"v", "k"}, "ga-momentum": {"v", "k", "m"},
         "adam": {"m", "v", "k"}}


def make_params(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return {"emb": rng.normal(size=(6, 2, 3)).astype(dtype),     # ndim 3, sparse rows
            "w": rng.normal(size=(4, 5)).astype(dtype),           # dense 2-D
            "b": rng.normal(size=5).astype(dtype),                # 1-D, sparse rows
            "c": rng.normal(size=5).astype(dtype)}                # 1-D, dense


def make_grads(params, rng, *, fresh=False, rows=(1, 4, 1, 0)):
    rows = np.asarray(rows, np.int64)
    out = []
    for name, (r, shape) in {"emb": (rows, (len(rows), 2, 3)), "w": (None, (4, 5)),
                             "b": (np.array([3, 3], np.int64), (2,))}.items():
        p = params[name]
        g = rng.normal(size=shape).astype(p.dtype)
        base = p if r is None else p[r]
        noise = rng.normal(size=shape)           # drawn either way: same g sequence
        read = base.copy() if fresh else (base + noise).astype(p.dtype)
        out.append(Grad(name, g, r, read))
    out.append(Grad("c", rng.normal(size=5).astype(params["c"].dtype),
                    read=params["c"].copy()))
    return out


def close(actual, expected, dtype):
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for k in expected:
        np.testing.assert_allclose(np.asarray(actual[k], np.float64), expected[k],
                                   rtol=tol, atol=tol, err_msg=k)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("key", sorted(RULES))
def test_rule_matches_reference(key, dtype):
    rule = RULES[key]()
    params = make_params(dtype)
    state = rule.init(params)
    assert {k.split("/")[0] for k in state} == SLOTS[key]
    assert all(isinstance(v, np.ndarray) for v in state.values())
    rng = np.random.default_rng(1)
    for step in range(3):
        grads = make_grads(params, rng)
        want_p, want_s = naive.apply_rule(rule, params, grads, state, staleness=step * 2)
        rule.apply(params, grads, state, staleness=step * 2, rank=0)
        close(params, want_p, dtype)
        close(state, want_s, dtype)
        assert all(p.dtype == dtype for p in params.values())


@given(st.integers(0, 2**31), st.sampled_from(sorted(RULES)), st.integers(0, 7))
def test_rules_on_random_batches(seed, key, tau):
    rule = RULES[key]()
    params = make_params(np.float64, seed)
    state = rule.init(params)
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 6, size=rng.integers(0, 7))
    grads = make_grads(params, rng, rows=rows)
    want_p, want_s = naive.apply_rule(rule, params, grads, state, staleness=tau)
    rule.apply(params, grads, state, staleness=tau)
    close(params, want_p, np.float64)
    close(state, want_s, np.float64)


def run(rule, dtype, *, fresh, staleness=0, steps=3):
    params = make_params(dtype)
    state = rule.init(params)
    rng = np.random.default_rng(7)
    for _ in range(steps):
        rule.apply(params, make_grads(params, rng, fresh=fresh), state, staleness=staleness)
    return params


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mu", [0.0, 0.9])
def test_degenerate_cases_are_sgd_exactly(dtype, mu):
    sgd = run(SGD(0.1, momentum=mu), dtype, fresh=True)
    for tau in (0, 1):
        same = run(StalenessAware(0.1, momentum=mu), dtype, fresh=False, staleness=tau)
        for k in sgd:
            np.testing.assert_array_equal(same[k], sgd[k])
    same = run(GapAware(0.1, momentum=mu), dtype, fresh=True)
    for k in sgd:
        np.testing.assert_array_equal(same[k], sgd[k])
    if mu == 0.0:
        for dc in (DelayCompensated(0.1, lam=3.0), DelayCompensated(0.1, adaptive=True)):
            same = run(dc, dtype, fresh=True)
            for k in sgd:
                np.testing.assert_array_equal(same[k], sgd[k])


def test_staleness_divides_the_learning_rate():
    a = run(StalenessAware(0.4), np.float64, fresh=False, staleness=4)
    b = run(SGD(0.1), np.float64, fresh=False)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-15)


def test_stale_reads_change_dc_and_ga():
    for rule in (DelayCompensated(0.1, lam=1.0), GapAware(0.1)):
        stale = run(rule, np.float64, fresh=False)
        sgd = run(SGD(0.1), np.float64, fresh=False)
        assert not np.allclose(stale["w"], sgd["w"])


def test_apply_leaves_the_read_copies_as_they_were():
    """The row kernels turn the step core's read buffer into gaps in place
    (``kernels.delayed.gaps_into``); ``rule.apply`` hands them a copy, so a user's
    ``Grad.read`` survives the call, and applying the same stale gradient through
    the rule's row kernel (``kernels.rule``) on a buffer gives the same parameters bit
    for bit."""
    from hogkit.kernels import rule as kr
    rng = np.random.default_rng(7)
    for rule, d in itertools.product((DelayCompensated(0.1, lam=1.0),
                                      DelayCompensated(0.1, adaptive=True), GapAware(0.1),
                                      GapAware(0.1, momentum=0.9)), (5, 1)):
        W = rng.normal(size=(6, d))          # d = 1: logreg's weights' own loops
        rows = np.array([4, 1, 4, 0], np.int64)
        g = rng.normal(size=(4, d))
        read = W[rows] + rng.normal(size=(4, d)) * (rng.random((4, 1)) < 0.5)
        kept = read.copy()
        params, state = {"w": W.copy()}, None
        state = rule.init(params)
        rule.apply(params, [Grad("w", g, rows, read)], state, staleness=2)
        np.testing.assert_array_equal(read, kept)
        buf, direct = read.copy(), W.copy()
        s0 = rule.init({"w": direct})
        s1, s2 = (s0[f"{n}/w"] if n else np.empty((0, d))
                  for n in (rule.state.first, rule.state.second))
        k = s0.get("k/w", np.zeros(1, np.int64))
        kr.rows_now(rule.cfg(), direct, s1, s2, k, 0, rows, g, buf, -1, 2, False, -1)
        assert not np.array_equal(buf, kept)           # consumed: now the gaps
        np.testing.assert_array_equal(direct, params["w"])


def test_shared_state_vs_private_state():
    """Private (default): each worker has its own buffer. Shared: the same arrays in
    both workers' state dicts behave like one worker applying both updates."""
    rule = SGD(0.1, momentum=0.9)
    rng = np.random.default_rng(3)
    params0 = make_params(np.float64)
    g1, g2 = make_grads(params0, rng), make_grads(params0, rng)

    one = copy.deepcopy(params0)
    s = rule.init(one)
    rule.apply(one, g1, s, rank=0)
    rule.apply(one, g2, s, rank=0)

    shared = copy.deepcopy(params0)
    buf = rule.init(shared)
    s0, s1 = dict(buf), dict(buf)            # two workers, the same arrays
    rule.apply(shared, g1, s0, rank=0)
    rule.apply(shared, g2, s1, rank=1)

    private = copy.deepcopy(params0)
    p0, p1 = rule.init(private), rule.init(private)
    rule.apply(private, g1, p0, rank=0)
    rule.apply(private, g2, p1, rank=1)

    for k in one:
        np.testing.assert_array_equal(shared[k], one[k])
    assert not np.allclose(private["w"], one["w"])


def test_needs_read():
    assert not SGD(0.1).needs_read and not StalenessAware(0.1).needs_read
    assert DelayCompensated(0.1).needs_read and GapAware(0.1).needs_read


def test_gap_aware_counts_steps():
    rule = GapAware(0.1)
    params = make_params(np.float32)
    state = rule.init(params)
    rng = np.random.default_rng(0)
    for _ in range(3):
        rule.apply(params, make_grads(params, rng), state)
    assert state["k/w"][0] == 3 and state["k/b"][0] == 3
    rule.apply(params, make_grads(params, rng)[:1] * 2, state)  # twice in one call
    assert state["k/emb"][0] == 5 and state["k/w"][0] == 3
    assert GapAware(0.1).lr_max == 0.1 and GapAware(0.1, lr_max=0.5).lr_max == 0.5


# --- bad input -----------------------------------------------------------------------

def _bad_cases(params):
    p = params
    f32 = np.float32
    ok_rows = np.array([0, 1], np.int64)
    emb_vals = np.ones((2, 2, 3), f32)
    return {
        "values dtype": ([Grad("w", np.ones((4, 5), np.float64), read=p["w"])], InvalidType),
        "values shape": ([Grad("w", np.ones((5, 4), f32), read=p["w"])], InvalidArgument),
        "rows shape": ([Grad("emb", np.ones((3, 2, 3), f32), ok_rows, emb_vals)],
                       InvalidArgument),
        "row too large": ([Grad("emb", emb_vals, np.array([0, 6]), emb_vals)],
                          InvalidArgument),
        "negative row": ([Grad("emb", emb_vals, np.array([-1, 0]), emb_vals)],
                         InvalidArgument),
        "float rows": ([Grad("emb", emb_vals, np.array([0.0, 1.0]), emb_vals)], InvalidType),
        "2-d rows": ([Grad("emb", emb_vals, np.array([[0, 1]]), emb_vals)], InvalidArgument),
        "unknown name": ([Grad("nope", np.ones(3, f32))], InvalidArgument),
        "not a Grad": ([("w", np.ones((4, 5), f32))], InvalidType),
        "single Grad": (Grad("w", np.ones((4, 5), f32), read=p["w"]), InvalidType),
        "non-contiguous": ([Grad("w", np.ones((5, 4), f32).T, read=p["w"])], InvalidArgument),
        "read shape": ([Grad("w", np.ones((4, 5), f32), read=np.ones(20, f32))],
                       InvalidArgument),
        # a good grad first: nothing may be written before the bad one is found
        "late bad grad": ([Grad("c", np.ones(5, f32), read=p["c"].copy()),
                           Grad("w", np.ones((4, 5), np.float64), read=p["w"])],
                          InvalidType),
    }


@pytest.mark.parametrize("key", sorted(RULES))
def test_bad_input_raises_and_changes_nothing(key):
    rule = RULES[key]()
    params = make_params(np.float32)
    state = rule.init(params)
    # touch the state once so "unchanged" is not trivially zeros
    rng = np.random.default_rng(0)
    rule.apply(params, make_grads(params, rng), state)
    before_p, before_s = copy.deepcopy(params), copy.deepcopy(state)
    for what, (grads, err) in _bad_cases(params).items():
        if what == "read shape" and not rule.needs_read:
            continue                           # read is not used, so not checked
        with pytest.raises(err, match=".") as info:
            rule.apply(params, grads, state)
        assert info.type is err, what
        for k in params:
            np.testing.assert_array_equal(params[k], before_p[k], err_msg=what)
        for k in state:
            np.testing.assert_array_equal(state[k], before_s[k], err_msg=what)
    good = [Grad("w", np.ones((4, 5), np.float32), read=params["w"].copy())]
    with pytest.raises(InvalidArgument, match="staleness"):
        rule.apply(params, good, state, staleness=-1)
    with pytest.raises(InvalidType):
        rule.apply(params, good, state, staleness=1.5)
    if state:
        with pytest.raises(InvalidArgument, match="rule.init"):
            rule.apply(params, good, {})
        bad_state = {k: v[..., :1].copy() if v.ndim > 1 else v for k, v in state.items()}
        if any(v.shape != state[k].shape for k, v in bad_state.items()):
            with pytest.raises(InvalidArgument):
                rule.apply(params, good, bad_state)
    if rule.needs_read:
        with pytest.raises(InvalidArgument, match="keep_read=True"):
            rule.apply(params, [Grad("w", np.ones((4, 5), np.float32))], state)
    for k in params:
        np.testing.assert_array_equal(params[k], before_p[k])


def test_read_only_and_integer_params_are_refused():
    params = make_params(np.float32)
    params["w"].flags.writeable = False
    with pytest.raises(InvalidArgument, match="read-only"):
        SGD(0.1).apply(params, [Grad("w", np.ones((4, 5), np.float32))], {})
    with pytest.raises(InvalidType):
        SGD(0.1).apply({"i": np.zeros(3, np.int64)}, [Grad("i", np.zeros(3, np.int64))], {})
    with pytest.raises(InvalidArgument, match="ndim"):
        SGD(0.1).apply({"s": np.zeros((), np.float32)},
                       [Grad("s", np.zeros((), np.float32))], {})


def test_int32_rows_are_accepted():
    params = {"e": np.zeros((3, 2), np.float32)}
    SGD(1.0).apply(params, [Grad("e", np.ones((2, 2), np.float32),
                                 np.array([2, 2], np.int32))], {})
    np.testing.assert_array_equal(params["e"], [[0, 0], [0, 0], [-2, -2]])


@pytest.mark.parametrize("make, err", [
    (lambda: SGD(0.0), InvalidArgument), (lambda: SGD(-1.0), InvalidArgument),
    (lambda: SGD(float("nan")), InvalidArgument), (lambda: SGD("0.1"), InvalidType),
    (lambda: SGD(0.1, momentum=1.0), InvalidArgument),
    (lambda: StalenessAware(0.0), InvalidArgument),
    (lambda: DelayCompensated(0.1, lam=-1.0), InvalidArgument),
    (lambda: DelayCompensated(0.1, adaptive="yes"), InvalidType),
    (lambda: DelayCompensated(0.1, eps=0.0), InvalidArgument),
    (lambda: GapAware(0.1, gamma=1.0), InvalidArgument),
    (lambda: GapAware(0.1, lr_max=0.0), InvalidArgument),
])
def test_bad_hyper_parameters(make, err):
    with pytest.raises(err):
        make()


def test_error_messages_name_value_and_fix():
    with pytest.raises(InvalidArgument) as e:
        SGD(-0.5)
    assert "lr=-0.5" in str(e.value) and "> 0" in str(e.value) and "positive" in str(e.value)
    with pytest.raises(InvalidArgument) as e:
        SGD(0.1).apply({"e": np.zeros((3, 2))}, [Grad("e", np.ones((1, 2)), np.array([3]))], {})
    assert "3" in str(e.value) and "[0, 3)" in str(e.value)


# --- the guard ----------------------------------------------------------------

def test_grads_finite():
    g = [Grad("a", np.ones((3, 4), np.float32)), Grad("b", np.ones(5), np.arange(5))]
    assert grads_finite(g) and grads_finite([])
    for bad in (np.nan, np.inf, -np.inf):
        h = copy.deepcopy(g)
        h[1].values[3] = bad
        assert not grads_finite(h)
    t = [Grad("c", np.ones((4, 3)).T.copy()), Grad("d", np.ones((4, 3)).T)]  # strided
    assert grads_finite(t)
    t[1].values[0, 0] = np.nan                 # the transposed (non-contiguous) one
    assert not grads_finite(t)
