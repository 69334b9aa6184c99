"""One step, two engines: the compiled step core and the Python reference step draw the
same samples and compute the same numbers, for every rule and density mode; the
simulator's fused and Python engines stay identical; the core keeps its counters
consistent on every path out of it (pauses, quota, stop)."""

from __future__ import annotations

import numpy as np
import pytest

from hogkit import workloads
from hogkit.state.clocks import RUNNING, Clocks
from hogkit.engine.delays import LogNormal, Pauses, Slowdown, StepTimes
from hogkit.rules.density import Density
from hogkit.kernels import layout as KL
from hogkit.policy import DSSP, SSP, Async
from hogkit.state.reader import Reader, StalenessLog
from hogkit.rules.adam import Adam
from hogkit.rules.core import SGD, AdaGrad, DelayCompensated, GapAware, RMSProp, StalenessAware
from hogkit.engine.simulator import simulate, strip_wall
from hogkit.engine.step import CompiledStep, PythonStep, compiled_support, encode_pacer
from hogkit.engine.worker_loop import clock_counts_all, control_specs, runtime_specs
import hogkit

MF = workloads.get("mf", preset="hot")
LOGREG = workloads.get("logreg", n_samples=300, n_features=80, min_nnz=2, max_nnz=9)
MLP = workloads.get("mlp")

RULES = {
    "sgd": SGD(0.05), "sgd-momentum": SGD(0.02, momentum=0.9),
    "staleness-aware": StalenessAware(0.05), "sa-momentum": StalenessAware(0.02, 0.9),
    "dc": DelayCompensated(0.05), "dc-adaptive": DelayCompensated(0.05, adaptive=True),
    "gap-aware": GapAware(0.05), "ga-momentum": GapAware(0.02, momentum=0.9),
    "adagrad": AdaGrad(0.05), "adagrad-rowwise": AdaGrad(0.05, rowwise=True),
    "rmsprop-rowwise-stale": RMSProp(0.01, rowwise=True, scale_by_staleness=True),
    "adam": Adam(0.01),
}
DENSITIES = {
    "none": None, "topk-residual": Density(0.3), "random-drop": Density(0.5, how="random",
                                                                        residual=False),
    "threshold": Density(1.0, how="threshold", threshold=0.02),
    "every-3": Density(1.0, every=3), "topk-every-2": Density(0.5, every=2),
}


def _control(workers=1):
    views = {k: np.zeros(shape, dt) for k, (shape, dt) in
             {**Clocks.specs(workers), **StalenessLog.specs(workers, ring=64),
              **runtime_specs(workers)}.items()}
    clocks, log = Clocks(views), StalenessLog(views)
    clocks.state[:] = RUNNING
    return views, clocks, log


def run_compiled(wl, rule, density, steps, batch, seed=0, pacer=None, nonfinite="raise",
                 clock_fresh=False):
    params, data = wl.build(seed)
    views, clocks, log = _control()
    ctx = wl.setup(params, data, rank=0, seed=seed)
    core = CompiledStep(ctx, rank=0, batch=batch, rule=rule, rule_state=rule.init(params),
                        density=density,
                        density_state=density.init(params) if density else None,
                        slots=clocks.slots, rt=views["rt"], stop=clocks.stop,
                        log=log.arrays(), rng=np.random.default_rng([seed, 0]),
                        quota=steps, pacer=pacer, nonfinite=nonfinite,
                        clock_fresh=clock_fresh)
    codes = []
    while True:
        u0, i0 = int(clocks.updates[0]), int(clocks.iterations[0])
        code = core.run(7)
        codes.append(code)
        # every path out of the core leaves the counters consistent
        assert core.done == int(clocks.iterations[0]) - i0
        held = int(views["rt"][0, KL.RT_HELD])
        assert int(clocks.updates[0]) - u0 <= core.done
        if code in (KL.QUOTA_DONE, KL.NONFINITE):
            break
    if code == KL.NONFINITE:
        return params, log, views["rt"][0], codes
    skipped = int(views["rt"][0, KL.RT_NONFINITE])
    assert int(clocks.updates[0]) + held + skipped == steps == int(clocks.iterations[0])
    return params, log, views["rt"][0], codes


