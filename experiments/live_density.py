"""Update density live: does applying a fraction of each update pay in wall time?

The simulated density experiments (``density_staleness``, ``rnn_density``) count
updates; a user on shared memory pays for the filter too (top-k selects, a residual is
read and written every step), so lower density may never pay. This measures it.

Setup: ``hogkit.sweep`` of live ``hogkit.train`` runs: 2 worker processes on real shared
memory, Async, plain SGD, the compiled step, a fixed wall-time budget, three seeds, on
``mf`` (default preset) and ``logreg``. Densities: full updates, and for d in {0.5,
0.1, 0.05} the ``topk:d`` and ``random:d`` filters and the temporal ``every:K`` with K =
1/d, each with the unsent part kept as a residual or dropped. **Tuning that brackets**
(``hogkit.sweeps.tune``): every (workload, density) starts from the workload's default
lr and half of it and gets lrs added past the edge holding the best (factor 2, at most
``extend`` per edge), by the mean final loss over the seeds at the budget; a cell whose
best is still at an edge says so. Reported at the tuned lr: the training loss at the
budget, samples per second, and, beside it, the same cell **simulated** (W = 2, the
simulator's default step times, the minibatch step at the workload's default batch)
for the live run's median number of samples (held-back steps of a temporal filter
included): where live and simulated disagree, the live lane (mf's and logreg's full
updates take the per-sample lane) or the staleness the simulator models is what
differs; the filter's cost in time is in the samples per second.

    python experiments/live_density.py [--quick] [--out docs/experiments/live_density]

Writes ``cells.jsonl`` (live, resumable), ``sim.jsonl`` (the simulated twins),
``results.json`` (both tables' rows, and the tuning record) and ``live_density.png``; :func:`tables` renders the write-up's tables from results.json.
"""

from __future__ import annotations

import os
import statistics

import _common
from _common import pm

CONFIG = {
    "workloads": {"mf": [0.025, 0.05], "logreg": [1.0, 2.0]},
    "fractions": [0.5, 0.1, 0.05],
    "filters": ["topk", "random", "every"],
    "workers": 2,
    "seconds": 2.0,
    "seeds": [0, 1, 2],
    "extend": 3,
}
QUICK = {**CONFIG, "workloads": {"logreg": [1.0, 2.0]}, "fractions": [0.1],
         "filters": ["topk"], "seconds": 1.0, "seeds": [0], "extend": 1}


def densities(config) -> list:
    """The density knob's values: full updates, then each filter x fraction x unsent."""
    out = [1.0]
    for how in config["filters"]:
        for d in config["fractions"]:
            spec = f"every:{round(1 / d)}" if how == "every" else f"{how}:{d:g}"
            out += [spec, f"{spec}:dropped"]
    return out


def label(density) -> tuple:
    """``(filter, d, unsent)`` of a density knob value (full: ``("full", 1, "—")``)."""
    if density in (1, 1.0):
        return ("full", 1.0, "—")
    bits = str(density).split(":")
    d = 1.0 / int(bits[1]) if bits[0] == "every" else float(bits[1])
    return (bits[0], d, "dropped" if bits[-1] == "dropped" else "residual")


