"""Update density × staleness: how much of each update must be applied, and does
keeping the rest as a residual matter, as workers (and so staleness) grow?

The stale-value tolerance question: applying only a fraction d of every update
(the top-|d·n| entries by magnitude) cuts write traffic and conflicts; the unsent
part is either dropped or kept as a per-worker residual added to the next update
(error feedback). This experiment measures the loss reached after the same number
of updates for d ∈ ``densities`` × W ∈ ``workers`` virtual workers, residual on and
off, on sparse logistic regression with plain SGD.

Setup: ``hogkit.simulate`` (virtual time, exact staleness, deterministic), log-normal
step times, the same total number of updates per cell.

    python experiments/density_staleness.py [--quick] [--out docs/experiments/density_staleness]

Writes ``results.json`` and, from it only, ``density_staleness.png``.
"""

from __future__ import annotations


import _common

CONFIG = {
    "workload": "logreg",
    "workers": [1, 8, 32, 64],
    "densities": [1.0, 0.5, 0.25, 0.1],
    "residual": [True, False],
    "steps": 30_000,
    "delays": "lognormal:1e-3:0.5",
    "seed": 0,
}
QUICK = {**CONFIG, "workers": [1, 32], "densities": [1.0, 0.25], "steps": 6_000}


def run(config: dict) -> dict:
    from hogkit import Density, simulate
    from hogkit.report import environment
    cells = []
    for d in config["densities"]:
        for residual in (config["residual"] if d < 1.0 else [True]):
            for w in config["workers"]:
                dens = None if d == 1.0 else Density(d, how="topk", residual=residual)
                r = simulate(config["workload"], workers=w, density=dens,
                             steps=config["steps"], seed=config["seed"],
                             delays=config["delays"], keep_params=False)
                cell = {"density": d, "residual": residual if d < 1.0 else None,
                        "workers": w, "final_loss": r.final_loss,
                        "initial_loss": r.initial_loss,
                        "gap_mean": r.staleness["update_gap"]["mean"],
                        "curve": [(p["updates"], p["loss"]) for p in r.loss_curve]}
                cells.append(cell)
                print(f"d={d:<5} residual={str(cell['residual']):<5} W={w:<3} "
                      f"loss {r.final_loss:.4f} (mean gap {cell['gap_mean']:.1f})", flush=True)
    return {"config": config, "cells": cells, "environment": environment()}


def plot(results: dict, out_dir: str) -> str:
    plt = _common.pyplot()
    cfg, cells = results["config"], results["cells"]
    ws = cfg["workers"]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for d in cfg["densities"]:
        for residual in (cfg["residual"] if d < 1.0 else [None]):
            row = [next(c for c in cells if c["density"] == d and c["residual"] == residual
                        and c["workers"] == w) for w in ws]
            label = "d = 1 (full update)" if d == 1.0 else \
                f"d = {d}, {'residual kept' if residual else 'rest dropped'}"
            ax.plot(ws, [c["final_loss"] for c in row], marker="o", label=label,
                    ls="-" if residual in (True, None) else ":")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axhline(cells[0]["initial_loss"], color="gray", lw=0.8, ls="--")
    ax.text(ws[0], cells[0]["initial_loss"] * 1.08, "initial loss", fontsize=8)
    ax.set_xticks(ws, [str(w) for w in ws])
    ax.set_xlabel("virtual workers (mean update gap ≈ W − 1)")
    ax.set_ylabel(f"log-loss after {cfg['steps']:,} updates")
    ax.set_title(f"{cfg['workload']}, simulated: update density (top-k) × staleness",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return _common.save(fig, out_dir, "density_staleness.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/density_staleness", argv)


if __name__ == "__main__":
    main()
