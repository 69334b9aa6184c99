"""Worker-adaptive batch sizes against a straggler, live: LB-BSP and DBS vs fixed BSP.

Claims checked:

- LB-BSP (Chen et al., SoCC 2018/2020): under BSP, giving each worker a share of the
  global batch proportional to its predicted speed removes the wait for the straggler;
  the NARX predictor, fed the load as an exogenous input, tracks a time-varying
  straggler better than the last value or an EMA.
- DBS (Ye et al. 2020): recomputing the shares once per epoch from the measured speeds
  does the same for a persistent straggler.

Setup: ``hogkit.sweep`` of live ``hogkit.train`` runs: 2 worker processes on real
shared memory, BSP, the ``logreg`` workload, a fixed global batch B = 512 (256 per
worker when even), a fixed wall-time budget, three seeds. Worker 1 is the straggler,
either ``persistent`` (3× slower on every step) or ``time-varying`` (a load
``1 + 4(1 + sin 2πt/2 s)/2``: between 1× and 5×, period 2 s). The sizes compared: the
even split (``fixed``), LB-BSP with the ``last``, ``ema`` and ``narx`` predictors, DBS
(``epoch``), and, as the no-barrier reference, Async with the even split. Every cell
takes the Python step (``engine="python"``: adaptive shares need it, so the even split
gets it too and the comparison is like with like). **lr tuned per method** on the
workload's default and twice it; a global-batch method's weights keep the step of one
batch-B update, so the two grids mean the same for every method. Reported: training
loss at the budget, samples processed, the wait fraction and the straggler's realised
slowdown.

Why logreg and B = 512: resizing batches helps only where a step's time grows with
its batch. :func:`step_times` measures that first (one worker, per batch size): the
digits MLP's step is mostly fixed cost (torch and Python overhead), logreg's grows
about linearly; both are in the results.

    python experiments/batching.py [--quick] [--out docs/experiments/batching]

Writes ``cells.jsonl`` (resumable), ``results.json`` and ``batching.png``;
:func:`tables` renders the write-up's tables from results.json.
"""

from __future__ import annotations

import os

import _common
from _common import pm

METHODS = {                     # name -> (policy, batch spec with {B})
    "fixed (even split)": ("bsp", "fixed:{B}"),
    "LB-BSP last": ("bsp", "adaptive:{B}:last"),
    "LB-BSP EMA": ("bsp", "adaptive:{B}:ema"),
    "LB-BSP NARX": ("bsp", "adaptive:{B}:narx"),
    "DBS (per epoch)": ("bsp", "epoch:{B}"),
    "Async (even split)": ("async", "fixed:{B}"),
}
STRAGGLERS = {"persistent": "1:3", "time-varying": "1:load:4:2"}
CONFIG = {
    "workload": "logreg",
    "workers": 2,
    "global_batch": 512,
    "seconds": 3.0,
    "seeds": [0, 1, 2],
    "lrs": [2.0, 4.0],
    "step_batches": {"logreg": [32, 256], "mlp": [32, 256]},
    "stragglers": STRAGGLERS,
    "methods": list(METHODS),
}
QUICK = {**CONFIG, "seconds": 1.5, "seeds": [0], "lrs": [2.0],
         "step_batches": {"logreg": [32, 256]},
         "stragglers": {"persistent": "1:3"},
         "methods": ["fixed (even split)", "LB-BSP NARX"]}


def grid(config):
    return [{"straggler": [spec], "policy": [METHODS[m][0]],
             "batch": [METHODS[m][1].format(B=config["global_batch"])],
             "lr": config["lrs"], "seed": config["seeds"]}
            for spec in config["stragglers"].values() for m in config["methods"]]


def name_of(row):
    B = row["batch"].split(":")[1]
    return next(m for m, (pol, b) in METHODS.items()
                if pol == row["policy"] and b.format(B=B) == row["batch"])


def straggler_of(config, row):
    return next(k for k, v in config["stragglers"].items() if v == row["straggler"])


def step_times(config) -> dict:
    """``{workload: {batch: µs per step}}``: one worker, Python step, 1,500 steps."""
    from hogkit import train
    out = {}
    for wl, batches in config["step_batches"].items():
        out[wl] = {}
        for b in batches:
            r = train(wl, workers=1, steps=1500, batch=b, engine="python", progress=False,
                      keep_params=False, eval_every=None)
            out[wl][str(b)] = round(r.summary()["wall_s"] / 1500 * 1e6, 1)
    return out


def run(config: dict, out_dir=None) -> dict:
    from hogkit import sweep
    from hogkit.report import environment
    path = os.path.join(out_dir, "cells.jsonl") if out_dir else None
    steps = step_times(config)
    rows = sweep(grid(config), base={"workload": config["workload"],
                                     "workers": config["workers"],
                                     "seconds": config["seconds"], "engine": "python"},
                 out=path, mode="live", progress=True)
    return {"config": config, "step_us": steps, "rows": [_common.slim(r) for r in rows],
            "environment": environment()}


