"""Staleness-correcting update rules as the number of workers grows (simulated).

Claims checked:

- Staleness-aware SGD (Zhang et al., IJCAI 2016): dividing the learning rate by the
  gradient's staleness τ keeps asynchronous SGD stable where the plain rule is not.
- DC-ASGD (Zheng et al., ICML 2017): a first-order Taylor correction
  ``g + λ g⊙g⊙(w − w_bak)`` (constant λ, or adaptive λ_t = λ0/sqrt(MS)) compensates
  the delay.
- Gap-Aware (Barkai et al., ICLR 2020): dividing the step by the *gap*
  ``1 + |w_now − w_read| / C`` keeps large learning rates usable with many workers,
  and "with GA, momentum helps even with many workers".

Setup: ``hogkit.sweep`` of ``hogkit.simulate`` runs (virtual time, exact staleness,
deterministic per seed) on ``mf`` (default preset), W ∈ ``workers`` virtual workers
with log-normal step times, the same number of updates in every cell, three seeds.
**Each rule at its own learning rate**: every (rule, W) cell runs the rule's lr grid
and the table reports the lr with the lowest mean final loss over the seeds (a
diverged seed makes an lr lose). Momentum variants run at a **matched effective
step**: lr·(1 − μ) for each lr of the plain grid, so that a steady gradient moves the
parameters as far per update as without momentum. A run that produces a non-finite
gradient is *diverged* (hogkit's guard stops it before anything non-finite is
written).

    python experiments/staleness_rules.py [--quick] [--out docs/experiments/staleness_rules]

Writes ``cells.jsonl`` (the sweep's table, one row per run: resumable),
``results.json`` (the rows without their curves, and the config) and, from it only,
``staleness_rules.png``; :func:`tables` renders the write-up's tables from it.
"""

from __future__ import annotations

import os

import _common

CONFIG = {
    "workload": "mf",
    "workers": [1, 4, 16, 64],
    "steps": 20_000,
    "delays": "lognormal:1e-3:0.5",
    "seeds": [0, 1, 2],
    "lrs": [0.05, 0.1, 0.2],
    "momentum": 0.9,
}
QUICK = {**CONFIG, "workers": [1, 16], "steps": 4_000, "seeds": [0, 1], "lrs": [0.1]}

#: name -> (sweep rule, uses momentum)
RULES = {
    "SGD": ("sgd", False),
    "staleness-aware": ("staleness-aware", False),
    "DC-ASGD (constant)": ("dc-asgd", False),
    "DC-ASGD (adaptive)": ("dc-asgd-adaptive", False),
    "Gap-Aware": ("gap-aware", False),
    "SGD + momentum": ("sgd", True),
    "Gap-Aware + momentum": ("gap-aware", True),
}


def grid(config):
    mu = config["momentum"]
    parts = []
    for name, (rule, mom) in RULES.items():
        lrs = [round(lr * (1 - mu), 6) for lr in config["lrs"]] if mom else config["lrs"]
        parts.append({"rule": [rule], "momentum": [mu if mom else 0.0], "lr": lrs,
                      "workers": config["workers"], "seed": config["seeds"]})
    return parts


def name_of(row):
    mom = bool(row.get("momentum"))
    return next(n for n, (r, m) in RULES.items() if r == row["rule"] and m == mom)


def run(config: dict, out_dir=None) -> dict:
    from hogkit import sweep
    from hogkit.report import environment
    path = os.path.join(out_dir, "cells.jsonl") if out_dir else None
    rows = sweep(grid(config), base={"workload": config["workload"],
                                     "steps": config["steps"], "delays": config["delays"]},
                 out=path, mode="sim", progress=True)
    keep = [{k: v for k, v in r.items() if k not in ("curve", "key")} for r in rows]
    return {"config": config, "rows": keep, "environment": environment()}


def tuned(results):
    """``{(name, W): (lr, mean, std, diverged seeds, n)}`` at each cell's best lr."""
    return _common.tuned(results["rows"], lambda r: (name_of(r), r["workers"]),
                         len(results["config"]["seeds"]))


def gaps(results):
    """Mean update gap per W (over every converged run)."""
    from hogkit.sweeps import aggregate
    return {w: m for (w,), (m, _, _) in aggregate(results["rows"], "gap_mean",
                                                    ("workers",)).items()}


def _cell(lr, mean, std, div, n):
    if mean is None:
        return f"diverged ({n}/{n})"
    text = f"{mean:.4f} ± {std:.4f} (lr {lr:g})"
    return text + (f", {div}/{n} diverged" if div else "")


def tables(results) -> str:
    """The write-up's tables, from ``results`` only."""
    ws = results["config"]["workers"]
    t = tuned(results)
    g = gaps(results)
    lines = ["| rule | " + " | ".join(f"W={w}" for w in ws) + " |",
             "|---|" + "---|" * len(ws)]
    for name in RULES:
        lines.append(f"| {name} | " + " | ".join(_cell(*t[(name, w)]) for w in ws) + " |")
    lines += ["", "| W | " + " | ".join(str(w) for w in ws) + " |",
              "|---|" + "---|" * len(ws),
              "| mean update gap | " + " | ".join(f"{g[w]:.1f}" for w in ws) + " |"]
    return "\n".join(lines)


def plot(results: dict, out_dir: str) -> str:
    plt = _common.pyplot()
    ws = results["config"]["workers"]
    t = tuned(results)
    finite = [v[1] for v in t.values() if v[1] is not None]
    top = max(finite) * 3 if finite else 1.0
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name in RULES:
        cells = [t[(name, w)] for w in ws]
        ys = [c[1] if c[1] is not None else top for c in cells]
        sd = [c[2] or 0.0 for c in cells]
        line, = ax.plot(ws, ys, marker="o", label=name,
                        ls="--" if "momentum" in name else "-")
        ax.fill_between(ws, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)],
                        color=line.get_color(), alpha=0.15)
        for w, c in zip(ws, cells):
            if c[1] is None:
                ax.plot([w], [top], marker="x", ms=12, mew=2.5, color=line.get_color())
    ax.axhline(top, color="gray", lw=0.5)
    ax.text(ws[0], top * 1.1, "x = diverged at every lr", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ws, [str(w) for w in ws])
    ax.set_xlabel("virtual workers (mean update gap ≈ W − 1)")
    ax.set_ylabel(f"MSE after {results['config']['steps']:,} updates")
    ax.set_title(f"mf, simulated, each rule at its best lr; mean ± std over "
                 f"{len(results['config']['seeds'])} seeds", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return _common.save(fig, out_dir, "staleness_rules.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/staleness_rules",
                        argv)


if __name__ == "__main__":
    main()
