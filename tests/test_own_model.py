"""Bring your own model: ``TorchWorkload``, the workload contract checked up front,
the ``if __name__ == "__main__":`` hint, and a torch-style optimizer
(``hogkit.optim``) in a user's own loop under ``hogkit.spawn``.

The modules and loops are the tests' own (``helpers/own_models.py``), not hogkit's."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import hogkit
from hogkit.errors import InvalidArgument, InvalidType, NonFiniteGradient, WorkerFailed
from helpers import own_models as own
from helpers.procs import children


def tiny_workload(**kw):
    X, y = own.regression()
    return hogkit.TorchWorkload(own.make_tiny, own.mse, {"x": X, "y": y}, lr=0.05, **kw)


# --- TorchWorkload ---------------------------------------------------------------------

@pytest.mark.process
def test_a_users_module_trains_live_under_train():
    wl = tiny_workload()
    run = hogkit.train(wl, workers=2,
                       outputs=hogkit.Outputs(progress=False, eval_every=None), steps=3000)
    assert run.final_loss < 0.5 * run.initial_loss
    assert run.summary()["engine"] == "python"
    assert run.summary()["metrics"]["loss"] == pytest.approx(run.final_loss)
    assert run.staleness["update_gap"]["count"] == 3000
    m = wl.module_with(run.params)                       # the trained weights, usable
    X, y = own.regression()
    with torch.no_grad():
        assert own.mse(m, {"x": torch.from_numpy(X), "y": torch.from_numpy(y)}).item() \
            == pytest.approx(run.final_loss, rel=1e-5)


@pytest.mark.parametrize("knobs", [
    dict(policy=hogkit.SSP(2), rule=hogkit.StalenessAware(0.05)),
    dict(policy=hogkit.BSP(), rule=hogkit.GapAware(0.05, momentum=0.5)),
    dict(rule=hogkit.DelayCompensated(0.05), density=hogkit.Density(0.5)),
])
def test_a_users_module_simulates_with_policies_rules_and_density(knobs):
    run = hogkit.simulate(tiny_workload(), workers=8, steps=3000, **knobs)
    assert run.final_loss < 0.7 * run.initial_loss
    assert np.isfinite(run.final_loss)


def test_keep_read_returns_exactly_the_values_the_gradient_saw():
    wl = tiny_workload()
    params, data = wl.build(0)
    ctx = wl.setup(params, data)
    grads = wl.gradient(ctx, np.random.default_rng(0), 16, keep_read=True)
    for g in grads:
        np.testing.assert_array_equal(g.read, params[g.name])
        assert not np.shares_memory(g.read, params[g.name])
    plain = wl.gradient(ctx, np.random.default_rng(0), 16)
    for a, b in zip(grads, plain):
        np.testing.assert_array_equal(a.values, b.values)


def test_sparse_embeddings_give_sparse_rows_and_buffers_travel():
    ids = np.random.default_rng(0).integers(0, 40, 3000)
    t = (ids % 5).astype(np.float32)
    wl = hogkit.TorchWorkload(own.BagOfIds(), own.id_mse, {"ids": ids, "t": t}, lr=0.2)
    params, data = wl.build(0)
    (g,) = wl.gradient(wl.setup(params, data), np.random.default_rng(0), 8)
    assert g.rows is not None and len(g.rows) <= 8
    assert g.values.shape == (len(g.rows), 4)
    clone = pickle.loads(pickle.dumps(wl))
    assert float(clone.make_module().scale) == 0.5       # the buffer, not the weights
    run = hogkit.simulate(wl, workers=4, steps=2000)
    assert run.final_loss < 0.5 * run.initial_loss


def test_the_pickled_workload_carries_no_arrays_and_no_weights():
    X = np.zeros((200_000, 8), np.float32)
    wl = hogkit.TorchWorkload(own.TinyNet(), own.mse, {"x": X, "y": np.zeros(200_000,
                                                                              np.float32)})
    blob = pickle.dumps(wl)
    assert len(blob) < 20_000 < X.nbytes
    m = pickle.loads(blob).make_module()
    assert [n for n, _ in m.named_parameters()] == ["hidden.weight", "hidden.bias",
                                                    "head.weight", "head.bias"]
    assert all(p.device.type == "cpu" for p in m.parameters())


def test_an_instance_trains_from_its_weights_and_a_factory_from_the_seed():
    net = own.TinyNet()
    X, y = own.regression(100)
    a, _ = hogkit.TorchWorkload(net, own.mse, {"x": X, "y": y}).build(0)
    b, _ = hogkit.TorchWorkload(net, own.mse, {"x": X, "y": y}).build(7)
    np.testing.assert_array_equal(a["hidden.weight"], net.hidden.weight.detach().numpy())
    np.testing.assert_array_equal(a["hidden.weight"], b["hidden.weight"])
    f0, _ = hogkit.TorchWorkload(own.make_tiny, own.mse, {"x": X, "y": y}).build(0)
    f1, _ = hogkit.TorchWorkload(own.make_tiny, own.mse, {"x": X, "y": y}).build(1)
    f0b, _ = hogkit.TorchWorkload(own.make_tiny, own.mse, {"x": X, "y": y}).build(0)
    np.testing.assert_array_equal(f0["head.weight"], f0b["head.weight"])
    assert not np.array_equal(f0["head.weight"], f1["head.weight"])


def test_metrics_fn_and_eval_data_reach_the_summary():
    X, y = own.regression(400)
    wl = hogkit.TorchWorkload(own.make_tiny, own.mse, {"x": X[:300], "y": y[:300]},
                              eval_data={"x": X[300:], "y": y[300:]},
                              metrics_fn=_test_mse)
    run = hogkit.simulate(wl, workers=2, steps=400)
    assert set(run.summary()["metrics"]) == {"loss", "test_mse"}


def _test_mse(module, tensors):
    return {"test_mse": own.mse(module, {"x": tensors["eval/x"], "y": tensors["eval/y"]})}


@pytest.mark.parametrize("bad, error, words", [
    (dict(data={"x": np.zeros((5, 8), np.float32), "y": np.zeros(4, np.float32)}),
     InvalidArgument, "first dimension"),
    (dict(data={"x": np.zeros((5, 8), np.float16), "y": np.zeros(5, np.float32)}),
     InvalidType, "float16"),
    (dict(data={}), InvalidType, "non-empty dict"),
    (dict(module=3), InvalidType, "nn.Module"),
    (dict(loss_fn="mse"), InvalidType, "loss_fn"),
    (dict(lr=-1.0), InvalidArgument, "lr"),
])
def test_bad_torch_workload_arguments_are_named(bad, error, words):
    X, y = own.regression(5)
    args = dict(module=own.make_tiny, loss_fn=own.mse, data={"x": X, "y": y})
    args.update(bad)
    with pytest.raises(error, match=words):
        hogkit.TorchWorkload(args.pop("module"), args.pop("loss_fn"), args.pop("data"),
                             **args)


def test_a_loss_that_is_not_a_scalar_is_refused():
    X, y = own.regression(50)
    wl = hogkit.TorchWorkload(own.make_tiny, _per_sample, {"x": X, "y": y})
    params, data = wl.build(0)
    with pytest.raises(InvalidType, match="scalar"):
        wl.gradient(wl.setup(params, data), np.random.default_rng(0), 4)


def test_a_label_out_of_range_is_named_before_anything_is_spawned():
    """torch's own error is an IndexError ("Target 10 is out of bounds") from deep
    in the loss; the parent's first evaluation names the rows, the label array's range
    and the first bad label's row instead."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 4)).astype(np.float32)
    y = rng.integers(0, 4, 300)
    y[137] = 10
    wl = hogkit.TorchWorkload(own.make_classifier, own.cross_entropy, {"x": X, "y": y})
    with pytest.raises(InvalidArgument, match=r"'y' holds 0\.\.10; the first is y=10 at "
                                              r"row 137\. A class label must lie in"):
        hogkit.train(wl, workers=2, outputs=hogkit.Outputs(progress=False), steps=100)
    y[137] = 3                                     # fixed: it trains
    wl = hogkit.TorchWorkload(own.make_classifier, own.cross_entropy, {"x": X, "y": y})
    assert np.isfinite(hogkit.train(wl, workers=1, outputs=hogkit.Outputs(progress=False),
                                    steps=50).final_loss)


