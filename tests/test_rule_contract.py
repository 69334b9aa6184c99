"""The rule contract (``hogkit.rules.base``, ``kernels/rule.py``): every registered rule
names its configuration, state, capabilities and spellings, and the registry is what
the parser, the CLI and ``hogkit.optim`` read; a configuration nothing registered is
refused before anything compiles and fails to compile with the fix; Adam, added on the
contract alone, against torch's, with its update count shared by every worker."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import pytest
import torch

import hogkit
from hogkit.errors import InvalidArgument
from hogkit.kernels import rule as kr
from hogkit.kernels.clock import SLOT, UPD
from hogkit.kernels.step import apply_update
from hogkit.parse import parse_rule, rule_names
from hogkit.rules import Adam, Rule
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
    assert {"sgd", "gap-aware", "adagrad-rowwise", "adam"} <= set(rule_names())


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
    from hogkit.kernels.adam import AdamCfg, adam_flat_rule
    with pytest.raises(ValueError, match="already registered"):
        kr.register(AdamCfg, rows=adam_flat_rule, flat=adam_flat_rule)
    with pytest.raises(ValueError, match="'lr' field"):
        kr.register(tuple, rows=adam_flat_rule, flat=adam_flat_rule)


# --------------------------------------------------------------------------- Adam

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hogkit_optim_adam_is_torch_adam_on_one_worker(dtype):
    """The same model, data and hyper-parameters: hogkit.optim.Adam (one worker, its
    own update count) against torch.optim.Adam, 30 steps, state under torch's names."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                              torch.nn.Linear(8, 1)).to(dtype)
    twin = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 1)).to(dtype)
    twin.load_state_dict(net.state_dict())
    ours = hogkit.optim.Adam(net.parameters(), lr=0.01, betas=(0.8, 0.99), eps=1e-6)
    theirs = torch.optim.Adam(twin.parameters(), lr=0.01, betas=(0.8, 0.99), eps=1e-6)
    x = torch.randn(64, 6, dtype=dtype)
    y = x[:, :1] * 2 - x[:, 1:2]
    for _ in range(30):
        for model, opt in ((net, ours), (twin, theirs)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    tol = 1e-5 if dtype == torch.float32 else 1e-11
    for a, b in zip(net.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    p = next(net.parameters())
    st, ref = ours.state[p], theirs.state[next(twin.parameters())]
    torch.testing.assert_close(st["exp_avg"].reshape(ref["exp_avg"].shape), ref["exp_avg"],
                               rtol=tol, atol=tol)
    assert int(st["step"]) == int(ref["step"]) == 30


def test_adam_on_sparse_rows_is_torch_sparse_adam():
    """Lazy on rows, as torch.optim.SparseAdam: untouched rows keep their moments, the
    bias correction counts the steps (batches of distinct rows, which SparseAdam and
    hogkit treat alike). SparseAdam adds ``eps`` before it divides by ``sqrt(1 -
    beta2^t)``, torch.optim.Adam (and hogkit) after: a tiny ``eps`` leaves only that."""
    torch.manual_seed(1)
    emb = torch.nn.Embedding(10, 4, sparse=True).double()
    twin = torch.nn.Embedding(10, 4, sparse=True).double()
    twin.load_state_dict(emb.state_dict())
    ours = hogkit.optim.Adam(emb.parameters(), lr=0.05, eps=1e-14)
    theirs = torch.optim.SparseAdam(twin.parameters(), lr=0.05, eps=1e-14)
    rng = np.random.default_rng(0)
    for _ in range(12):
        ids = torch.as_tensor(rng.choice(10, 3, replace=False))
        for model, opt in ((emb, ours), (twin, theirs)):
            opt.zero_grad()
            model(ids).pow(2).sum().backward()
            opt.step()
    torch.testing.assert_close(emb.weight, twin.weight, rtol=1e-9, atol=1e-12)


def test_adam_counts_every_workers_updates_when_its_state_is_shared():
    """``t`` for a shared state is the clocks' total, this update included (worker 0
    has made 5 updates, worker 1 has 7: the next is the 13th); for a private state,
    the rule's own count plus one."""
    from hogkit.kernels.adam import AdamCfg
    W = np.ones((4, 2))
    slots = np.zeros((2, SLOT), np.int64)
    slots[:, UPD] = (5, 7)
    for shared, want in ((True, 13), (False, 4)):
        K = np.array([3], np.int64)
        apply_update((W,), (np.ones((1, 2)),), (np.array([1], np.int64),), (W[:1].copy(),),
                     np.array([1]), AdamCfg(0.1, 0.9, 0.99, 1e-8), (np.zeros_like(W),),
                     (np.zeros_like(W),), K, (False, shared), slots,
                     (0, int(slots[1, UPD])))
        assert K[0] == want
        slots[0, UPD] = 5


def test_adam_keeps_one_state_for_all_workers():
    """Adam declares a shared state: the run's state store holds one block, bound by
    every worker; a simulation keeps it so too unless told otherwise."""
    from hogkit.state import worker_state
    params = {"P": np.zeros((5, 2), np.float32)}
    views = worker_state.initial(Adam(0.01), None, params, 3)
    assert {k for k in views if "/rule/" in k} == {"shared/rule/m/P", "shared/rule/v/P",
                                                  "shared/rule/k/P"}
    a, b = worker_state.bind(views, 0, "rule"), worker_state.bind(views, 2, "rule")
    assert a["m/P"] is b["m/P"]
    per = worker_state.initial(hogkit.SGD(0.1, momentum=0.9), None, params, 2)
    assert {k for k in per if "/rule/" in k} == {"0/rule/m/P", "1/rule/m/P"}


def test_adam_runs_on_both_simulator_engines_alike():
    from hogkit.engine.simulator import strip_wall
    from hogkit import workloads
    wl = workloads.get("mf", preset="hot")
    kw = dict(workers=4, steps=400, batch=8, rule=Adam(0.01), seed=2)
    fused = hogkit.simulate(wl, engine="compiled", **kw)
    python = hogkit.simulate(wl, engine="python", **kw)
    assert fused.checksum() == python.checksum()
    a, b = strip_wall(fused.summary()), strip_wall(python.summary())
    a.pop("engine"), b.pop("engine")
    assert a == b and fused.final_loss < fused.initial_loss


@pytest.mark.process
def test_a_live_adam_run_shares_its_moments_and_counts_every_workers_updates(tmp_path):
    """Two workers on mf's batch lane with Adam: the loss falls, and the state the run
    kept (one block) records a bias-correction count above either worker's own updates:
    it counted the other's too."""
    from hogkit import train, workloads
    from hogkit.state.checkpoint import read
    run = train(workloads.get("mf", preset="hot"), workers=2,
                engine=hogkit.Engine(lane="batch"),
                outputs=hogkit.Outputs(str(tmp_path / "run"), progress=False), steps=4000,
                batch=16, rule=Adam(0.01), seed=1)
    assert run.final_loss < run.initial_loss
    arrays, _ = read(str(tmp_path / "run" / "worker_state.npz"))
    assert not [k for k in arrays if k.startswith(("0/rule/", "1/rule/"))]
    counts = [int(arrays[f"shared/rule/k/{n}"][0]) for n in ("P", "Q")]
    own = max(w["updates"] for w in run.per_worker)
    assert min(counts) > own and max(counts) <= run.updates
