"""hogkit.parse: one parser per knob, the same for the command line, a sweep and Python."""

from __future__ import annotations

import pytest

from hogkit import BSP, DSSP, SSP, Async, BoundedDelay, LocalSGD
from hogkit.engine.delays import Constant, LogNormal, Slowdown
from hogkit.errors import InvalidArgument, InvalidType
from hogkit.parse import (parse_batch, parse_delays, parse_density, parse_policy,
                          parse_rule, parse_schedule, parse_stragglers, rule_names)
from hogkit.rules.density import Density


def test_every_string_form_has_one_parser_shared_by_cli_and_sweep():
    """The command line and the sweep call the parse room's functions, not copies
    (stragglers and delays as strings are read by the Workers they both build)."""
    from hogkit import cli, sweeps
    from hogkit.engine import settings
    for name in ("parse_policy", "parse_batch", "parse_density", "parse_rule"):
        assert getattr(cli, name) is getattr(sweeps, name), name
    assert settings.parse_stragglers is parse_stragglers
    assert settings.parse_delays is parse_delays
    import hogkit.engine.delays
    import hogkit.p3.propagation
    assert parse_delays is hogkit.engine.delays.parse_delays
    assert parse_schedule is hogkit.p3.propagation.parse_schedule


@pytest.mark.parametrize("text, expect", [
    ("async", Async()), ("BSP", BSP()), ("ssp:3", SSP(3)), ("dssp:1:4", DSSP(1, 4)),
    ("local:8", LocalSGD(8)), ("local:8:overlap", LocalSGD(8, overlap=True)),
    ("delay:8", BoundedDelay(8)),
])
def test_policies(text, expect):
    """Every registered policy's spelling: the parse room delegates to the policies'
    own registry (hogkit.policy.from_string), so a new policy needs no edit here."""
    assert parse_policy(text) == expect


@pytest.mark.parametrize("text, match", [
    ("nonsense", "unknown policy"), ("ssp", "argument"), ("ssp:x", "not an int"),
    ("local:4:sideways", "overlap"),
])
def test_policy_errors_name_the_forms(text, match):
    with pytest.raises(InvalidArgument, match=match) as e:
        parse_policy(text)
    assert "dssp:LO:HI" in str(e.value)


def test_dc_asgd_takes_its_compensation_strength():
    """``dc-asgd:LAMBDA`` / ``dc-asgd-adaptive:LAMBDA0`` (a sweep over lambda); a value
    that is not a number, or a negative one, is refused with the form to write."""
    r = parse_rule("dc-asgd:0.2", lr=0.1)
    assert (r.lam, r.adaptive, r.lr) == (0.2, False, 0.1)
    assert parse_rule("dc-asgd-adaptive:1", lr=0.1).lam0 == 1.0
    assert parse_rule("dc-asgd", lr=0.1).lam == 0.04          # the paper's default
    with pytest.raises(InvalidArgument, match="dc-asgd:LAMBDA"):
        parse_rule("dc-asgd:strong", lr=0.1)
    with pytest.raises(InvalidArgument, match="lam"):
        parse_rule("dc-asgd:-1", lr=0.1)


def test_rules_take_the_workload_default_lr():
    from hogkit import workloads
    wl = workloads.get("mf", preset="hot")
    for name in rule_names():
        rule = parse_rule(name, workload=wl)
        assert rule.lr == wl.default_lr
    assert parse_rule("sgd", lr=0.5, momentum=0.9).momentum == 0.9
    with pytest.raises(InvalidArgument, match="dc-asgd has no momentum.*gap-aware"):
        parse_rule("dc-asgd", lr=0.1, momentum=0.9)
    with pytest.raises(InvalidArgument, match="unknown rule.*adam"):
        parse_rule("nadam", lr=0.1)
    with pytest.raises(InvalidArgument, match="lr="):
        parse_rule("sgd")


@pytest.mark.parametrize("spec, expect", [
    (0.5, Density(0.5)), ("0.5", Density(0.5)), ("topk:0.5", Density(0.5)),
    ("random:0.25", Density(0.25, how="random")),
    ("random:0.25:dropped", Density(0.25, how="random", residual=False)),
    ("every:4", Density(1.0, every=4)), (1, None), ("1.0", None),
    ("1.0:dropped", Density(1.0, residual=False)),
])
def test_densities(spec, expect):
    assert parse_density(spec) == expect


def test_density_errors():
    for bad in ("half", "topk", "every:x", "sparse:0.5"):
        with pytest.raises(InvalidArgument, match="topk:F"):
            parse_density(bad)
    with pytest.raises(InvalidType, match="density"):
        parse_density([0.5])


def test_a_batch_of_digits_is_per_worker_the_rest_global():
    assert parse_batch("16") == 16
    assert parse_batch("fixed", per_worker=16, workers=4).config()["global_batch"] == 64
    with pytest.raises(InvalidArgument, match="an int"):
        parse_batch("sixteen")


def test_stragglers_from_one_string_a_list_or_a_dict():
    assert parse_stragglers("1:3") == {1: Slowdown(3.0)}
    assert parse_stragglers(["0:2", "1:3"]) == {0: Slowdown(2.0), 1: Slowdown(3.0)}
    mapping = {2: Slowdown(4.0)}
    assert parse_stragglers(mapping) is mapping
    assert parse_stragglers([]) == {}


def test_delays_and_schedules_are_gathered_here():
    assert parse_delays("constant:2e-3").base == Constant(2e-3)
    assert parse_delays("lognormal:1e-3:0.5").base == LogNormal(1e-3, 0.5)
    assert parse_schedule("p3:4096").spec == "p3:4096"