def _per_sample(module, batch):
    return (module(batch["x"]) - batch["y"]) ** 2


def test_a_lambda_loss_is_refused_before_anything_is_spawned():
    X, y = own.regression(50)
    wl = hogkit.TorchWorkload(own.make_tiny, lambda m, b: m(b["x"]).mean(), {"x": X, "y": y})
    with pytest.raises(InvalidArgument, match="top level"):
        hogkit.train(wl, workers=2, outputs=hogkit.Outputs(progress=False), steps=10)


# --- the workload contract, checked in the parent ------------------------------------

class Duck:
    """Everything a workload needs, duck-typed (no base class)."""

    name = "duck"
    needs_torch = False
    default_lr = 0.1
    default_batch = 4

    def build(self, seed):
        return {}, {}

    def setup(self, params, data, *, rank=0, seed=0):
        return None

    def gradient(self, ctx, rng, batch, *, keep_read=False):
        return []

    def loss(self, params, data):
        return 0.0


@pytest.mark.parametrize("missing", ["name", "needs_torch", "build", "setup", "gradient",
                                     "loss", "default_lr", "default_batch"])
def test_each_missing_piece_of_the_contract_is_named_before_spawn(missing):
    cls = type("Partial", (Duck,), {missing: None})
    with pytest.raises(InvalidArgument, match=missing):
        hogkit.train(cls(), workers=2, outputs=hogkit.Outputs(progress=False), steps=10)
    assert not [c for c in children(os.getpid()) if "spawn_main" in c[1]]


