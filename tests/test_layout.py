"""The engine core's one copy of each thing: the control-array layouts in one module,
the straggler formulas in one kernel (the live core, the Python pacer and the
simulator's load read the same one), and one local-SGD replica lifecycle for the live
worker and the simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hogkit.engine.delays import Load, Pauses, Slowdown
from hogkit.engine.local_phase import LocalPhase
from hogkit.kernels import clock, layout, pacer, sim, step

BLOCKS = {
    "cfg": ("ME", "BATCH", "KEEP_READ", "SKIP", "STRIDE", "LOCAL_H", "QUOTA", "TIMING",
            "RECORD", "FUSED", "STEP0", "LANE", "MERGE_CORE", "DIVISOR", "COUNT_STEPS"),
    "io": ("IO_DONE", "IO_PAUSE_NS", "IO_OTHERS", "IO_LAG", "IO_MERGED"),
    "rt": ("RT_WAIT", "RT_BUSY", "RT_NONFINITE", "RT_SAMPLES", "RT_T0", "RT_T1",
           "RT_COMPUTE", "RT_PAUSED", "RT_HELD", "RT_STRIDE"),
    "codes": ("CHUNK", "STOPPED", "QUOTA_DONE", "BLOCKED", "MERGE", "PAUSE", "NONFINITE"),
    "ist": ("I_STARTED", "I_QUOTA", "I_OREAD", "I_LAG", "I_KIND", "I_SEQ", "I_BLOCKED",
            "I_FILLED", "I_SKIPPED", "I_BAD", "I_ADM", "I_HELD", "I_PHASE"),
    "sim codes": ("R_DONE", "R_EVAL_T", "R_EVAL_U", "R_REFILL", "R_NONFINITE", "R_BEGIN",
                  "R_END", "R_RETIRE"),
}


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_each_block_is_distinct_and_fits(block):
    values = [getattr(layout, n) for n in BLOCKS[block]]
    if block == "ist":              # I_ADM opens the admission columns
        values = values[:-2] + list(range(layout.I_ADM + 1, layout.I_ADM + clock.NADM)) \
            + values[-2:]
    assert len(set(values)) == len(values)
    width = {"cfg": layout.NCFG, "rt": layout.RT, "ist": layout.NI,
             "io": layout.NIO}.get(block)
    if width is not None:
        assert max(values) < width


def test_the_layout_is_only_in_the_layout_module():
    """The step core and the event loop read the layout; they define none of it."""
    for mod in (step, sim):
        src = open(mod.__file__).read()
        for names in BLOCKS.values():
            for n in names:
                assert f"\n{n} = " not in src and f" {n}) = range" not in src, (mod, n)
    assert layout.ADM_WIDTH == clock.NADM


@pytest.mark.parametrize("t", [0.0, 0.3, 1.25, 7.9, 1234.5])
def test_load_formula_is_one(t):
    """Load's factor: the simulator's step time, the Python pacer's load() and the live
    core's pace_ns all come from pacer.load_factor."""
    amp, period = 1.5, 2.0
    want = 1.0 + amp * 0.5 * (1.0 + math.sin(2.0 * math.pi * t / period))
    assert pacer.load_factor(amp, period, t) == want
    assert sim.step_time(1.0, 1.0, amp, period, t, 0.0) == want
    p = Load(amp, period).start(0, 0)
    t0 = int(p.row[3])
    assert p.load(t0 + int(round(t * 1e9))) == pytest.approx(want, rel=1e-12)
    busy = 1_000_000
    row = np.array([layout.PACE_LOAD, amp, period, 0.0])
    now = int(round(t * 1e9))
    f = pacer.load_factor(amp, period, now * 1e-9)
    assert pacer.pace_ns(row, np.random.default_rng(0), busy, now) == int((f - 1.0) * busy)


def test_pacer_rows_and_kinds():
    assert Slowdown(3.0).pacer()[0] == layout.PACE_SLOWDOWN
    assert Pauses(0.5, 0.01).pacer()[0] == layout.PACE_PAUSES
    assert Load(1.0).pacer()[0] == layout.PACE_LOAD
    rng = np.random.default_rng(0)
    assert pacer.pace_ns(np.array([layout.PACE_SLOWDOWN, 3.0, 0.0, 0.0]), rng, 100, 0) == 200
    assert pacer.pace_ns(np.zeros(4), rng, 100, 0) == 0
    draws = [pacer.pace_ns(np.array([layout.PACE_PAUSES, 0.5, 0.01, 0.0]), rng, 1, 0)
             for _ in range(200)]
    assert set(draws) == {0, 10_000_000}


