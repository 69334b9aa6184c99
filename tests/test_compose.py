"""Rules composed from pieces: each pipeline resolves to the fused rule that computes
it (the rules themselves are checked against plain-numpy references in test_rules.py),
and a pipeline no kernel computes is refused with what to do instead."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
from hogkit.rules.compose import (Piece, chain, delay_compensation, gap_aware, momentum,
                            scale_by_staleness)
from hogkit.errors import InvalidArgument, InvalidType
from hogkit.rules.grads import Grad
from hogkit.rules.core import SGD, DelayCompensated, GapAware, StalenessAware


@pytest.mark.parametrize("pieces, expect", [
    ((), SGD(0.1)),
    ((momentum(0.9),), SGD(0.1, momentum=0.9)),
    ((scale_by_staleness(),), StalenessAware(0.1)),
    ((scale_by_staleness(), momentum(0.5)), StalenessAware(0.1, momentum=0.5)),
    ((delay_compensation(0.1),), DelayCompensated(0.1, lam=0.1)),
    ((delay_compensation(adaptive=True, lam0=1.0),),
     DelayCompensated(0.1, adaptive=True, lam0=1.0)),
    ((gap_aware(),), GapAware(0.1)),
    ((gap_aware(gamma=0.99, lr_max=0.5), momentum(0.9)),
     GapAware(0.1, momentum=0.9, gamma=0.99, lr_max=0.5)),
])
def test_a_pipeline_is_the_fused_rule_that_computes_it(pieces, expect):
    rule = chain(*pieces, lr=0.1)
    assert type(rule) is type(expect) and rule == expect
    assert rule.cfg() == expect.cfg() and type(rule.cfg()) is type(expect.cfg())


@settings(deadline=None, max_examples=25)
@given(st.integers(0, 6), st.floats(0.0, 0.95), st.integers(0, 2**32 - 1))
def test_staleness_then_momentum_is_that_pipeline(tau, mu, seed):
    """The semantics the pieces promise, against plain numpy: scale the gradient by
    the staleness first, then accumulate momentum, then step."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(8)
    ref_w, m = w.copy(), np.zeros(8)
    rule = chain(scale_by_staleness(), momentum(mu), lr=0.1)
    state = rule.init({"w": w})
    for _ in range(3):
        g = rng.standard_normal(8)
        rule.apply({"w": w}, [Grad("w", g)], state, staleness=tau)
        m = mu * m + g / max(tau, 1)            # the pieces, in order
        ref_w -= 0.1 * m
    np.testing.assert_allclose(w, ref_w, rtol=1e-12, atol=1e-12)
    if mu:
        np.testing.assert_allclose(state["m/w"], m, rtol=1e-12, atol=1e-12)


def test_a_chained_gap_aware_matches_the_reference():
    w = np.linspace(-1, 1, 6)
    read = w - 0.05
    g = np.full(6, 0.3)
    rule = chain(gap_aware(gamma=0.9), momentum(0.5), lr=0.1)
    state = rule.init({"w": w})
    ref_w, _, _ = naive.gap_aware_flat(w.copy(), np.zeros(6), np.zeros(6), g, read, 0.1,
                                       0.5, 0.9, 0.1, 1)
    rule.apply({"w": w}, [Grad("w", g, read=read)], state)
    np.testing.assert_allclose(w, ref_w, rtol=1e-12)


@pytest.mark.parametrize("pieces, exc, match", [
    ((scale_by_staleness(), gap_aware()), InvalidArgument, "two staleness corrections"),
    ((momentum(0.9), scale_by_staleness()), InvalidArgument, "put momentum\\(\\) last"),
    ((delay_compensation(), momentum(0.9)), InvalidArgument, "no momentum term"),
    ((momentum(0.9), momentum(0.5)), InvalidArgument, "momentum\\(\\) twice"),
    (("momentum",), InvalidType, "pieces from hogkit.rules.compose"),
    ((momentum(1.5),), InvalidArgument, "momentum"),           # the rule's own check
])
def test_a_pipeline_no_kernel_computes_is_refused(pieces, exc, match):
    with pytest.raises(exc, match=match):
        chain(*pieces, lr=0.1)


def test_pieces_print_as_written():
    assert repr(momentum(0.9)) == "momentum(mu=0.9)"
    assert repr(scale_by_staleness()) == "scale_by_staleness()"
    assert isinstance(gap_aware(), Piece)