def tuned(results):
    cfg = results["config"]
    return _common.tuned(results["rows"], lambda r: (straggler_of(cfg, r), name_of(r)),
                         len(cfg["seeds"]))


def summary(results):
    """``{(straggler, method): dict}`` at each method's tuned lr."""
    cfg = results["config"]
    best = tuned(results)
    runs = _common.at_tuned(results["rows"], best, lambda r: (straggler_of(cfg, r),
                                                                name_of(r)))
    out = {}
    for key, rs in runs.items():
        x = {"cell": best[key], "runs": len(rs)}
        if rs:
            for name, col in (("samples", "samples"),
                              ("wait", "wait_fraction"), ("slow", "slowdown_realised")):
                x[name] = _common.mean_std([r[col] for r in rs])
        out[key] = x
    return out


def by_lr(results):
    """``{(straggler, method, lr): (mean, std, n)}`` of the final loss, every lr."""
    from hogkit.sweeps import aggregate
    cfg = results["config"]
    rows = [{**r, "_st": straggler_of(cfg, r), "_m": name_of(r)} for r in results["rows"]]
    return aggregate(rows, "final_loss", ("_st", "_m", "lr"))


def tables(results) -> str:
    cfg, s, every = results["config"], summary(results), by_lr(results)
    lines = []
    for st, spec in cfg["stragglers"].items():
        lines += [f"**{st} straggler** (`--straggler {spec}`; {cfg['seconds']:g} s, "
                  f"W = {cfg['workers']}, B = {cfg['global_batch']})", "",
                  "| method | tuned lr | training loss | "
                  + "".join(f"loss at lr {lr:g} | " for lr in cfg["lrs"])
                  + "samples | wait fraction | straggler's realised slowdown |",
                  "|---|---|---|" + "---|" * len(cfg["lrs"]) + "---|---|---|"]
        for m in cfg["methods"]:
            x = s[(st, m)]
            if not x["runs"]:
                lines.append(f"| {m} | – | {_common.loss_cell(x['cell'])} | "
                             + "– | " * len(cfg["lrs"]) + "– | – | – |")
                continue
            per_lr = "".join(
                "– | " if every.get((st, m, lr), (None,))[0] is None else
                "{:.4f} ± {:.4f} | ".format(*every[(st, m, lr)][:2]) for lr in cfg["lrs"])
            lines.append(
                f"| {m} | {x['cell'][0]:g} | {_common.loss_cell(x['cell'])} | {per_lr}"
                f"{pm(x['samples'], ',.0f')} | {pm(x['wait'], '.2f')} | "
                f"{pm(x['slow'], '.2f')} |")
        lines.append("")
    lines += ["One worker, Python step, µs per step by batch size (the cost resizing can "
              "move):", "", "| workload | " + " | ".join(
                  f"batch {b}" for b in next(iter(results["step_us"].values()))) + " |",
              "|---|" + "---|" * len(next(iter(results["step_us"].values())))]
    for wl, by in results["step_us"].items():
        lines.append(f"| {wl} | " + " | ".join(f"{us:,.0f}" for us in by.values()) + " |")
    return "\n".join(lines).rstrip()


def plot(results: dict, out_dir: str) -> str:
    plt = _common.pyplot()
    cfg, t = results["config"], tuned(results)
    fig, axes = plt.subplots(1, len(cfg["stragglers"]),
                             figsize=(5.5 * len(cfg["stragglers"]), 4), squeeze=False)
    for ax, st in zip(axes.flat, cfg["stragglers"]):
        for m in cfg["methods"]:
            lr = t[(st, m)][0]
            runs = [r for r in results["rows"] if (straggler_of(cfg, r), name_of(r)) ==
                    (st, m) and r["lr"] == lr and r["curve"]]
            if not runs:
                continue
            for i, r in enumerate(runs):       # live curves do not share a time grid
                ts, ys = zip(*r["curve"])
                ax.plot(ts, ys, lw=1.0, alpha=0.8, color=f"C{cfg['methods'].index(m)}",
                        ls="--" if m.startswith("Async") else "-",
                        label=f"{m} (lr {lr:g})" if i == 0 else None)
        ax.set_xlabel("wall seconds")
        ax.set_ylabel("training loss")
        ax.set_title(f"{st} straggler: {cfg['workload']}, BSP, W={cfg['workers']}, "
                     f"{len(cfg['seeds'])} seeds each", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    return _common.save(fig, out_dir, "batching.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/batching",
                        argv)


if __name__ == "__main__":
    main()
