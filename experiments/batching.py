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
worker when even), 30 s of wall time per run, three seeds. Worker 1 is the straggler,
either ``persistent`` (3× slower on every step) or ``time-varying`` (a load
``1 + 4(1 + sin 2πt/2 s)/2``: between 1× and 5×, period 2 s). The sizes compared: the
even split (``fixed``), LB-BSP with the ``ema`` and ``narx`` predictors, DBS
(``epoch``: the persistent straggler, its case), and, as the no-barrier reference, Async
with the even split (persistent). Every cell takes the Python step
(``engine="python"``: adaptive shares need it, so the even split gets it too and the
comparison is like with like). A global-batch method's aggregate is one batch-B
update (its weights keep that step's size), so one lr grid, {1, 2, 4, 8}, means the
same for every method; each method's lr is the one with the lowest mean final loss,
and the table says whether a worse lr lies on both sides. Reported: training loss at
the budget, **time to a target loss** (per straggler: ``target_factor`` times the
worst tuned method's mean final loss, so every method reaches it on average; each
seed's time is when its loss curve falls below the target for good: :func:`settled`),
samples processed and the wait fraction.

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
import hogkit

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
    "seconds": 30.0,
    "seeds": [0, 1, 2],
    "lrs": [1.0, 2.0, 4.0, 8.0],
    "target_factor": 1.1,
    "step_batches": {"logreg": [32, 256], "mlp": [32, 256]},
    "stragglers": STRAGGLERS,
    "methods": list(METHODS),
    "cells": {"persistent": ["fixed (even split)", "LB-BSP EMA", "LB-BSP NARX",
                             "DBS (per epoch)", "Async (even split)"],
              "time-varying": ["fixed (even split)", "LB-BSP EMA", "LB-BSP NARX"]},
}
QUICK = {**CONFIG, "seconds": 1.5, "seeds": [0], "lrs": [2.0],
         "step_batches": {"logreg": [32, 256]},
         "stragglers": {"persistent": "1:3"},
         "cells": {"persistent": ["fixed (even split)", "LB-BSP NARX"]}}


def cells(config):
    """``{straggler: [methods]}`` the config runs (older configs: every method on every
    straggler)."""
    return config.get("cells") or {st: config["methods"] for st in config["stragglers"]}


def grid(config):
    return [{"straggler": [config["stragglers"][st]], "policy": [METHODS[m][0]],
             "batch": [METHODS[m][1].format(B=config["global_batch"])],
             "lr": config["lrs"], "seed": config["seeds"]}
            for st, ms in cells(config).items() for m in ms]


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
            r = train(wl, workers=1, engine="python",
                      outputs=hogkit.Outputs(progress=False, keep_params=False, eval_every=None),
                      steps=1500, batch=b)
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


def targets(results):
    """``{straggler: target loss}``: ``target_factor`` x the worst tuned method's mean
    final loss (every method reaches it on average)."""
    cfg = results["config"]
    best = tuned(results)
    return {st: cfg.get("target_factor", 1.1) * max(best[(st, m)][1] for m in ms
                                                    if best[(st, m)][1] is not None)
            for st, ms in cells(cfg).items()}


def summary(results):
    """``{(straggler, method): dict}`` at each method's tuned lr."""
    cfg = results["config"]
    best = tuned(results)
    target = targets(results)
    runs = _common.at_tuned(results["rows"], best, lambda r: (straggler_of(cfg, r),
                                                                name_of(r)))
    out = {}
    for key, rs in runs.items():
        x = {"cell": best[key], "runs": len(rs)}
        if rs:
            for name, col in (("samples", "samples"), ("wait", "wait_fraction")):
                x[name] = _common.mean_std([r[col] for r in rs])
            hit = [settled(r["curve"], target[key[0]]) for r in rs]
            hit = [t for t in hit if t is not None]
            x["reached"] = len(hit)
            x["time_to_target"] = _common.mean_std(hit) if hit else None
        out[key] = x
    return out


def settled(curve, target):
    """When a loss curve ``[[t, loss], ...]`` reaches ``target`` for good: its crossing
    after the last point above it (linear between points), or None if it ends above.
    At lr 8 the curves spike for the first seconds, so a first crossing can come back
    above the target (see the plot)."""
    above = [i for i, (_, y) in enumerate(curve) if y > target]
    if not above:
        return curve[0][0]
    if above[-1] == len(curve) - 1:
        return None
    return _common.time_to(curve[above[-1]:], target)


def bracketed(results):
    """``{(straggler, method): "yes" | "no (lowest tried)" | "no (highest tried)"}``."""
    cfg = results["config"]
    return {k: {None: "yes", "low": "no (lowest tried)", "high": "no (highest tried)"}[e]
            for k, e in _common.edges(results["rows"], tuned(results),
                                      lambda r: (straggler_of(cfg, r), name_of(r))).items()}


def by_lr(results):
    """``{(straggler, method, lr): (mean, std, n)}`` of the final loss, every lr."""
    from hogkit.sweeps import aggregate
    cfg = results["config"]
    rows = [{**r, "_st": straggler_of(cfg, r), "_m": name_of(r)} for r in results["rows"]]
    return aggregate(rows, "final_loss", ("_st", "_m", "lr"))


def tables(results) -> str:
    cfg, s, every = results["config"], summary(results), by_lr(results)
    target, mark = targets(results), bracketed(results)
    lines = []
    for st, ms in cells(cfg).items():
        lines += [f"**{st} straggler** (`--straggler {cfg['stragglers'][st]}`; "
                  f"{cfg['seconds']:g} s, W = {cfg['workers']}, B = {cfg['global_batch']}; "
                  f"target loss {target[st]:.4f})", "",
                  "| method | tuned lr | bracketed | training loss | "
                  + "".join(f"loss at lr {lr:g} | " for lr in cfg["lrs"])
                  + "time to target (s) | samples | vs even split | wait fraction |",
                  "|---|---|---|---|" + "---|" * len(cfg["lrs"]) + "---|---|---|---|"]
        even = s.get((st, "fixed (even split)"), {}).get("samples")
        for m in ms:
            x = s[(st, m)]
            if not x["runs"]:
                lines.append(f"| {m} | – | – | {_common.loss_cell(x['cell'])} | "
                             + "– | " * len(cfg["lrs"]) + "– | – | – | – |")
                continue
            per_lr = "".join(
                "– | " if every.get((st, m, lr), (None,))[0] is None else
                "{:.4f} ± {:.4f} | ".format(*every[(st, m, lr)][:2]) for lr in cfg["lrs"])
            ttt = ("not reached" if x["time_to_target"] is None else
                   pm(x["time_to_target"], ".1f")
                   + (f" ({x['reached']}/{x['runs']} reached)"
                      if x["reached"] < x["runs"] else ""))
            lines.append(
                f"| {m} | {x['cell'][0]:g} | {mark[(st, m)]} | "
                f"{_common.loss_cell(x['cell'])} | {per_lr}{ttt} | "
                f"{pm(x['samples'], ',.0f')} | "
                + (f"{x['samples'][0] / even[0]:.2f}x" if even else "–")
                + f" | {pm(x['wait'], '.2f')} |")
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
    fig, axes = plt.subplots(1, len(cells(cfg)), figsize=(5.5 * len(cells(cfg)), 4),
                             squeeze=False)
    for ax, (st, ms) in zip(axes.flat, cells(cfg).items()):
        for m in ms:
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
        ax.set_yscale("log")                 # the methods part at the low end
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