def run_python(wl, rule, density, steps, batch, seed=0, lane=True, skip_nonfinite=False):
    params, data = wl.build(seed)
    views, clocks, log = _control()
    ctx = wl.setup(params, data, rank=0, seed=seed)
    step = PythonStep(wl, ctx, rank=0, rule=rule, rule_state=rule.init(params),
                      density=density,
                      density_state=density.init(params) if density else None,
                      reader=Reader(clocks, log, 0), clocks=clocks, params=params)
    assert step._lane is not None          # (density: it views the buffers as Grad)
    if not lane:
        step._lane = None                  # the general path: Grad, rule.apply, Reader
    rng = np.random.default_rng([seed, 0])
    skipped = 0
    for k in range(steps):
        grads, ok = step.compute(rng, batch)
        if ok:
            step.apply(grads, k)
        else:
            assert skip_nonfinite, f"non-finite gradient at step {k}"
            skipped += 1
        clocks.tick_iteration(0)
    if skip_nonfinite:
        return params, log, skipped
    return params, log


@pytest.mark.parametrize("rule", ["sgd", "dc-asgd"], ids=["sgd-fused", "dc-asgd"])
def test_both_steps_guard_and_skip_the_same_nonfinite_updates(rule):
    """NaN in the data (every 7th rating): the compiled core (the fused SGD kernel
    included) drops exactly the updates the Python step drops, and nothing non-finite
    reaches the parameters; with nonfinite="raise" it stops at the first one."""
    from helpers.faulty import poisoned_mf
    wl = poisoned_mf(every=7, preset="hot")
    rule = {"sgd": SGD(0.05), "dc-asgd": DelayCompensated(0.05)}[rule]
    pc, log_c, rt, codes = run_compiled(wl, rule, None, 80, 16, nonfinite="skip")
    pp, log_p, skipped = run_python(wl, rule, None, 80, 16, skip_nonfinite=True)
    assert skipped > 0 and int(rt[KL.RT_NONFINITE]) == skipped
    for name in pc:
        assert np.isfinite(pc[name]).all()
        np.testing.assert_array_equal(pc[name], pp[name])
    np.testing.assert_array_equal(log_c.count, log_p.count)
    _, _, _, codes = run_compiled(wl, rule, None, 80, 16, nonfinite="raise")
    assert codes[-1] == KL.NONFINITE


@pytest.mark.parametrize("wl", [MF, LOGREG], ids=["mf", "logreg"])
@pytest.mark.parametrize("rule", list(RULES), ids=list(RULES))
def test_compiled_and_python_steps_compute_the_same_parameters(wl, rule):
    """Bit-identical: both paths call the same kernels under the same flags."""
    rule = RULES[rule]
    pc, log_c, _, _ = run_compiled(wl, rule, None, 60, 16)
    pp, log_p = run_python(wl, rule, None, 60, 16)
    for name in pc:
        np.testing.assert_array_equal(pc[name], pp[name])
    np.testing.assert_array_equal(log_c.gap_hist, log_p.gap_hist)
    np.testing.assert_array_equal(log_c.count, log_p.count)


DELAYED = ["dc", "dc-adaptive", "gap-aware", "ga-momentum"]


@pytest.mark.parametrize("wl", [MF, LOGREG], ids=["mf", "logreg"])
@pytest.mark.parametrize("rule", DELAYED)
def test_a_clock_fresh_step_gives_the_measured_gaps_bits_when_every_writer_ticks(wl, rule):
    """One worker, every writer on the clock: a step with gap 0 that takes its gaps as
    zero (``clock_fresh``) computes what measuring them computes, bit for bit."""
    rule = RULES[rule]
    pf, log_f, _, _ = run_compiled(wl, rule, None, 60, 16, clock_fresh=True)
    pm, log_m, _, _ = run_compiled(wl, rule, None, 60, 16)
    for name in pf:
        np.testing.assert_array_equal(pf[name], pm[name])
    np.testing.assert_array_equal(log_f.gap_hist, log_m.gap_hist)


def _one_step_after_a_write(rule, *, clock_fresh, counted):
    """One lean-lane step of LOGREG on a two-worker clock; between its read and its
    apply every weight moves by 0.25 (a write nobody counted), and with ``counted``
    the other worker's update counter ticks once. Returns the weights after."""
    params, data = LOGREG.build(3)
    views, clocks, log = _control(2)
    ctx = LOGREG.setup(params, data, rank=0, seed=3)
    step = PythonStep(LOGREG, ctx, rank=0, rule=rule, rule_state=rule.init(params),
                      density=None, density_state=None, reader=Reader(clocks, log, 0),
                      clocks=clocks, params=params, clock_fresh=clock_fresh)
    grads, ok = step.compute(np.random.default_rng(5), 16)
    assert grads is None and ok                 # the lean lane: one compiled apply
    params["w"] += np.float32(0.25)
    if counted:
        clocks.tick_update(1)
    assert step.apply(None, 0) == int(counted)
    return params["w"].copy()