def run(config: dict, out_dir=None) -> dict:
    from hogkit import sweep
    from hogkit.report import environment
    from hogkit.sweeps import load, tune
    out_dir = out_dir or "."
    live_path = os.path.join(out_dir, "cells.jsonl")
    groups = []
    for wl, lrs in config["workloads"].items():
        groups += tune({"workload": [wl], **_common.pinned(wl, rule=False),
                        "density": densities(config), "lr": lrs, "seed": config["seeds"]},
                       base={"workers": config["workers"], "seconds": config["seconds"],
                             "rule": "sgd"},
                       out=live_path, mode="live", extend=config["extend"],
                       progress=True)
    from hogkit import workloads
    rows = load(live_path)
    twins = []
    for g in groups:
        wl = g["cell"]["workload"]
        runs = [r for r in rows if r["workload"] == wl
                and r["density"] == g["cell"]["density"] and r["lr"] == g["lr"]
                and r["final_loss"] is not None]
        if runs:                        # the same samples, in the simulator's steps
            steps = statistics.median(r["samples"] for r in runs)
            twins.append({"workload": [wl], **_common.pinned(wl, rule=False),
                          "density": [g["cell"]["density"]],
                          "lr": [g["lr"]],
                          "steps": [int(steps) // workloads.get(wl).default_batch],
                          "seed": config["seeds"]})
    sim = sweep(twins, base={"workers": config["workers"], "rule": "sgd"},
                out=os.path.join(out_dir, "sim.jsonl"), mode="sim", progress=True)
    return {"config": config,
            "tuned": [{**g, "tried": [[lr, m] for lr, m in g["tried"].items()]}
                      for g in groups],
            "rows": [_common.slim(r) for r in rows + sim], "environment": environment()}


def summary(results) -> dict:
    """``{(workload, density): dict}`` at each cell's tuned lr: the tuning record, the
    live samples/s and the simulated twin's loss (mean, std over seeds)."""
    out = {}
    for g in results["tuned"]:
        wl, dens = g["cell"]["workload"], g["cell"]["density"]
        at = [r for r in results["rows"] if r["workload"] == wl and r["density"] == dens
              and r["lr"] == g["lr"] and r["final_loss"] is not None]
        live = [r for r in at if r["mode"] == "live"]
        sim = [r for r in at if r["mode"] == "sim"]
        out[(wl, dens)] = {
            "tuned": g,
            "rate": (_common.mean_std([r["samples"] / r["wall_s"] / 1e6 for r in live])
                     if live else None),
            "updates": (_common.mean_std([r["updates"] for r in live]) if live else None),
            "sim": _common.mean_std([r["final_loss"] for r in sim]) if sim else None}
    return out


def _lr_cell(g):
    mark = "" if g["bracketed"] else f", at the {g['bound']} edge"
    return f"{g['lr']:g}{mark}"


def tables(results) -> str:
    cfg, s = results["config"], summary(results)
    lines = []
    for wl in cfg["workloads"]:
        lines += [f"**{wl}** (live: {cfg['workers']} workers, {cfg['seconds']:g} s, "
                  f"{len(cfg['seeds'])} seeds; training loss at the budget)", "",
                  "| filter | d | unsent | lane | tuned lr | loss, live | M samples/s | "
                  "updates | loss, simulated at the same samples |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for dens in densities(cfg):
            x = s.get((wl, dens))
            if x is None:
                continue
            g, (how, d, unsent) = x["tuned"], label(dens)
            lanes = sorted({r["lane"] for r in results["rows"] if r["workload"] == wl
                            and r["density"] == dens and r["mode"] == "live"
                            and r.get("lane")})
            loss = (_common.loss_cell((g["lr"], g["mean"], g["std"], g["diverged"], g["n"]))
                    if g["mean"] is not None else f"diverged ({g['n']}/{g['n']})")
            lines.append(
                f"| {how} | {d:g} | {unsent} | {'/'.join(lanes)} | {_lr_cell(g)} | {loss} | "
                + (pm(x["rate"], ".2f") if x["rate"] else "–") + " | "
                + (pm(x["updates"], ",.0f") if x["updates"] else "–") + " | "
                + (pm(x["sim"]) if x["sim"] else "–") + " |")
        inside, n = agreement(s, wl)
        lines += ["", f"Simulated within the seeds' spread of live (|difference| <= the sum "
                      f"of the two stds): {inside} of {n} cells.", ""]
    return "\n".join(lines).rstrip()


def agreement(summarised, workload) -> tuple:
    """``(cells whose simulated twin is within the seeds' spread of the live loss,
    cells with both)`` for ``workload``, from :func:`summary`'s dict."""
    inside = n = 0
    for (wl, _), x in summarised.items():
        g = x["tuned"]
        if wl != workload or x["sim"] is None or g["mean"] is None:
            continue
        n += 1
        inside += abs(g["mean"] - x["sim"][0]) <= g["std"] + x["sim"][1]
    return inside, n


def plot(results: dict, out_dir: str) -> str:
    """Loss against wall seconds at the tuned lr: full updates and, per filter, its best
    density (by the tuned mean), one panel per workload."""
    plt = _common.pyplot()
    cfg, s = results["config"], summary(results)
    fig, axes = plt.subplots(1, len(cfg["workloads"]), figsize=(5.5 * len(cfg["workloads"]),
                                                                  4), squeeze=False)
    for ax, wl in zip(axes.flat, cfg["workloads"]):
        picks = [1.0]
        for how in cfg["filters"]:
            best = [(x["tuned"]["mean"], dens) for (w, dens), x in s.items()
                    if w == wl and label(dens)[0] == how and x["tuned"]["mean"] is not None]
            if best:
                picks.append(min(best)[1])
        for i, dens in enumerate(picks):
            g = s[(wl, dens)]["tuned"]
            runs = [r for r in results["rows"] if r["workload"] == wl and r["mode"] == "live"
                    and r["density"] == dens and r["lr"] == g["lr"] and r["curve"]]
            for j, r in enumerate(runs):
                ts, ys = zip(*r["curve"])
                ax.plot(ts, ys, lw=1.0, alpha=0.8, color=f"C{i}",
                        label=(f"{'full' if dens in (1, 1.0) else dens} (lr {g['lr']:g})"
                               if j == 0 else None))
        ax.set_yscale("log")
        ax.set_xlabel("wall seconds")
        ax.set_ylabel("training loss")
        ax.set_title(f"{wl}: {cfg['workers']} live workers, {len(cfg['seeds'])} seeds",
                     fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    return _common.save(fig, out_dir, "live_density.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/live_density",
                        argv)


if __name__ == "__main__":
    main()
