"""Scenario ``instrumentation``: what measuring staleness costs, and what Python costs.

1. **The compiled step core, record on vs off** (``cfg[RECORD]``): one process runs the
   worker's core on matrix factorisation (the default preset; clocks and log in a real
   shared-memory store), alternating the two settings round by round. The event ring
   keeps every k-th event, k chosen as the live worker chooses it (about 20,000 events
   a second); the histograms and exact sums count every update either way. The figure
   is ``overhead = median(step with record) / median(step without) - 1``, at batch 1
   (per-sample steps), 64 (``mf``'s default) and 256.
2. **The Python step's overhead around the work**: the same steps on the Python engine
   (:class:`hogkit.engine.step.PythonStep`: the workload's gradient, the guard, ``rule.apply``,
   the reader's read/gap/commit, the clock ticks, each a Python call) minus the compiled
   core's time for the same step: what Python adds per step, at batch 256 and 64.

Rounds interleave the variants, so a busy machine slows all of them alike; the medians
are reported with every round's figure in the JSON.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from hogkit import workloads
from hogkit.state.clocks import RUNNING, Clocks
from hogkit.kernels import layout as KL
from hogkit.state.reader import Reader, StalenessLog
from hogkit.rules.core import SGD
from hogkit.engine.step import CompiledStep, PythonStep
from hogkit.state.store import ParamStore
from hogkit.engine.worker_loop import EVENTS_PER_S, runtime_specs


def _stores(workers=1):
    return ParamStore.create({**Clocks.specs(workers), **StalenessLog.specs(workers),
                              **runtime_specs(workers)}, tag="bench")


def _core_step_ns(core, steps):
    t0 = time.perf_counter_ns()
    core.run(steps)
    return (time.perf_counter_ns() - t0) / steps


def _stride(step_ns):
    """The event-ring stride the live worker would pick at this step time."""
    rate = 1e9 / step_ns
    stride = max(1, int(rate // EVENTS_PER_S))
    return 1 << (stride.bit_length() - 1)


def _compiled(wl, params, data, batch, rounds, steps):
    with _stores() as st:
        views = st.views()
        clocks, log = Clocks(views), StalenessLog(views)
        clocks.state[0] = RUNNING
        ctx = wl.setup(params, data, rank=0, seed=0)
        rule = SGD(wl.default_lr)
        core = CompiledStep(ctx, rank=0, batch=batch, rule=rule,
                            rule_state=rule.init(params), density=None,
                            density_state=None, slots=clocks.slots, rt=views["rt"],
                            stop=clocks.stop, log=log.arrays(),
                            rng=np.random.default_rng(0))
        core.run(10)
        core.cfg[KL.STRIDE] = _stride(_core_step_ns(core, steps))
        on, off = [], []
        for _ in range(rounds):
            core.cfg[KL.RECORD] = 0
            off.append(_core_step_ns(core, steps))
            core.cfg[KL.RECORD] = 1
            on.append(_core_step_ns(core, steps))
        b, i = statistics.median(off), statistics.median(on)
        return {"batch": batch, "stride": int(core.cfg[KL.STRIDE]), "bare_step_ns": b,
                "recorded_step_ns": i, "overhead": i / b - 1.0,
                "ratings_per_s": batch * 1e9 / i, "rounds_off": off, "rounds_on": on}


def _python_vs_compiled(wl, params, data, batch, rounds, steps):
    with _stores() as st:
        views = st.views()
        clocks, log = Clocks(views), StalenessLog(views)
        clocks.state[0] = RUNNING
        rule = SGD(wl.default_lr)
        ctx_c = wl.setup(params, data, rank=0, seed=0)
        core = CompiledStep(ctx_c, rank=0, batch=batch, rule=rule,
                            rule_state=rule.init(params), density=None,
                            density_state=None, slots=clocks.slots, rt=views["rt"],
                            stop=clocks.stop, log=log.arrays(),
                            rng=np.random.default_rng(0))
        ctx_p = wl.setup(params, data, rank=0, seed=0)
        step = PythonStep(wl, ctx_p, rank=0, rule=rule, rule_state=rule.init(params),
                          density=None, density_state=None, reader=Reader(clocks, log, 0),
                          clocks=clocks, params=params)
        rng = np.random.default_rng(0)

        def python_steps(n):
            t0 = time.perf_counter_ns()
            for k in range(n):
                grads, _ = step.compute(rng, batch)
                step.apply(grads, k)
                clocks.tick_iteration(0, beat=True)
            return (time.perf_counter_ns() - t0) / n

        core.run(10)
        python_steps(10)
        py, co = [], []
        for _ in range(rounds):
            py.append(python_steps(max(1, steps // 8)))
            co.append(_core_step_ns(core, steps))
        p, c = statistics.median(py), statistics.median(co)
        return {"batch": batch, "python_step_ns": p, "compiled_step_ns": c,
                "python_overhead_ns": p - c, "python_over_compiled": p / c,
                "rounds_python": py, "rounds_compiled": co}


def run(quick=False, rounds=None) -> dict:
    rounds = rounds or (5 if quick else 15)
    wl = workloads.get("mf", preset="default")
    params, data = wl.build(0)
    core = [_compiled(wl, params, data, b, rounds, max(2000, (200_000 if quick else 800_000)
                                                       // b)) for b in (1, 64, 256)]
    py = [_python_vs_compiled(wl, params, data, b, rounds, 400 if quick else 2000)
          for b in (256, 64)]
    ratios = {f"record_overhead_batch{c['batch']}": c["overhead"] for c in core}
    ratios.update({f"python_overhead_us_batch{p['batch']}": p["python_overhead_ns"] / 1e3
                   for p in py})
    # the reference: ~45 µs of Python around each batch-256 step before the core
    ratios["python_overhead_cut_vs_45us_batch256"] = 45_000 / py[0]["python_overhead_ns"]
    return {"scenario": "instrumentation", "rounds": rounds, "workload": wl.config(),
            "compiled": core, "python": py, "ratios": ratios}


def format_table(result) -> str:
    lines = [f"instrumentation: median of {result['rounds']} rounds, mf default preset",
             f"{'batch':>6}{'stride':>8}{'bare ns':>10}{'recorded ns':>13}{'overhead':>10}"
             f"{'Mratings/s':>12}"]
    for c in result["compiled"]:
        lines.append(f"{c['batch']:>6}{c['stride']:>8}{c['bare_step_ns']:>10.0f}"
                     f"{c['recorded_step_ns']:>13.0f}{c['overhead'] * 100:>9.2f}%"
                     f"{c['ratings_per_s'] / 1e6:>12.2f}")
    lines.append(f"{'batch':>6}{'python µs':>11}{'compiled µs':>13}{'overhead µs':>13}"
                 f"{'ratio':>8}")
    for p in result["python"]:
        lines.append(f"{p['batch']:>6}{p['python_step_ns'] / 1e3:>11.2f}"
                     f"{p['compiled_step_ns'] / 1e3:>13.2f}"
                     f"{p['python_overhead_ns'] / 1e3:>13.2f}{p['python_over_compiled']:>8.1f}")
    return "\n".join(lines)
