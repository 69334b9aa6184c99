"""Scenario ``scaling``: updates and samples per second with 1 to N workers.

Models, all Hogwild! (async, plain SGD), each at its workload's default batch and lane:

- ``large``: factors 2 × 200k × 64 float32 = 102 MB (far beyond L3), 4M ratings.
  Each update touches random rows, so the run is bound by memory latency and
  bandwidth; workers rarely collide.
- ``hot``: 200 × 200 × 8 factors (12.8 kB, in L1/L2), Zipf-skewed rows: workers
  collide constantly and cache lines bounce between cores.
- ``logreg`` (not in the default set): the dense-ish logistic regression, whose
  every minibatch writes rows of one shared weight vector that every worker writes
  (issue 26's slow mode: 1.04x with two workers on a 2-core machine).

Worker counts: 1, 2, 4, ... up to ``workers`` (default: the cores, at most 2).

The baseline is the one-worker run of the same model, measured in the same
invocation; the figure is ``speedup = updates/s(N) / updates/s(1)``, the median
over rounds. The parent only supervises (no loss evaluation, no event log), so it
stays off the cores.
"""

from __future__ import annotations

import os
import statistics

import hogkit
from hogkit import workloads
from hogkit.engine.runtime import train

MODELS = ("large", "hot")


def _measure(workload, workers, seconds, batch):
    run = train(workload, workers=workers,
                outputs=hogkit.Outputs(eval_every=None, progress=False, keep_params=False),
                seconds=seconds, batch=batch)
    return run.updates_per_s, run


def run(quick=False, rounds=None, workers=None, models=MODELS, seconds=None) -> dict:
    rounds = rounds or (1 if quick else 3)
    seconds = seconds or (1.0 if quick else 4.0)
    top = workers or min(os.cpu_count() or 1, 2)
    counts = sorted({1, top} | {2 ** k for k in range(1, 8) if 2 ** k < top})
    result = {"scenario": "scaling", "rounds": rounds, "seconds_per_run": seconds,
              "cpus": os.cpu_count(), "models": {}, "ratios": {}}
    for model in models:
        if model == "logreg":
            wl = workloads.get("logreg")
        else:
            opts = {"preset": "large"} if model == "large" else {"preset": "hot"}
            if quick and model == "large":
                opts = {"preset": "large", "n_ratings": 1_000_000}
            wl = workloads.get("mf", **opts)
        batch = wl.default_batch
        per = {}
        for n in counts:
            runs = [_measure(wl, n, seconds, batch)[1] for _ in range(rounds)]
            rates = [r.updates_per_s for r in runs]
            samples = [r.extra["samples"] / r.wall_s for r in runs]
            per[n] = {"updates_per_s": statistics.median(rates), "all": rates,
                      "samples_per_s": statistics.median(samples)}
        base, base_s = per[1]["updates_per_s"], per[1]["samples_per_s"]
        for n in counts:
            per[n]["speedup"] = per[n]["updates_per_s"] / base
            per[n]["samples_speedup"] = per[n]["samples_per_s"] / base_s
        result["models"][model] = {"config": wl.config(), "batch": batch,
                                   "by_workers": {str(n): per[n] for n in counts}}
        result["ratios"][f"{model}_speedup_{top}"] = per[top]["speedup"]
    return result


def format_table(result) -> str:
    lines = [f"scaling: median of {result['rounds']} run(s) x {result['seconds_per_run']} s, "
             f"{result['cpus']} cpus",
             f"{'model':<8}{'workers':>8}{'updates/s':>14}{'samples/s':>14}{'speedup':>10}"]
    for model, m in result["models"].items():
        for n, r in m["by_workers"].items():
            lines.append(f"{model:<8}{n:>8}{r['updates_per_s']:>14,.0f}"
                         f"{r.get('samples_per_s', float('nan')):>14,.0f}"
                         f"{r['speedup']:>10.2f}")
    return "\n".join(lines)


def format_markdown(result) -> str:
    """The RESULTS.md table: per model, M samples/s and the speedup over one worker at
    each worker count."""
    rows = ["| model | workers | M samples/s | speedup |", "|---|---|---|---|"]
    for model, m in result["models"].items():
        for n, r in m["by_workers"].items():
            rows.append(f"| `{model}` | {n} | {r['samples_per_s'] / 1e6:.2f} | "
                        f"{r['samples_speedup']:.2f} |")
    return "\n".join(rows)
