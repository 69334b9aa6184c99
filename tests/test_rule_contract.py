"""The rule contract (``hogkit.rules.base``, ``kernels/rule.py``): every registered rule
names its configuration, state, capabilities and spellings, and the registry is what
the parser, the CLI and ``hogkit.optim`` read; a configuration nothing registered is
refused before anything compiles and fails to compile with the fix."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import pytest

import hogkit
from hogkit.errors import InvalidArgument
from hogkit.kernels import rule as kr
from hogkit.parse import parse_rule, rule_names
from hogkit.rules import Rule
from hogkit.rules import base
from hogkit.rules.grads import Grad

#: a rule of every registered class, spelled by its first name
EVERY = {cls: parse_rule(cls.spell[0], lr=0.05) for cls in base.classes()}


def test_every_spelling_names_its_class_and_the_cli_lists_them():
    from hogkit import cli
    for name in rule_names():
        rule = parse_rule(name, lr=0.1)
        assert name in type(rule).spell and rule.lr == 0.1
    choices = next(a.choices for a in cli.build_parser()._subparsers._group_actions[0]
                   .choices["run"]._actions if a.dest == "rule")
    assert tuple(choices) == rule_names()
    assert {"sgd", "gap-aware", "adagrad-rowwise"} <= set(rule_names())


@pytest.mark.parametrize("cls", list(EVERY), ids=lambda c: c.__name__)
def test_a_rule_states_its_configuration_state_and_capabilities(cls):
    rule = EVERY[cls]
    c = rule.kernel_cfg()
    assert kr.registered(type(c)) and c.lr == rule.lr and "lr" in type(c)._fields
    params = {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}
    state = rule.init(params)
    slots = {k.split("/")[0] for k in state}
    spec = rule.state
    assert slots == {s for s in (spec.first, spec.second) if s} | ({"k"} if spec.counts
                                                                  else set())
    for flag in ("needs_read", "shared_state", "counts_updates", "gap_scaled",
                 "plain_sgd"):
        assert isinstance(getattr(rule, flag), bool), flag
    assert set(rule.lr_fields) <= {f.name for f in dataclasses.fields(rule)}
    assert rule.scaled(0.5).lr == rule.lr * 0.5
    # hogkit.optim has an optimizer for it, written or made from the registry
    opt = hogkit.optim.optimizer_for(cls)
    assert issubclass(opt, hogkit.optim.Optimizer) and opt.rule_class is cls
    assert getattr(hogkit.optim, opt.__name__) is opt


class _NobodysCfg(NamedTuple):
    lr: float


@dataclasses.dataclass(frozen=True)
class _Unregistered(Rule):
    lr: float = 0.1

    def cfg(self):
        return _NobodysCfg(self.lr)


def test_a_configuration_nothing_registered_is_refused_then_fails_to_compile():
    """Refused at the Python boundary (the engines' ``encode_rule`` and ``apply`` ask
    ``kernel_cfg``), and where a kernel is compiled with it anyway, the compile fails
    naming the class and the fix, never a silent fall-through to another rule."""
    rule = _Unregistered()
    with pytest.raises(InvalidArgument, match="no kernels are registered for its "
                                              "configuration _NobodysCfg"):
        rule.apply({"w": np.zeros((3, 2))}, [Grad("w", np.ones((3, 2)))], {})
    from hogkit.engine.step import encode_rule
    with pytest.raises(InvalidArgument, match="_NobodysCfg.*register"):
        encode_rule(rule, {}, ["w"], (np.zeros((3, 2)),))
    W, e = np.zeros((3, 2)), np.zeros((0, 2))
    with pytest.raises(Exception, match="no rows kernel is registered for the rule "
                                        "configuration _NobodysCfg; register"):
        kr.rows_now(_NobodysCfg(0.1), W, e, e, np.zeros(1, np.int64), 0,
                    np.array([0], np.int64), np.ones((1, 2)), e, -1, 0, False, -1)
    with pytest.raises(Exception, match="no flat kernel is registered"):
        f = np.zeros(0)
        kr.flat_now(_NobodysCfg(0.1), W.reshape(-1), f, f, np.zeros(1, np.int64), 0,
                    np.ones(6), f, 0, -1)


def test_registering_other_kernels_for_a_registered_configuration_is_refused():
    from hogkit.kernels.delayed import GapAwareCfg, gap_aware_flat_rule
    with pytest.raises(ValueError, match="already registered"):
        kr.register(GapAwareCfg, rows=gap_aware_flat_rule, flat=gap_aware_flat_rule)
    with pytest.raises(ValueError, match="'lr' field"):
        kr.register(tuple, rows=gap_aware_flat_rule, flat=gap_aware_flat_rule)
