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
workload's lr grid over three seeds, and the tables report the lr with the lowest mean
loss at the end of the budget (a diverged seed makes an lr lose). "Time to target" is
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
    return [(name, {"workload": [wl], "delays": [sc["delays"]], "policy": sc["policies"],
                    "lr": lrs, "seed": config["seeds"]})
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
        for r in got:
            row = {k: v for k, v in r.items() if k not in ("curve", "key")}
            row["scenario"] = label
            row["curve"] = ([[round(t, 6), float(f"{loss:.6g}")] for t, _, loss in r["curve"]]
                            if r.get("curve") else None)
            rows.append(row)
    return {"config": config, "rows": rows, "environment": environment()}


# --------------------------------------------------------------------------- analysis

def _group(r):
    return (r["scenario"], r["workload"], r["policy"])


def tuned(results):
    """``{(scenario, workload, policy): (lr, mean, std, diverged, n)}``."""
    return _common.tuned(results["rows"], _group, len(results["config"]["seeds"]))


def _runs(results, key, lr):
    return [r for r in results["rows"] if _group(r) == key and r["lr"] == lr
            and r["final_loss"] is not None]


def mean_curve(runs):
    """Mean loss over seeds at each evaluation time (runs share the time grid)."""
    n = min(len(r["curve"]) for r in runs)
    return ([runs[0]["curve"][i][0] for i in range(n)],
            [sum(r["curve"][i][1] for r in runs) / len(runs) for i in range(n)])


def _at(curve_t, curve_y, t):
    for (t0, y0), (t1, y1) in zip(zip(curve_t, curve_y), zip(curve_t[1:], curve_y[1:])):
        if t0 <= t <= t1:
            return y0 + (y1 - y0) * (t - t0) / (t1 - t0) if t1 > t0 else y1
    return curve_y[-1]


def time_to(curve, target):
    """First time a (t, loss) curve reaches ``target`` (linear between points), or None."""
    for (t0, y0), (t1, y1) in zip(curve, curve[1:]):
        if y1 <= target:
            if y0 <= target or y1 == y0:
                return t0 if y0 <= target else t1
            return t0 + (t1 - t0) * (y0 - target) / (y0 - y1)
    return None


def targets(results):
    """``{(scenario, workload): target}``: the best tuned policy's mean loss at half
    the budget."""
    t, half = tuned(results), results["config"]["seconds"] / 2
    out = {}
    for (sc, wl, pol), (lr, mean, *_rest) in t.items():
        if mean is None:
            continue
        ts, ys = mean_curve(_runs(results, (sc, wl, pol), lr))
        y = _at(ts, ys, half)
        out[(sc, wl)] = min(out.get((sc, wl), math.inf), y)
    return out


def summary(results):
    """Per (scenario, workload, policy) at its tuned lr: the tuned tuple, updates,
    wait fraction, mean gap and the times to target of the seeds that reached it."""
    t, tg = tuned(results), targets(results)
    out = {}
    for key, cell in t.items():
        runs = _runs(results, key, cell[0])
        if not runs:
            out[key] = {"cell": cell, "runs": 0}
            continue
        times = [time_to(r["curve"], tg[key[:2]]) for r in runs]
        reached = [x for x in times if x is not None]
        m = len(reached)
        out[key] = {"cell": cell, "runs": len(runs),
                    "updates": sum(r["updates"] for r in runs) / len(runs),
                    "wait": sum(r["wait_fraction"] for r in runs) / len(runs),
                    "gap": sum(r["gap_mean"] for r in runs) / len(runs),
                    "reached": m,
                    "tt_mean": sum(reached) / m if m else None,
                    "tt_std": (math.sqrt(sum((x - sum(reached) / m) ** 2 for x in reached)
                                         / (m - 1)) if m > 1 else 0.0) if m else None}
    return out


def _loss(cell):
    lr, mean, std, div, n = cell
    if mean is None:
        return f"diverged ({n}/{n})"
    return f"{mean:.4f} ± {std:.4f}" + (f" ({div}/{n} diverged)" if div else "")


def tables(results) -> str:
    """The write-up's tables, from ``results`` only."""
    cfg, s, tg = results["config"], summary(results), targets(results)
    lines = []
    for sc, spec in cfg["scenarios"].items():
        for wl in cfg["lrs"]:
            lines += [f"**{sc}, {wl}** (target {tg[(sc, wl)]:.4f}; budget "
                      f"{cfg['seconds']:g} virtual s)", "",
                      "| policy | lr | loss at budget | time to target (s) | updates | "
                      "wait fraction | mean gap |", "|---|---|---|---|---|---|---|"]
            for pol in spec["policies"]:
                x = s[(sc, wl, pol)]
                lr = x["cell"][0]
                if not x["runs"]:
                    lines.append(f"| {pol} | – | {_loss(x['cell'])} | – | – | – | – |")
                    continue
                n = x["runs"]
                tt = ("not reached" if not x["reached"] else
                      f"{x['tt_mean']:.3f} ± {x['tt_std']:.3f}"
                      + (f" ({x['reached']}/{n})" if x["reached"] < n else ""))
                lines.append(f"| {pol} | {lr:g} | {_loss(x['cell'])} | {tt} | "
                             f"{x['updates']:,.0f} | {x['wait']:.2f} | {x['gap']:.1f} |")
            lines.append("")
    return "\n".join(lines).rstrip()


def plot(results: dict, out_dir: str) -> str:
    plt = _common.pyplot()
    cfg, t, tg = results["config"], tuned(results), targets(results)
    panels = [(sc, wl) for sc in cfg["scenarios"] for wl in cfg["lrs"]]
    fig, axes = plt.subplots(len(cfg["scenarios"]), len(cfg["lrs"]),
                             figsize=(5.2 * len(cfg["lrs"]), 3.8 * len(cfg["scenarios"])),
                             squeeze=False)
    for ax, (sc, wl) in zip(axes.flat, panels):
        for pol in cfg["scenarios"][sc]["policies"]:
            cell = t[(sc, wl, pol)]
            runs = _runs(results, (sc, wl, pol), cell[0])
            if not runs:
                continue
            ts, ys = mean_curve(runs)
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
