"""Scenario ``instrumentation``: what measuring staleness costs per update step.

One process runs the worker loop's step on matrix factorisation (gradient of a
batch, sparse apply, clock ticks) twice, interleaved round by round: bare, and
instrumented with the reader (``read`` before the gradient; ``gap`` and ``commit``
around the apply - the histogram update and the event ring write). The clocks and
log live in a real shared-memory store, as in a run. The figure is
``overhead = median(instrumented step) / median(bare step) - 1``; goal ≤ 3 %.
Cases: the default mf preset (5000 x 5000, rank 32; a ~22 µs step at batch 256) at
batch 256 and 64, and the large preset (102 MB of factors; memory-bound steps).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from hogkit import workloads
from hogkit.clocks import Clocks
from hogkit.reader import Reader, StalenessLog
from hogkit.rules import SGD
from hogkit.store import ParamStore


def _steps(wl, ctx, params, rule, state, clocks, reader, rng, batch, n, instrumented):
    t0 = time.perf_counter_ns()
    for k in range(n):
        if instrumented:
            reader.read()
        grads = wl.gradient(ctx, rng, batch)
        if instrumented:
            gap = reader.gap()
            rule.apply(params, grads, state, staleness=gap, worker=0)
            clocks.tick_update(0)
            reader.commit(k, gap)
        else:
            rule.apply(params, grads, state, staleness=0, worker=0)
            clocks.tick_update(0)
        clocks.tick_iteration(0)
    return (time.perf_counter_ns() - t0) / n


def _one(preset, batch, rounds, steps):
    wl = workloads.get("mf", preset=preset)
    params, data = wl.build(0)
    batch = batch or wl.default_batch
    rule = SGD(lr=wl.default_lr)
    state = rule.init(params)
    ctx = wl.setup(params, data, rank=0, seed=0)
    rng = np.random.default_rng(0)
    with ParamStore.create({**Clocks.specs(2), **StalenessLog.specs(2)}, tag="bench") as st:
        views = st.views()
        clocks, log = Clocks(views), StalenessLog(views)
        reader = Reader(clocks, log, 0)
        args = (wl, ctx, params, rule, state, clocks, reader, rng, batch, steps)
        _steps(*args, True)  # warm up (compiles)
        bare, inst = [], []
        for _ in range(rounds):
            bare.append(_steps(*args, False))
            inst.append(_steps(*args, True))
    b, i = statistics.median(bare), statistics.median(inst)
    return {"preset": preset, "batch": batch, "bare_step_us": b / 1e3,
            "instrumented_step_us": i / 1e3, "overhead": i / b - 1.0,
            "reader_cost_us": (i - b) / 1e3}


def run(quick=False, rounds=None) -> dict:
    rounds = rounds or (5 if quick else 15)
    steps = 300 if quick else 2000
    cases = [_one("default", None, rounds, steps), _one("default", 64, rounds, steps),
             _one("large", None, rounds, max(steps // 4, 100))]
    return {"scenario": "instrumentation", "rounds": rounds, "steps_per_round": steps,
            "cases": cases,
            "ratios": {f"overhead_{c['preset']}_batch{c['batch']}": c["overhead"]
                       for c in cases}}


def format_table(result) -> str:
    lines = [f"instrumentation: median of {result['rounds']} rounds x "
             f"{result['steps_per_round']} steps",
             f"{'preset':>8}{'batch':>6}{'bare µs':>10}{'instr. µs':>11}{'reader µs':>11}"
             f"{'overhead':>10}"]
    for c in result["cases"]:
        lines.append(f"{c['preset']:>8}{c['batch']:>6}{c['bare_step_us']:>10.2f}{c['instrumented_step_us']:>11.2f}"
                     f"{c['reader_cost_us']:>11.2f}{c['overhead'] * 100:>9.2f}%")
    return "\n".join(lines)