@pytest.mark.parametrize("rule", ["dc", "dc-adaptive", "gap-aware"])
def test_a_clock_fresh_step_leaves_out_writes_no_update_counted(rule):
    """The clock decides what is fresh: with gap 0 DC-ASGD and Gap-Aware take the step
    SGD takes from the same gradient (a write in between that no update counted, such
    as a peer's update still being written, is not compensated); measuring (no
    ``clock_fresh``) compensates it; and once an update is counted (gap 1) the
    clock-fresh step measures too."""
    rule = RULES[rule]
    sgd = _one_step_after_a_write(SGD(rule.lr), clock_fresh=True, counted=False)
    fresh = _one_step_after_a_write(rule, clock_fresh=True, counted=False)
    measured = _one_step_after_a_write(rule, clock_fresh=False, counted=False)
    np.testing.assert_array_equal(fresh, sgd)
    assert not np.array_equal(measured, sgd)
    np.testing.assert_array_equal(
        _one_step_after_a_write(rule, clock_fresh=True, counted=True),
        _one_step_after_a_write(rule, clock_fresh=False, counted=True))


@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_the_simulator_and_the_compiled_step_encode_the_clock_flag(engine, monkeypatch):
    """The wiring: both simulator engines encode their rule clock-fresh (every write is
    a whole update they count), a CompiledStep asked to carries the clock flag into its
    core, and one not asked to does not."""
    import hogkit.engine.simulator as SIM
    import hogkit.engine.step as ES
    seen, real = [], ES.encode_rule

    def spy(*a, clock_fresh=False, **kw):
        seen.append(clock_fresh)
        return real(*a, clock_fresh=clock_fresh, **kw)
    monkeypatch.setattr(ES, "encode_rule", spy)
    monkeypatch.setattr(SIM, "encode_rule", spy)
    simulate(LOGREG, workers=3, engine=engine, steps=30, batch=4, rule=RULES["dc"], seed=1)
    assert seen and all(seen)
    params, data = LOGREG.build(0)
    views, clocks, log = _control()
    for flag in (True, False):
        core = CompiledStep(LOGREG.setup(params, data, rank=0, seed=0), rank=0, batch=4,
                            rule=RULES["gap-aware"], rule_state=RULES["gap-aware"].init(params),
                            density=None, density_state=None, slots=clocks.slots,
                            rt=views["rt"], stop=clocks.stop, log=log.arrays(),
                            rng=np.random.default_rng(0), clock_fresh=flag)
        assert core.rule.clock is flag


def test_a_replica_step_is_fresh_and_a_counted_read_without_the_clock_is_measured():
    """``kernels.step.apply_update``: a local-SGD replica step (``others < 0``: private
    rows) takes its gaps as zero even without the clock flag, so moved weights get
    SGD's step; a shared step at gap 0 without the flag measures the move."""
    from hogkit.kernels.clock import SLOT
    from hogkit.kernels.sparse import sgd_rows
    from hogkit.kernels.step import apply_update
    rule = RULES["dc"]
    rng = np.random.default_rng(0)
    rows = np.array([3, 1, 3, 7], np.int64)
    G = rng.standard_normal((4, 1))
    W0 = rng.standard_normal((9, 1))

    def step(others):
        W = W0.copy()
        RD = W[rows].copy()                     # the read copies, then the weights move
        W += 0.25
        slots = np.zeros((1, SLOT), np.int64)
        apply_update((W,), (G,), (rows,), (RD,), np.array([4]), rule.cfg(), (W[:0],),
                     (W[:0],), np.zeros(1, np.int64), (False, False), slots, (0, others))
        return W
    want = W0 + 0.25
    sgd_rows(want, rows, G, rule.lr, 4)
    np.testing.assert_array_equal(step(-1), want)
    assert not np.array_equal(step(0), want)


def test_only_a_clock_that_counts_every_writer_makes_steps_fresh():
    """A cluster node's agent writes the other nodes' rows without ticking (its gate
    row), so its workers measure their gaps; the simulator and one machine's workers do
    not need to. The flag is the engine's, not the rule's: its configuration is the
    same either way (``rule.apply`` is given reads the engine's clock knows nothing
    of)."""
    from hogkit.engine.step import encode_rule
    local = control_specs(2)["clk_slots"][0]
    node = control_specs(2, gate=1)["clk_slots"][0]
    assert clock_counts_all(np.zeros(local), 2)
    assert not clock_counts_all(np.zeros(node), 2)
    rule = RULES["gap-aware"]
    params = {"w": np.zeros(4, np.float32)}
    rows = (params["w"].reshape(-1, 1),)
    on = encode_rule(rule, rule.init(params), ["w"], rows, clock_fresh=True)
    off = encode_rule(rule, rule.init(params), ["w"], rows)
    assert on.clock is True and off.clock is False
    assert on.cfg == off.cfg == rule.cfg()


