"""Consistency policies in loss against (virtual) time: SSP vs BSP vs Async, and DSSP.

Claims checked:

- SSP (Ho et al., NIPS 2013): a bounded staleness s converges faster in wall time than
  both BSP (which waits for every straggler) and Async (whose unbounded staleness
  spoils progress per update), with a sweet spot in s.
- DSSP (Zhao et al., ICDCS 2019): on heterogeneous workers a dynamic bound in
  [s_lo, s_hi] beats SSP at either fixed bound.

Setup: ``hogkit.sweep`` of ``hogkit.simulate`` runs (virtual time, exact staleness,
deterministic per seed), W = 16 virtual workers with log-normal step times (median
1 ms, σ 0.5) and a fixed budget of virtual seconds, on ``mf`` (default preset) and
``logreg``. Two scenarios:

- ``transient``: every worker pauses 10 ms (about ten steps) on 2 % of its steps
  (``pauses:0.02:0.01``); the bound s swept from 0 (BSP) to ∞ (Async).
- ``heterogeneous``: persistent speed differences, 8 workers at full speed, 4 at half
  and 4 at a quarter; SSP at s_lo and s_hi against DSSP(s_lo, s_hi), plus BSP and
  Async.

**Each policy at its own learning rate**: every (scenario, workload, policy) runs the
workload's lr grid over three seeds, and the tables report the lr with the lowest
mean loss over the last quarter of the budget (each seed's evaluations there
averaged, then mean ± std over seeds; a diverged seed makes an lr lose). "Time to target" is
the first virtual time at which a seed's loss curve (evaluated 20 times per run,
linearly interpolated) reaches the target, the loss the best policy's mean curve has
at half the budget; a seed that never reaches it counts as not reached.

    python experiments/policies.py [--quick] [--out docs/experiments/policies]

Writes ``cells.jsonl`` (the sweep's table, resumable), ``results.json`` (every row,
curves as (t, loss)) and, from it only, ``policies.png``; :func:`tables` renders the
write-up's tables from it.
"""

from __future__ import annotations

import math
import os

import _common

BASE_DELAY = "lognormal:1e-3:0.5"
SCENARIOS = {
    "transient": {
        "delays": BASE_DELAY + ",pauses:0.02:0.01",
        "policies": ["bsp", "ssp:1", "ssp:2", "ssp:4", "ssp:8", "ssp:16", "ssp:32",
                     "async"],
    },
    "heterogeneous": {
        "delays": BASE_DELAY + "".join(f",straggler:{r}:{2 if r < 12 else 4}"
                                       for r in range(8, 16)),
        "policies": ["bsp", "ssp:1", "ssp:4", "dssp:1:4", "ssp:2", "ssp:8", "dssp:2:8",
                     "async"],
    },
}
CONFIG = {
    "workers": 16,
    "seconds": 1.5,
    "seeds": [0, 1, 2],
    "lrs": {"mf": [0.05, 0.1, 0.2], "logreg": [0.1, 0.2, 0.4]},
    "scenarios": SCENARIOS,
}
QUICK = {**CONFIG, "seconds": 0.3, "seeds": [0, 1], "lrs": {"mf": [0.1]},
         "scenarios": {k: {**v, "policies": ["bsp", "ssp:2", "async"]}
                       for k, v in SCENARIOS.items()}}


def grid(config):
    """``[(scenario, sweep part)]``: one part per (scenario, workload)."""
    return [(name, {"workload": [wl], **_common.pinned(wl), "delays": [sc["delays"]],
                    "policy": sc["policies"], "lr": lrs, "seed": config["seeds"]})
            for name, sc in config["scenarios"].items()
            for wl, lrs in config["lrs"].items()]


def run(config: dict, out_dir=None) -> dict:
    from hogkit import sweep
    from hogkit.report import environment
    path = os.path.join(out_dir, "cells.jsonl") if out_dir else None
    rows = []
    for label, part in grid(config):
        got = sweep(part, base={"workers": config["workers"], "seconds": config["seconds"]},
                    out=path, mode="sim", progress=True)
        rows += [{**_common.slim(r), "scenario": label} for r in got]
    return {"config": config, "rows": rows, "environment": environment()}


# --------------------------------------------------------------------------- analysis

def _group(r):
    return (r["scenario"], r["workload"], r["policy"])


def late_loss(row, seconds):
    """A run's mean loss over its evaluations in the last quarter of the budget (None
    for a diverged run)."""
    if not row["curve"]:
        return None
    ys = [y for t, y in row["curve"] if t >= 0.75 * seconds]
    return sum(ys) / len(ys)


def tuned(results):
    """``{(scenario, workload, policy): (lr, mean, std, diverged, n)}`` of the mean
    loss over the last quarter: an lr is picked on where its curves settle, not on
    where an oscillating curve happens to end."""
    T = results["config"]["seconds"]
    rows = [{**r, "late": late_loss(r, T)} for r in results["rows"]]
    return _common.tuned(rows, _group, len(results["config"]["seeds"]), y="late")