def _model(seed=0):
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((5, 3)), "b": rng.standard_normal(4)}


def test_local_phase_merge_and_pull():
    shared = _model()
    start = {k: v.copy() for k, v in shared.items()}
    ph = LocalPhase(shared, divisor=4)
    assert not ph.pending()
    for v in ph.replica.values():
        v += 1.0
    assert ph.pending()
    ph.merge()
    for k in shared:
        np.testing.assert_array_equal(shared[k], start[k] + (start[k] + 1.0 - start[k]) / 4)
        np.testing.assert_array_equal(ph.replica[k], shared[k])
        np.testing.assert_array_equal(ph.base[k], shared[k])
    assert not ph.pending()
    shared["a"] += 2.0                  # another worker's merge
    ph.pull()
    np.testing.assert_array_equal(ph.replica["a"], shared["a"])


def test_local_phase_overlap_rebases():
    shared = _model(1)
    ph = LocalPhase(shared, divisor=2, overlap=True)
    ph.replica["a"] += 1.0
    ph.merge()
    ph.close()
    merged = {k: v.copy() for k, v in shared.items()}
    ph.replica["a"] += 1.0              # a step taken while the merge ran
    ph.merge()
    ph.close()
    np.testing.assert_allclose(ph.base["a"], merged["a"] + 1.0)


def test_sum_merges_add_each_workers_change_whole():
    """LocalSGD(h, merge="sum"): two workers' phases from one base merge to
    base + Δ1 + Δ2 (the average would give base + (Δ1 + Δ2) / 2), each replica then
    holding the shared model as its merge left it."""
    from hogkit.policy import LocalSGD
    pol = LocalSGD(4, merge="sum")
    shared = _model(2)
    start = {k: v.copy() for k, v in shared.items()}
    a, b = (LocalPhase(shared, pol.merge_divisor(2)) for _ in range(2))
    a.replica["a"] += 1.0
    b.replica["a"] -= 0.25
    d1, d2 = a.replica["a"] - start["a"], b.replica["a"] - start["a"]   # Δ1, Δ2
    a.merge()
    np.testing.assert_array_equal(a.replica["a"], start["a"] + d1)
    b.merge()
    np.testing.assert_array_equal(shared["a"], start["a"] + d1 + d2)
    np.testing.assert_array_equal(b.base["a"], shared["a"])
    assert LocalSGD(4).merge_divisor(2) == 2 and pol.merge_divisor(2) == 1


def test_local_sgd_spells_its_merge():
    from hogkit.errors import InvalidArgument
    from hogkit.policy import LocalSGD, from_string
    assert from_string("local:16:sum") == LocalSGD(16, merge="sum")
    assert from_string("local:16:sum:overlap") == LocalSGD(16, overlap=True, merge="sum")
    assert from_string("local:16") == LocalSGD(16)
    assert repr(LocalSGD(16, merge="sum")) == "LocalSGD(16, merge='sum')"
    assert LocalSGD(16, merge="sum").config()["merge"] == "sum"
    for bad in ("local:16:sum:sum", "local:16:max", "local:16:overlap:sum:x",
                "local:16:cost1:cost2"):
        with pytest.raises(InvalidArgument, match="at most 'overlap', 'sum' and 'costC'"):
            from_string(bad)
    assert from_string("local:16:overlap:cost4") == LocalSGD(16, overlap=True, cost=4.0)
    assert repr(LocalSGD(16, cost=0.5)) == "LocalSGD(16, cost=0.5)"
    assert LocalSGD(16, cost=2).config()["cost"] == 2.0 and "cost" not in LocalSGD(16).config()
    with pytest.raises(InvalidArgument, match="not cost followed by a number"):
        from_string("local:16:costly")
    with pytest.raises(InvalidArgument, match="merge cost"):
        LocalSGD(16, cost=-1)
    with pytest.raises(InvalidArgument, match="merge='max'"):
        LocalSGD(4, merge="max")
