"""Local SGD and HLSGD's overlapped merges at a fixed wall time, live.

Claim checked (HLSGD, Zhou et al. 2020): local SGD (each worker steps on a private
replica and merges ``Δ/W`` into the shared model every h steps) with the merge
*overlapped* with the next local phase wins at a fixed wall time over synchronous
training, and over local SGD whose merges stop the worker.

Setup: ``hogkit.sweep`` of live ``hogkit.train`` runs: 2 worker processes on real
shared memory, the ``mlp`` workload (scikit-learn's digits, a 64-unit MLP in torch,
batch 32 per worker, a held-out fifth for the test accuracy), a fixed wall-time budget,
three seeds. Compared: BSP and Async on the shared model (the Hogwild! baseline), and
``local:h`` / ``local:h:overlap`` for h ∈ {4, 16, 64}. **lr tuned per method** on
{0.1, 0.2}. Reported at the budget: training loss, test accuracy, samples processed,
the wait fraction and the mean update gap (for local SGD: merges by others between a
worker's pull and its merge).

On one machine a merge is a memory add of the whole model (4,810 floats here),
not a network round: the overlap has little to hide, which is what this measures.

    python experiments/local_sgd.py [--quick] [--out docs/experiments/local_sgd]

Writes ``cells.jsonl`` (resumable), ``results.json`` and ``local_sgd.png``;
:func:`tables` renders the write-up's table from results.json.
"""

from __future__ import annotations

import os

import _common
from _common import pm

CONFIG = {
    "workload": "mlp",
    "workers": 2,
    "seconds": 2.0,
    "seeds": [0, 1, 2],
    "lrs": [0.1, 0.2],
    "policies": ["bsp", "async", "local:4", "local:4:overlap", "local:16",
                 "local:16:overlap", "local:64", "local:64:overlap"],
}
QUICK = {**CONFIG, "seconds": 1.5, "seeds": [0], "lrs": [0.1],
         "policies": ["async", "local:16:overlap"]}


def grid(config):
    return {"policy": config["policies"], "lr": config["lrs"], "seed": config["seeds"]}


def run(config: dict, out_dir=None) -> dict:
    from hogkit import sweep
    from hogkit.report import environment
    path = os.path.join(out_dir, "cells.jsonl") if out_dir else None
    rows = sweep(grid(config), base={"workload": config["workload"],
                                     "workers": config["workers"],
                                     "seconds": config["seconds"]},
                 out=path, mode="live", progress=True)
    return {"config": config, "rows": [_common.slim(r) for r in rows],
            "environment": environment()}


def tuned(results):
    return _common.tuned(results["rows"], lambda r: r["policy"],
                         len(results["config"]["seeds"]))


def summary(results):
    """``{policy: dict}`` at each policy's tuned lr."""
    best = tuned(results)
    out = {}
    for pol, rs in _common.at_tuned(results["rows"], best, lambda r: r["policy"]).items():
        x = {"cell": best[pol], "runs": len(rs)}
        if rs:
            for name, col in (("acc", "m.test_accuracy"), ("samples", "samples"),
                              ("wait", "wait_fraction"), ("gap", "gap_mean")):
                x[name] = _common.mean_std([r[col] for r in rs])
        out[pol] = x
    return out


def tables(results) -> str:
    cfg, s = results["config"], summary(results)
    lines = [f"{cfg['workload']}, W = {cfg['workers']}, {cfg['seconds']:g} s of training "
             f"per run, {len(cfg['seeds'])} seeds", "",
             "| policy | lr | training loss | test accuracy | samples | wait fraction | "
             "mean update gap |", "|---|---|---|---|---|---|---|"]
    for pol in cfg["policies"]:
        x = s[pol]
        if not x["runs"]:
            lines.append(f"| {pol} | – | {_common.loss_cell(x['cell'])} | – | – | – | – |")
            continue
        lines.append(f"| {pol} | {x['cell'][0]:g} | {_common.loss_cell(x['cell'])} | "
                     f"{pm(x['acc'])} | {pm(x['samples'], ',.0f')} | "
                     f"{pm(x['wait'], '.2f')} | {pm(x['gap'], '.2f')} |")
    return "\n".join(lines)


def plot(results: dict, out_dir: str) -> str:
    plt = _common.pyplot()
    cfg, best = results["config"], tuned(results)
    runs = _common.at_tuned(results["rows"], best, lambda r: r["policy"])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, pol in enumerate(cfg["policies"]):
        for j, r in enumerate(runs[pol]):       # live curves do not share a time grid
            ts, ys = zip(*r["curve"])
            ax.plot(ts, ys, color=f"C{i}", lw=1.0, alpha=0.8,
                    ls="--" if pol.endswith("overlap") else "-",
                    label=f"{pol} (lr {best[pol][0]:g})" if j == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("wall seconds")
    ax.set_ylabel("training loss")
    ax.set_title(f"{cfg['workload']}, W={cfg['workers']} live, each policy at its best lr, "
                 f"{len(cfg['seeds'])} seeds", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, alpha=0.3)
    return _common.save(fig, out_dir, "local_sgd.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/local_sgd",
                        argv)


if __name__ == "__main__":
    main()