def edges(results):
    """``{(scenario, workload, policy): "low edge" | "high edge" | None}``: whether the
    tuned lr is the lowest or highest its group tried (its optimum may lie outside)."""
    return {k: e and f"{e} edge" for k, e in _common.edges(results["rows"], tuned(results),
                                                           _group).items()}


def at_tuned(results):
    """``(tuned, {key: the finished runs at its tuned lr})``."""
    t = tuned(results)
    return t, _common.at_tuned(results["rows"], t, _group)


def targets(results, runs=None):
    """``{(scenario, workload): target}``: the best tuned policy's mean loss at half
    the budget."""
    runs = runs if runs is not None else at_tuned(results)[1]
    half = results["config"]["seconds"] / 2
    out = {}
    for (sc, wl, _), rs in runs.items():
        if rs:
            y = _common.value_at(*_common.mean_curve(rs), half)
            out[(sc, wl)] = min(out.get((sc, wl), math.inf), y)
    return out


def summary(results):
    """Per (scenario, workload, policy) at its tuned lr: the tuned tuple, updates,
    wait fraction, mean gap and the times to target of the seeds that reached it."""
    t, runs = at_tuned(results)
    tg = targets(results, runs)
    out = {}
    for key, cell in t.items():
        rs = runs[key]
        if not rs:
            out[key] = {"cell": cell, "runs": 0}
            continue
        times = [_common.time_to(r["curve"], tg[key[:2]]) for r in rs]
        reached = [x for x in times if x is not None]
        tt = _common.mean_std(reached) if reached else (None, None)
        out[key] = {"cell": cell, "runs": len(rs),
                    "final": _common.mean_std([r["final_loss"] for r in rs]),
                    "updates": sum(r["updates"] for r in rs) / len(rs),
                    "wait": sum(r["wait_fraction"] for r in rs) / len(rs),
                    "gap": sum(r["gap_mean"] for r in rs) / len(rs),
                    "reached": len(reached), "tt_mean": tt[0], "tt_std": tt[1]}
    return out


def tables(results) -> str:
    """The write-up's tables, from ``results`` only."""
    cfg, s, tg = results["config"], summary(results), targets(results)
    edge = edges(results)
    lines = []
    for sc, spec in cfg["scenarios"].items():
        for wl in cfg["lrs"]:
            lines += [f"**{sc}, {wl}** (target {tg[(sc, wl)]:.4f}; budget "
                      f"{cfg['seconds']:g} virtual s)", "",
                      "| policy | lr | mean loss, last quarter | loss at budget | "
                      "time to target (s) | updates | wait fraction | mean gap |",
                      "|---|---|---|---|---|---|---|---|"]
            for pol in spec["policies"]:
                x = s[(sc, wl, pol)]
                lr = x["cell"][0]
                if not x["runs"]:
                    lines.append(f"| {pol} | – | {_common.loss_cell(x['cell'])} | – | – | – | – "
                                 f"| – |")
                    continue
                n = x["runs"]
                tt = ("not reached" if not x["reached"] else
                      f"{x['tt_mean']:.3f} ± {x['tt_std']:.3f}"
                      + (f" ({x['reached']}/{n})" if x["reached"] < n else ""))
                mark = f" ({edge[(sc, wl, pol)]})" if edge.get((sc, wl, pol)) else ""
                lines.append(f"| {pol} | {lr:g}{mark} | {_common.loss_cell(x['cell'])} | "
                             f"{x['final'][0]:.4f} ± {x['final'][1]:.4f} | {tt} | "
                             f"{x['updates']:,.0f} | {x['wait']:.2f} | {x['gap']:.1f} |")
            lines.append("")
    return "\n".join(lines).rstrip()


def plot(results: dict, out_dir: str) -> str:
    plt = _common.pyplot()
    cfg = results["config"]
    t, runs = at_tuned(results)
    tg = targets(results, runs)
    panels = [(sc, wl) for sc in cfg["scenarios"] for wl in cfg["lrs"]]
    fig, axes = plt.subplots(len(cfg["scenarios"]), len(cfg["lrs"]),
                             figsize=(5.2 * len(cfg["lrs"]), 3.8 * len(cfg["scenarios"])),
                             squeeze=False)
    for ax, (sc, wl) in zip(axes.flat, panels):
        for pol in cfg["scenarios"][sc]["policies"]:
            cell = t[(sc, wl, pol)]
            if not runs[(sc, wl, pol)]:
                continue
            ts, ys = _common.mean_curve(runs[(sc, wl, pol)])
            ax.plot(ts, ys, label=f"{pol} (lr {cell[0]:g})",
                    ls="--" if pol.startswith("dssp") else "-",
                    lw=2.2 if pol in ("bsp", "async") else 1.2)
        ax.axhline(tg[(sc, wl)], color="gray", lw=0.6, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("virtual seconds")
        ax.set_ylabel("training loss")
        ax.set_title(f"{sc}, {wl}: W={cfg['workers']}, mean of "
                     f"{len(cfg['seeds'])} seeds", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    return _common.save(fig, out_dir, "policies.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/policies",
                        argv)


if __name__ == "__main__":
    main()