def test_given_a_rule_and_a_batch_the_defaults_are_not_needed():
    cls = type("NoDefaults", (Duck,), {"default_lr": None, "default_batch": None})
    from hogkit.engine.plan import make_plan
    plan = make_plan(cls(), rule=hogkit.SGD(0.1), batch=2, steps=10, mode="sim")
    assert plan.batch == 2


def test_workload_is_exported():
    from hogkit.workloads.base import Workload
    assert hogkit.Workload is Workload
    assert "Workload" in dir(hogkit) and "TorchWorkload" in dir(hogkit)


@pytest.mark.process
def test_a_script_without_the_main_guard_gets_a_one_line_hint(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text("import hogkit\nhogkit.train('mf', workers=2, steps=100, "
                      "outputs=hogkit.Outputs(progress=False))\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert 'if __name__ == "__main__":' in last and "line 2" in last, proc.stderr
    assert "bootstrapping" not in proc.stderr


@pytest.mark.process
def test_a_script_read_from_stdin_is_refused_with_the_fix():
    proc = subprocess.run([sys.executable, "-"], capture_output=True, text=True, timeout=120,
                          input="import hogkit\nhogkit.train('mf', workers=2, steps=100, "
                                "outputs=hogkit.Outputs(progress=False))\n")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert "standard input" in last and "python -c" in last, proc.stderr
    assert "FileNotFoundError" not in proc.stderr


def test_a_guarded_call_is_not_flagged(tmp_path):
    from hogkit.engine.mainguard import _guarded
    import ast
    tree = ast.parse(textwrap.dedent("""
        import hogkit
        def main():
            hogkit.train()
        if __name__ == "__main__":
            try:
                main()
            finally:
                pass
        main()
    """))
    assert _guarded(tree.body, 7)          # main() under the guard, inside try
    assert not _guarded(tree.body, 10)     # the unguarded call


# --- hogkit.optim ----------------------------------------------------------------------

def _pair(seed=0):
    torch.manual_seed(seed)
    a = own.TinyNet()
    b = own.TinyNet()
    b.load_state_dict(a.state_dict())
    return a, b


def _backward(model, k):
    X, y = own.regression(64, seed=k)
    model.zero_grad()
    own.mse(model, {"x": torch.from_numpy(X), "y": torch.from_numpy(y)}).backward()


@pytest.mark.parametrize("ours, momentum", [
    (lambda ps: hogkit.optim.SGD(ps, lr=0.05), 0.0),
    (lambda ps: hogkit.optim.SGD(ps, lr=0.05, momentum=0.9), 0.9),
    # a fresh read (one process: tau = 0, w == w_read) makes DC-ASGD plain SGD
    (lambda ps: hogkit.optim.DelayCompensated(ps, lr=0.05), 0.0),
])
def test_what_torch_sgd_computes(ours, momentum):
    a, b = _pair()
    opt_a = ours(a.parameters())
    opt_b = torch.optim.SGD(b.parameters(), lr=0.05, momentum=momentum)
    for k in range(15):
        _backward(a, k)
        _backward(b, k)
        opt_a.step()
        opt_b.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_step_hooks_and_the_profiler_label_are_kept():
    """step() skips torch's wrapper only when nothing listens: a pre-hook's new
    arguments, post-hooks, global hooks and the profiler's label all still work."""
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)
    w = torch.nn.Parameter(torch.zeros(2))
    opt = hogkit.optim.SGD([w], lr=1.0)
    seen = []
    pre = opt.register_step_pre_hook(
        lambda o, args, kw: (seen.append("pre"), (args, {"closure": lambda: 7.0}))[1])
    post = opt.register_step_post_hook(lambda o, args, kw: seen.append(("post", kw)))
    gpre = register_optimizer_step_pre_hook(lambda o, a, kw: seen.append("global pre"))
    gpost = register_optimizer_step_post_hook(lambda o, a, kw: seen.append("global post"))
    try:
        w.grad = torch.ones(2)
        assert opt.step() == 7.0                  # the pre-hook's closure ran
        assert seen[0] == "global pre" and seen[1] == "pre"
        assert seen[2][0] == "post" and "closure" in seen[2][1]
        assert seen[3] == "global post"
    finally:
        for h in (pre, post, gpre, gpost):
            h.remove()
    seen.clear()
    w.grad = torch.ones(2)
    opt.step()
    assert seen == [] and w.detach().tolist() == [-2.0, -2.0]
    with torch.profiler.profile() as prof:
        w.grad = torch.ones(2)
        opt.step()
        opt.zero_grad()
    names = {e.name for e in prof.events()}
    assert {"Optimizer.step#SGD.step", "Optimizer.zero_grad#SGD.zero_grad"} <= names
    assert w.grad is None


def test_zero_grad_sets_none_or_zeros_as_torch_does():
    w = torch.nn.Parameter(torch.zeros(2))
    opt = hogkit.optim.SGD([w], lr=1.0)
    w.grad = torch.ones(2)
    opt.zero_grad(set_to_none=False)
    assert w.grad is not None and w.grad.tolist() == [0.0, 0.0]
    opt.zero_grad()
    assert w.grad is None


def test_state_dict_round_trips_and_training_goes_on_identically():
    a, b = _pair()
    opt_a = hogkit.optim.GapAware(a.parameters(), lr=0.05, momentum=0.9)
    for k in range(6):
        _backward(a, k)
        opt_a.step()
    sd = opt_a.state_dict()
    state0 = sd["state"][0]
    assert set(state0) == {"v", "m", "step"} and int(state0["step"]) == 6
    b.load_state_dict(a.state_dict())
    opt_b = hogkit.optim.GapAware(b.parameters(), lr=0.05, momentum=0.9)
    opt_b.load_state_dict(pickle.loads(pickle.dumps(sd)))
    for k in range(6, 10):
        _backward(a, k)
        _backward(b, k)
        opt_a.step()
        opt_b.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_an_lr_scheduler_drives_the_rule():
    w = torch.nn.Parameter(torch.zeros(3))
    opt = hogkit.optim.SGD([w], lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    moves = []
    for _ in range(4):
        before = w.detach().clone()
        w.grad = torch.ones(3)
        opt.step()
        sched.step()
        moves.append(float((before - w.detach())[0]))
    assert moves == pytest.approx([1.0, 1.0, 0.1, 0.1])


def test_param_groups_keep_their_own_lr():
    u, v = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = hogkit.optim.SGD([{"params": [u]}, {"params": [v], "lr": 0.5}], lr=0.1)
    u.grad, v.grad = torch.ones(2), torch.ones(2)
    opt.step()
    assert u.detach().tolist() == pytest.approx([-0.1, -0.1])
    assert v.detach().tolist() == pytest.approx([-0.5, -0.5])


def test_sparse_gradients_write_only_their_rows():
    m = own.BagOfIds()
    before = m.emb.weight.detach().clone()
    opt = hogkit.optim.SGD(m.parameters(), lr=0.1)
    ids = torch.tensor([3, 7, 7])
    own.id_mse(m, {"ids": ids, "t": torch.ones(3)}).backward()
    assert m.emb.weight.grad.is_sparse
    opt.step()
    changed = (m.emb.weight.detach() != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [3, 7]


def test_a_nonfinite_gradient_is_refused_or_skipped_and_nothing_is_written():
    w = torch.nn.Parameter(torch.ones(3))
    opt = hogkit.optim.SGD([w], lr=0.1)
    w.grad = torch.tensor([1.0, float("nan"), 1.0])
    with pytest.raises(NonFiniteGradient):
        opt.step()
    assert w.detach().tolist() == [1.0, 1.0, 1.0]
    opt = hogkit.optim.SGD([w], lr=0.1, nonfinite="skip")
    opt.step()
    assert w.detach().tolist() == [1.0, 1.0, 1.0] and opt.skipped == 1


@pytest.mark.parametrize("make, words", [
    (lambda ps: hogkit.optim.SGD(ps, lr=-0.1), "lr"),
    (lambda ps: hogkit.optim.SGD(ps, lr=0.1, momentum=1.5), "momentum"),
    (lambda ps: hogkit.optim.GapAware(ps, lr=0.1, gamma=2.0), "gamma"),
    (lambda ps: hogkit.optim.SGD(ps, lr=0.1, nonfinite="ignore"), "nonfinite"),
])
def test_bad_optimizer_settings_are_named(make, words):
    with pytest.raises((InvalidArgument, InvalidType), match=words):
        make([torch.nn.Parameter(torch.zeros(2))])


# --- hogkit.spawn: the user's own loop ----------------------------------------------

@pytest.mark.process
def test_spawn_trains_a_users_loop_and_records_staleness(tmp_path):
    model = own.TinyNet()
    run = hogkit.spawn(own.train_loop, model, nprocs=2, outputs=tmp_path / "r", args=(300,),
                       policy=hogkit.SSP(2), eval_fn=own.full_mse)
    assert run.final_loss < 0.5 * run.initial_loss
    assert own.full_mse(model) == pytest.approx(run.final_loss)   # the model holds it
    assert run.updates == 600
    assert run.staleness["update_gap"]["count"] == 600
    assert run.staleness["clock_lag"]["max"] <= 2                   # SSP(2) held
    assert {"summary.json", "events.jsonl", "checkpoint.npz"} <= set(os.listdir(tmp_path / "r"))


@pytest.mark.process
def test_spawn_under_bsp_does_not_wait_for_a_worker_that_finished():
    run = hogkit.spawn(own.train_loop, own.TinyNet(),
                       nprocs=hogkit.Workers(2, wait_timeout=20),
                       args=(own.uneven, 0.05, "GapAware"), policy=hogkit.BSP())
    assert run.updates == 210
    assert [w["iterations"] for w in run.per_worker] == [10, 200]


@pytest.mark.process
def test_spawn_seconds_ends_a_loop_that_never_ends():
    """Only the budget can end this loop: that spawn returns at all is the test (the
    loop's step() raised Stopped and the workers ended normally)."""
    run = hogkit.spawn(own.until_stopped, own.TinyNet(), nprocs=2, seconds=1.0)
    assert run.updates > 0
    assert all(w["iterations"] > 0 for w in run.per_worker)


@pytest.mark.process
def test_spawn_sigkill_of_a_worker_fails_the_run_and_leaves_nothing():
    model = own.TinyNet()
    with pytest.raises(WorkerFailed) as info:
        hogkit.spawn(own.train_loop, model, nprocs=2, args=(100_000, 0.01, "SGD", 1, 20))
    assert info.value.rank == 1 and info.value.signal == "SIGKILL"
    assert all(torch.isfinite(p).all() for p in model.parameters())
    own.full_mse(model)                       # the model is usable: private memory again


@pytest.mark.process
@pytest.mark.slow
def test_spawn_sigint_of_the_parent_leaves_no_segment_or_process(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(own.__file__))!r})
        import hogkit
        from helpers import own_models as own
        if __name__ == "__main__":
            hogkit.spawn(own.until_stopped, own.TinyNet(), nprocs=2,
                         outputs=hogkit.Outputs(progress=False))
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    workers = []
    while time.monotonic() < deadline and len(workers) < 2:
        workers = [pid for pid, cmd in children(proc.pid) if "spawn_main" in cmd
                   and "resource_tracker" not in cmd]
        time.sleep(0.2)
    assert len(workers) == 2, proc.stderr.read1().decode() if proc.poll() else "no workers"
    time.sleep(2.0)                                   # well into the loops
    os.kill(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (
            any(os.path.exists(f"/proc/{p}") for p in workers)
            or [n for n in os.listdir("/dev/shm") if n.startswith(f"hogkit_{proc.pid}_")]):
        time.sleep(0.1)
    assert not [p for p in workers if os.path.exists(f"/proc/{p}")]
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"hogkit_{proc.pid}_")]


@pytest.mark.parametrize("call, error, words", [
    (lambda m: hogkit.spawn(lambda w, m: None, m), InvalidArgument, "top level"),
    (lambda m: hogkit.spawn(own.train_loop, "model"), InvalidType, "nn.Module"),
    (lambda m: hogkit.spawn(own.train_loop, m, policy=hogkit.LocalSGD(4)),
     InvalidArgument, "local SGD"),
    (lambda m: hogkit.spawn(own.train_loop, m, nprocs=0), InvalidArgument, "nprocs"),
    (lambda m: hogkit.spawn(own.train_loop, m, args=[1]), InvalidType, "tuple"),
])
def test_spawn_refuses_bad_input_before_spawning(call, error, words):
    with pytest.raises(error, match=words):
        call(own.TinyNet())


def test_rebinding_a_parameters_data_is_followed():
    w = torch.nn.Parameter(torch.zeros(3))
    opt = hogkit.optim.SGD([w], lr=1.0)
    w.grad = torch.ones(3)
    opt.step()
    w.data = torch.full((3,), 10.0)          # a new tensor: the optimizer must write it
    w.grad = torch.ones(3)
    opt.step()
    assert w.detach().tolist() == [9.0, 9.0, 9.0]
