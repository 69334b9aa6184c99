"""Staleness-correcting update rules as the number of workers grows (simulated).

Claims checked:

- Staleness-aware SGD (Zhang et al., IJCAI 2016): dividing the learning rate by the
  gradient's staleness τ keeps asynchronous SGD stable where the plain rule is not.
- DC-ASGD (Zheng et al., ICML 2017): a first-order Taylor correction
  ``g + λ g⊙g⊙(w − w_bak)`` compensates the delay.
- Gap-Aware (Barkai et al., ICLR 2020): dividing the step by the *gap*
  ``1 + |w_now − w_read| / C`` keeps large learning rates usable with many workers,
  and "with GA, momentum helps even with many workers".

Setup: ``hogkit.simulate`` (virtual time, exact staleness, deterministic) on the
``mf`` workload (default preset), W ∈ ``workers`` virtual workers with log-normal
step times, the same total number of updates for every cell, so the mean update gap
grows as ≈ W − 1. Each rule at the same learning rate; momentum variants at a
smaller one (the mf gradient is summed over the batch, so momentum 0.9 at lr 0.1
diverges even sequentially). A run that produces a non-finite gradient is recorded
as *diverged* (hogkit's guard stops it before anything non-finite is written).

    python experiments/staleness_rules.py [--quick] [--out docs/experiments/staleness_rules]

Writes ``results.json`` and, from it only, ``staleness_rules.png``.
"""

from __future__ import annotations


import _common

CONFIG = {
    "workload": "mf",
    "workers": [1, 4, 16, 32, 64],
    "steps": 40_000,
    "lr": 0.1,
    "momentum_lr": 0.01,
    "momentum": 0.9,
    "delays": "lognormal:1e-3:0.5",
    "seed": 0,
}
QUICK = {**CONFIG, "workers": [1, 16, 64], "steps": 10_000}


def rules(config):
    from hogkit import SGD, DelayCompensated, GapAware, StalenessAware
    lr, mlr, mu = config["lr"], config["momentum_lr"], config["momentum"]
    return {
        "SGD": SGD(lr),
        "staleness-aware": StalenessAware(lr),
        "DC-ASGD": DelayCompensated(lr),
        "Gap-Aware": GapAware(lr),
        "SGD + momentum": SGD(mlr, momentum=mu),
        "Gap-Aware + momentum": GapAware(mlr, momentum=mu),
    }


def run(config: dict) -> dict:
    from hogkit import simulate
    from hogkit.errors import NonFiniteGradient
    from hogkit.report import environment
    cells = []
    for name, rule in rules(config).items():
        for w in config["workers"]:
            cell = {"rule": name, "workers": w, "rule_config": repr(rule)}
            try:
                r = simulate(config["workload"], workers=w, rule=rule, steps=config["steps"],
                             seed=config["seed"], delays=config["delays"], keep_params=False)
                cell.update(final_loss=r.final_loss, initial_loss=r.initial_loss,
                            gap_mean=r.staleness["update_gap"]["mean"],
                            gap_p99=r.staleness["update_gap"]["p99"], diverged=False,
                            curve=[(p["updates"], p["loss"]) for p in r.loss_curve])
            except NonFiniteGradient as e:
                cell.update(final_loss=None, diverged=True, note=str(e).split(";")[0])
            cells.append(cell)
            print(f"{name:<22} W={w:<3} "
                  + ("diverged" if cell["diverged"] else f"loss {cell['final_loss']:.5f} "
                     f"(mean gap {cell['gap_mean']:.1f})"), flush=True)
    return {"config": config, "cells": cells, "environment": environment()}


def plot(results: dict, out_dir: str) -> str:
    plt = _common.pyplot()
    cells = results["cells"]
    ws = results["config"]["workers"]
    names = list(dict.fromkeys(c["rule"] for c in cells))
    finite = [c["final_loss"] for c in cells if not c["diverged"]]
    top = max(finite) * 3 if finite else 1.0
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name in names:
        row = [next(c for c in cells if c["rule"] == name and c["workers"] == w) for w in ws]
        ys = [c["final_loss"] if not c["diverged"] else top for c in row]
        line, = ax.plot(ws, ys, marker="o", label=name,
                        ls="--" if "momentum" in name else "-")
        for w, c in zip(ws, row):
            if c["diverged"]:
                ax.plot([w], [top], marker="x", ms=12, mew=2.5, color=line.get_color())
    ax.axhline(top, color="gray", lw=0.5)
    ax.text(ws[0], top * 1.1, "x = diverged", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ws, [str(w) for w in ws])
    ax.set_xlabel("virtual workers (mean update gap ≈ W − 1)")
    ax.set_ylabel(f"MSE after {results['config']['steps']:,} updates")
    ax.set_title(f"mf, simulated: lr {results['config']['lr']} "
                 f"(momentum runs: lr {results['config']['momentum_lr']}, "
                 f"μ {results['config']['momentum']})", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return _common.save(fig, out_dir, "staleness_rules.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/staleness_rules", argv)


if __name__ == "__main__":
    main()
