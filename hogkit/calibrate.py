"""Calibrating the simulator against real runs: fit a delay model, compare staleness.

:func:`fit_delays` fits per-worker step times (and their spread) to a live run;
:func:`compare_gaps` compares two runs' update-gap distributions; :func:`agreement`
simulates the twin of a live run and compares the two.
"""

from __future__ import annotations

import math

import numpy as np

from hogkit.engine.delays import StepTimes
from hogkit.engine.run import Run
from hogkit.engine.settings import Outputs, Workers
from hogkit.errors import InvalidArgument
from hogkit.validation import check_float

__all__ = ["fit_delays", "compare_gaps", "agreement"]

def fit_delays(run, *, sigma=0.0, events=None) -> StepTimes:
    """A compute-time model fitted to a real run (``hogkit.train``'s :class:`Run`).

    Each worker's mean step time is ``run.wall_s / iterations`` (virtual time for a
    simulated run; waits included, so
    under Async it is the compute time); the fastest sets the base and the others get
    ``speeds`` relative to it. Fit on a run with a time budget (``seconds=``): with a
    step count every worker runs the same number of iterations and the speeds read
    as equal. With ``events`` (the ``update`` records of
    ``events.jsonl``, or its path) the spread ``sigma`` of a log-normal base is the
    standard deviation of each worker's log step intervals (time between consecutive
    recorded events over the steps between them, pooled; the compiled engine records
    every k-th event); otherwise
    ``sigma`` as given (0: constant). The base keeps the mean: ``median =
    mean·exp(−sigma²/2)``. Not modelled: that real step times drift and correlate.
    """
    from hogkit.engine.delays import Constant, LogNormal
    its = [max(int(pw["iterations"]), 1) for pw in run.per_worker]
    span = run.extra["virtual_time_s"] if run.simulated else run.wall_s
    per = [span / i for i in its]
    if events is not None:
        if isinstance(events, (str, bytes)) or hasattr(events, "__fspath__"):
            from hogkit.report import read_events
            events = read_events(events)
        logs = []
        for r in range(len(its)):
            ev = sorted((e["step"], e["t_ns"]) for e in events
                        if e.get("type", "update") == "update" and e["rank"] == r)
            st, t = (np.array(c, dtype=np.float64).reshape(-1) for c in zip(*ev)) if ev \
                else (np.zeros(0), np.zeros(0))
            ds, dt = np.diff(st), np.diff(t)
            ok = (ds > 0) & (dt > 0)
            # the ring may keep every k-th event only: an interval per step
            d = dt[ok] / ds[ok]
            if len(d) > 2:
                ld = np.log(d)
                logs.append(ld - ld.mean())
        if logs:
            sigma = float(np.concatenate(logs).std())
    sigma = check_float("sigma", sigma, min_value=0.0)
    fastest = min(per)
    base = (Constant(fastest) if sigma == 0.0
            else LogNormal(median=fastest * math.exp(-sigma * sigma / 2), sigma=sigma))
    return StepTimes(base=base, speeds=tuple(p / fastest for p in per))


def _hist(run_or_summary):
    st = (run_or_summary.staleness if isinstance(run_or_summary, Run)
          else run_or_summary["staleness"])
    gap = st["update_gap"]
    h = {int(k): int(v) for k, v in gap["histogram"].items()}
    return h, float(gap["mean"])


def compare_gaps(a, b) -> dict:
    """Compare two runs' update-gap distributions (Runs or summaries):
    ``{"tv": total-variation distance in [0, 1], "mean_a", "mean_b", "mean_ratio"
    (a/b), "p_a", "p_b" (normalised histograms)}``. Overflow bins compare as values."""
    ha, ma = _hist(a)
    hb, mb = _hist(b)
    na, nb = sum(ha.values()), sum(hb.values())
    if not na or not nb:
        raise InvalidArgument(f"both runs need updates to compare (got {na} and {nb})")
    keys = sorted(set(ha) | set(hb))
    pa = {k: ha.get(k, 0) / na for k in keys}
    pb = {k: hb.get(k, 0) / nb for k in keys}
    tv = 0.5 * sum(abs(pa[k] - pb[k]) for k in keys)
    return {"tv": tv, "mean_a": ma, "mean_b": mb,
            "mean_ratio": ma / mb if mb else (math.inf if ma else 1.0), "p_a": pa, "p_b": pb}


def agreement(real, workload, *, policy=None, rule=None, batch=None, sigma=0.0,
              events=None, seed=0, engine="auto") -> dict:
    """Simulate the twin of a real run and compare their update gaps.

    ``real``: the :class:`Run` of ``hogkit.train`` (same ``workload``, ``policy``,
    ``rule``, ``batch`` as given here). The twin has the same workers and total
    iterations and delays from :func:`fit_delays`. Returns :func:`compare_gaps`
    (``a`` = simulated, ``b`` = real) plus ``"delays"`` (the fitted model's config)
    and ``"simulated"`` (the twin's summary).
    """
    times = fit_delays(real, sigma=sigma, events=events)
    steps = sum(int(pw["iterations"]) for pw in real.per_worker)
    from hogkit.engine.simulator import simulate
    sim = simulate(workload, workers=Workers(real.workers, delays=times), policy=policy,
                   rule=rule, batch=batch, steps=steps, seed=seed, engine=engine,
                   outputs=Outputs(keep_params=False))
    out = compare_gaps(sim, real)
    out["delays"] = times.config()
    out["simulated"] = sim.summary()
    return out