@pytest.mark.parametrize("wl", [MF, LOGREG, MLP], ids=["mf", "logreg", "mlp"])
@pytest.mark.parametrize("rule", list(RULES), ids=list(RULES))
def test_the_python_steps_lean_lane_computes_what_the_general_path_does(wl, rule):
    """The lean lane against Grad + rule.apply + Reader, bit for bit, for every rule:
    a compiled workload's (one compiled call per half) and a torch workload's (autograd
    into ``.grad``, then one compiled call: guard, gap, the rule on every parameter,
    tick, record; read snapshots for DC-ASGD and Gap-Aware, Gap-Aware's counts)."""
    rule = RULES[rule]
    pl, log_l = run_python(wl, rule, None, 40, 16)
    pg, log_g = run_python(wl, rule, None, 40, 16, lane=False)
    for name in pl:
        np.testing.assert_array_equal(pl[name], pg[name])
    for a, b in zip(log_l.arrays()[:3], log_g.arrays()[:3]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("density", ["topk-residual", "every-3"])
def test_the_torch_lean_lane_hands_density_the_same_gradients(density):
    """With density the lane's gradients go the general way (as ``Grad`` views of the
    module's ``.grad``): the same result as without the lane."""
    wl = MLP
    rule, density = GapAware(0.05, momentum=0.5), DENSITIES[density]
    pl, log_l = run_python(wl, rule, density, 20, 16)
    pg, log_g = run_python(wl, rule, density, 20, 16, lane=False)
    for name in pl:
        np.testing.assert_array_equal(pl[name], pg[name])
    np.testing.assert_array_equal(log_l.count, log_g.count)


def test_a_sparse_torch_gradient_takes_the_general_path():
    """A sparse embedding gradient cannot be viewed flat: the lane hands that step to
    the general path, and the result is the general path's."""
    import hogkit
    from helpers import own_models as own
    ids = np.random.default_rng(0).integers(0, 40, 3000)
    wl = hogkit.TorchWorkload(own.BagOfIds(), own.id_mse,
                              {"ids": ids, "t": (ids % 5).astype(np.float32)}, lr=0.2)
    pl, log_l = run_python(wl, SGD(0.2), None, 20, 8)
    pg, log_g = run_python(wl, SGD(0.2), None, 20, 8, lane=False)
    for name in pl:
        np.testing.assert_array_equal(pl[name], pg[name])
    np.testing.assert_array_equal(log_l.count, log_g.count)
    assert int(log_l.count[0]) == 20


@pytest.mark.parametrize("wl", [MF, LOGREG], ids=["mf", "logreg"])
@pytest.mark.parametrize("density", list(DENSITIES), ids=list(DENSITIES))
def test_compiled_and_python_steps_thin_updates_the_same_way(wl, density):
    density = DENSITIES[density]
    rule = GapAware(0.05, momentum=0.5)                 # state, reads and a residual
    pc, log_c, rt, _ = run_compiled(wl, rule, density, 60, 16)
    pp, log_p = run_python(wl, rule, density, 60, 16)
    for name in pc:
        np.testing.assert_array_equal(pc[name], pp[name])
    np.testing.assert_array_equal(log_c.count, log_p.count)
    if density is not None and density.every > 1:      # held back: iterations, not updates
        assert int(rt[KL.RT_HELD]) == 60 - int(log_c.count[0]) > 0


def test_a_long_pause_returns_to_python_with_the_step_counted():
    """Pauses beyond the spin limit are slept by Python; the step before is complete."""
    pacer = encode_pacer(Pauses(0.5, 0.0005), 0, 0)
    _, _, rt, codes = run_compiled(MF, SGD(0.05), None, 80, 4, pacer=pacer)
    assert codes.count(KL.PAUSE) > 5
    assert rt[KL.RT_PAUSED] >= codes.count(KL.PAUSE) * 500_000


def test_the_core_stops_on_the_flag_and_blocks_past_the_bound():
    params, data = MF.build(0)
    views, clocks, log = _control(workers=2)
    ctx = MF.setup(params, data, rank=0, seed=0)
    rule = SGD(0.05)
    core = CompiledStep(ctx, rank=0, batch=8, rule=rule, rule_state=rule.init(params),
                        density=None, density_state=None, slots=clocks.slots,
                        rt=views["rt"], stop=clocks.stop, log=log.arrays(),
                        rng=np.random.default_rng(0), policy=SSP(1))
    # worker 1 never moves: worker 0 may run 2 iterations under SSP(1), then blocks
    # (after spinning in compiled code for a while)
    assert core.run(100) == KL.BLOCKED and core.done == 2
    assert views["rt"][0, KL.RT_WAIT] > 0
    clocks.iterations[1] = 5                           # the peer moved on
    assert core.run(3) == KL.CHUNK and core.done == 3
    clocks.request_stop()
    assert core.run(100) == KL.STOPPED and core.done == 0


def test_unsupported_knobs_are_named():
    from hogkit.rules.batching import AdaptiveBatch
    mlp = workloads.get("mlp")
    assert "torch" in compiled_support(mlp, rule=SGD(0.1), density=None, batch=32)
    assert "adaptive" in compiled_support(MF, rule=SGD(0.1), density=None,
                                          batch=AdaptiveBatch(64))
    assert "shards" in compiled_support(MF, rule=SGD(0.1), density=None, batch=8,
                                        shards=4)
    assert compiled_support(MF, rule=GapAware(0.1), density=Density(0.1), batch=8,
                            stragglers={1: Slowdown(2.0)}) is None


class _CountingPolicy:
    """A policy of the user's own: the compiled core cannot call its wait()."""

    def wait(self, clocks, rank, *, timeout=60.0):
        return 0.0


def test_a_policy_of_ones_own_is_not_run_as_async_by_the_core():
    why = compiled_support(MF, rule=SGD(0.1), density=None, batch=8,
                           policy=_CountingPolicy())
    assert why is not None and "policy" in why
    assert compiled_support(MF, rule=SGD(0.1), density=None, batch=8, policy=SSP(2)) is None


# --------------------------------------------------------------------------- simulator

DELAYS = StepTimes(base=LogNormal(1e-3, 0.5), stragglers={1: Slowdown(3.0)})


@pytest.mark.parametrize("wl", [MF, LOGREG], ids=["mf", "logreg"])
@pytest.mark.parametrize("rule, density, policy", [
    (SGD(0.05), None, Async()),
    (GapAware(0.05), None, SSP(2)),
    (StalenessAware(0.05, 0.5), Density(0.4), SSP(1)),
    (DelayCompensated(0.05, adaptive=True), Density(0.5, how="random"), DSSP(0, 3)),
    (GapAware(0.05, momentum=0.9), Density(1.0, every=2), Async()),
    (DelayCompensated(0.05), Density(1.0, how="threshold", threshold=0.01), SSP(0)),
], ids=["sgd-async", "ga-ssp2", "sa-topk-ssp1", "dca-random-dssp", "ga-every2", "dc-threshold-bsp"])
def test_fused_and_python_simulators_are_identical(wl, rule, density, policy):
    kw = dict(workers=hogkit.Workers(5, delays=DELAYS), steps=300, batch=8, rule=rule,
              density=density, policy=policy, seed=3)
    fused, python = simulate(wl, engine="compiled", **kw), simulate(wl, engine="python",
                                                                    **kw)
    assert fused.extra["engine"] == "compiled" and python.extra["engine"] == "python"
    assert fused.checksum() == python.checksum()
    a, b = strip_wall(fused.summary()), strip_wall(python.summary())
    a.pop("engine"), b.pop("engine")
    assert a == b
    assert fused.staleness["update_gap"]["max"] > 0     # the case is not trivial


def test_only_a_workload_registered_checks_finite_skips_the_guards_scan():
    """The step core trusts a gradient kernel's True (and skips the guard's scan of the
    buffers) only from a class registered ``checks_finite=True`` (mf), and only a bool:
    a kernel of another class returning a bool for its own reasons, or one returning
    nothing or an int, keeps the scan."""
    from typing import NamedTuple

    from numba import typeof, types

    from hogkit.kernels import step as ks
    from hogkit.kernels.mf import MFArrays

    class Other(NamedTuple):
        r: np.ndarray

    mf = typeof(MFArrays(np.zeros(1, np.int32), np.zeros(1, np.int64),
                         np.zeros(1, np.float32), 0.0))
    other = typeof(Other(np.zeros(1)))
    assert MFArrays in ks._CHECKS_FINITE and Other not in ks._CHECKS_FINITE
    assert ks._vouched(mf, types.boolean)(None, True) is True
    assert ks._vouched(mf, types.boolean)(None, False) is False
    assert ks._vouched(other, types.boolean)(None, True) is False
    assert ks._vouched(mf, types.none)(None, None) is False
    assert ks._vouched(mf, types.int64)(None, 1) is False
