"""Hogwild! on sparse logistic regression: speed-up and per-update progress vs conflicts.

Claim (Niu, Recht, Ré, Wright, "Hogwild!", NIPS 2011): when each update touches a
small part of the model, lock-free parallel SGD runs with a near-linear speed-up and
the occasional overwritten update does not slow convergence per update. Conflicts
grow with skew: with Zipf-popular features, every update touches the same few hot
coordinates.

Setup: ``hogkit.train("logreg")`` with feature popularity Zipf(a), a ∈ ``zipfs``
(0 = uniform), 1 and 2 live worker processes, the same total number of updates;
measured: updates/s (→ speed-up), final loss (→ progress per update), and the
measured update gap τ. Run:

    python experiments/hogwild_sparsity.py [--quick] [--out docs/experiments/hogwild_sparsity]

It writes ``results.json`` and, from that file only, ``speedup.png``.
"""

from __future__ import annotations

import statistics

import _common

CONFIG = {
    "zipfs": [0.0, 1.1, 1.5, 2.0],
    "workers": [1, 2],
    "steps": 120_000,
    "repeats": 3,
    "seed": 0,
}
QUICK = {**CONFIG, "zipfs": [0.0, 2.0], "steps": 20_000, "repeats": 1}


def run(config: dict) -> dict:
    """Train every (zipf, workers) cell ``repeats`` times; return the medians."""
    import hogkit
    cells = []
    for a in config["zipfs"]:
        for w in config["workers"]:
            runs = [hogkit.train("logreg", workers=w, steps=config["steps"],
                                 seed=config["seed"] + k, workload_options={"zipf": a},
                                 eval_every=None, progress=False, keep_params=False)
                    for k in range(config["repeats"])]
            cells.append({
                "zipf": a, "workers": w,
                "updates_per_s": statistics.median(r.updates_per_s for r in runs),
                "final_loss": statistics.median(r.final_loss for r in runs),
                "initial_loss": runs[0].initial_loss,
                "gap_mean": statistics.median(r.staleness["update_gap"]["mean"] for r in runs),
                "gap_p99": statistics.median(r.staleness["update_gap"]["p99"] for r in runs),
            })
    for c in cells:
        base = next(b for b in cells if b["zipf"] == c["zipf"] and b["workers"] == 1)
        c["speedup"] = c["updates_per_s"] / base["updates_per_s"]
        c["loss_ratio_vs_1"] = c["final_loss"] / base["final_loss"]
    from hogkit.report import environment
    return {"config": config, "cells": cells, "environment": environment()}


def plot(results: dict, out_dir: str) -> str:
    plt = _common.pyplot()
    cells = results["cells"]
    top = max(results["config"]["workers"])
    zs = results["config"]["zipfs"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    sp = [next(c["speedup"] for c in cells if c["zipf"] == z and c["workers"] == top)
          for z in zs]
    axes[0].bar([str(z) for z in zs], sp)
    axes[0].axhline(top, ls="--", c="gray", label="linear")
    axes[0].set_xlabel("Zipf exponent of feature popularity (0 = uniform)")
    axes[0].set_ylabel(f"speed-up, {top} workers over 1")
    axes[0].legend()
    for w in results["config"]["workers"]:
        axes[1].plot([str(z) for z in zs],
                     [next(c["final_loss"] for c in cells if c["zipf"] == z and c["workers"] == w)
                      for z in zs], marker="o", label=f"{w} worker(s)")
    axes[1].set_xlabel("Zipf exponent")
    axes[1].set_ylabel(f"log-loss after {results['config']['steps']:,} updates")
    axes[1].legend()
    fig.suptitle("Hogwild! sparse logistic regression: same updates, 1 vs "
                 f"{top} lock-free workers")
    return _common.save(fig, out_dir, "speedup.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/hogwild_sparsity", argv)


if __name__ == "__main__":
    main()
