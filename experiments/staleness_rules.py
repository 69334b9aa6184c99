"""Staleness-correcting update rules as the number of workers grows (simulated, and
live at two workers).

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
deterministic per seed) on ``mf`` (default preset), ``logreg``, the digits ``mlp``
and the character ``rnn`` (each with its own lr grid and budget; the last two also
report a held-out metric at the tuned lr), W ∈ ``workers`` virtual workers with
log-normal step times, the same number of updates in every cell of a workload, three
seeds; one process per workload, two at a time. Then a **live** column: 2 real worker processes
for a fixed wall time, each rule at the lr it was tuned to at W = 4 (simulated), three
seeds (live runs are not deterministic; their spread is the machine's as much as the
seed's).
**Each rule at its own learning rate**: every (rule, W) cell runs the rule's lr grid
and the table reports the lr with the lowest mean final loss over the seeds (a
diverged seed makes an lr lose). Momentum variants run at a **matched effective
step**: lr·(1 − μ) for each lr of the plain grid, so that a steady gradient moves the
parameters as far per update as without momentum. A run that produces a non-finite
gradient is *diverged* (hogkit's guard stops it before anything non-finite is
written).

    python experiments/staleness_rules.py [--quick] [--out docs/experiments/staleness_rules]

Writes ``cells-<workload>.jsonl`` and ``live.jsonl`` (the sweeps' tables, one row per
run: resumable), ``results.json`` (the rows without their curves, and the config) and, from
it only,
``staleness_rules.png``; :func:`tables` renders the write-up's tables from it.
"""

from __future__ import annotations

import os

import _common

CONFIG = {
    # workload -> its lr grid, or a dict with "lrs" and optional "steps" (default the
    # top-level steps), "options" (workload options) and "metric" (a held-out metric
    # reported at the tuned lr)
    "workloads": {
        "mf": [0.05, 0.1, 0.2],
        "logreg": [0.1, 0.2, 0.4],
        "mlp": {"lrs": [0.05, 0.1, 0.2], "steps": 4_000, "metric": "m.test_accuracy"},
        "rnn": {"lrs": [0.25, 0.5, 1.0], "steps": 1_000, "metric": "m.val_bpc",
                "options": {"text": "markov", "hidden": 64, "embed": 32, "bptt": 16,
                            "chars": 50_000}},
    },
    "workers": [1, 4, 16, 64],
    "steps": 20_000,
    "delays": "lognormal:1e-3:0.5",
    "seeds": [0, 1, 2],
    "momentum": 0.9,
    "live": {"workers": 2, "seconds": 3.0, "lr_from": 4},
    "processes": 2,
}
QUICK = {**CONFIG, "workloads": {"mf": [0.1]}, "workers": [1, 16], "steps": 4_000,
         "seeds": [0, 1], "live": {"workers": 2, "seconds": 1.0, "lr_from": 16},
         "processes": 1}


def spec(config, wl):
    """A workload's entry as a dict: lrs, steps, options, metric."""
    return _common.workload_spec(config, wl, metric=None)


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


def grid(config, workload, lrs):
    mu = config["momentum"]
    opts = {f"o.{k}": [v] for k, v in spec(config, workload)["options"].items()}
    parts = []
    for name, (rule, mom) in RULES.items():
        grid_lrs = [round(lr * (1 - mu), 6) for lr in lrs] if mom else lrs
        parts.append({"workload": [workload], **opts, "rule": [rule],
                      "momentum": [mu if mom else 0.0], "lr": grid_lrs,
                      "workers": config["workers"], "seed": config["seeds"]})
    return parts


def name_of(row):
    mom = bool(row.get("momentum"))
    return next(n for n, (r, m) in RULES.items() if r == row["rule"] and m == mom)


def run(config: dict, out_dir=None) -> dict:
    """The simulated grid per workload, then the live column: W = 2 real workers for a
    fixed wall time, each rule at the lr it was tuned to at ``live["lr_from"]``
    simulated workers."""
    from hogkit import sweep
    from hogkit.report import environment
    out_dir = out_dir or "."
    jobs = []
    for wl in config["workloads"]:
        sp = spec(config, wl)
        jobs.append((os.path.join(out_dir, f"cells-{wl}.jsonl"), grid(config, wl, sp["lrs"]),
                     {"steps": sp["steps"], "delays": config["delays"]}))
    rows = [r for got in _common.parallel_sweeps(jobs, config["processes"]) for r in got]
    keep = [{k: v for k, v in r.items() if k not in ("curve", "key")} for r in rows]
    sim = {"config": config, "rows": keep}
    live = config["live"]
    best = tuned(sim)
    parts = [{"workload": [wl], "rule": [RULES[name][0]],
              **{f"o.{k}": [v] for k, v in spec(config, wl)["options"].items()},
              "momentum": [config["momentum"] if RULES[name][1] else 0.0],
              "lr": [best[(wl, name, live["lr_from"])][0]], "seed": config["seeds"]}
             for wl in config["workloads"] for name in RULES]
    live_rows = sweep(parts, base={"workers": live["workers"], "seconds": live["seconds"]},
                      out=os.path.join(out_dir, "live.jsonl"), mode="live", progress=True)
    keep += [{k: v for k, v in r.items() if k not in ("curve", "key")} for r in live_rows]
    return {"config": config, "rows": keep, "environment": environment()}


def tuned(results):
    """``{(workload, name, W): (lr, mean, std, diverged seeds, n)}`` at each simulated
    cell's best lr."""
    sim = [r for r in results["rows"] if r.get("mode", "sim") == "sim"]
    return _common.tuned(sim, lambda r: (r["workload"], name_of(r), r["workers"]),
                         len(results["config"]["seeds"]))


def edges(results):
    """``{(workload, name, W): "low" | "high" | None}``: which edge of the lrs its group
    tried a simulated cell's tuned lr sits at (its optimum may lie outside the grid)."""
    sim = [r for r in results["rows"] if r.get("mode", "sim") == "sim"]
    return _common.edges(sim, tuned(results), lambda r: (r["workload"], name_of(r),
                                                         r["workers"]))


def at_edge(results, w):
    """The simulated cells at ``w`` workers whose tuned lr is the lowest or highest lr
    their group tried: ``[(workload, name)]``."""
    return [k[:2] for k, e in edges(results).items() if k[2] == w and e]


def highlight(results) -> str:
    """The README's line on this experiment, rendered from the results (a test checks
    the README carries it word for word)."""
    t, g, w = tuned(results), gaps(results), 64
    edge = at_edge(results, w)

    def cell(wl, name):
        return f"{t[(wl, name, w)][1]:.4f} ± {t[(wl, name, w)][2]:.4f}"
    n = len([k for k in t if k[2] == w])
    sgd = t[("mf", "SGD", w)]
    below = [k[1] for k, v in t.items() if k[0] == "mf" and k[2] == w and v[1] is not None
             and v[1] + v[2] < sgd[1] - sgd[2]]
    mf = ("no rule ends below plain SGD's" if not below
          else f"{', '.join(below)} end below plain SGD's")
    return (f"at W = {w} (mean update gap {g[('logreg', w)]:.1f}), on logreg adaptive "
            f"DC-ASGD ends at {cell('logreg', 'DC-ASGD (adaptive)')} and Gap-Aware at "
            f"{cell('logreg', 'Gap-Aware')} against plain SGD's "
            f"{cell('logreg', 'SGD')}; on mf {mf} {cell('mf', 'SGD')} beyond the spread. "
            f"Simulated, 3 seeds. {len(edge)} of the {n} tuned cells at W = {w} sit at "
            f"an edge of their three-point lr grid"
            + (" (SGD on logreg among them)" if ("logreg", "SGD") in edge else "")
            + "; fair_rules re-tunes them with every lr bracketed.")


def gaps(results):
    """Mean update gap per (workload, W) over every converged simulated run."""
    from hogkit.sweeps import aggregate
    sim = [r for r in results["rows"] if r.get("mode", "sim") == "sim"]
    return {k: m for k, (m, _, _) in aggregate(sim, "gap_mean", ("workload", "workers")).items()}


def _cell(lr, mean, std, div, n, edge=None):
    if mean is None:
        return f"diverged ({n}/{n})"
    text = f"{mean:.4f} ± {std:.4f} (lr {lr:g}" + (f", {edge} edge)" if edge else ")")
    return text + (f", {div}/{n} diverged" if div else "")


_METRIC = {"mf": "MSE", "logreg": "log-loss", "mlp": "cross-entropy",
           "rnn": "bits/char"}


def live_table(results):
    """``{(workload, name): (lr, (mean, std) loss, (mean, std) updates, n)}`` of the live
    rows."""
    out = {}
    for wl in results["config"]["workloads"]:
        for name in RULES:
            rs = [r for r in results["rows"] if r.get("mode") == "live"
                  and r["workload"] == wl and name_of(r) == name]
            ok = [r for r in rs if r["final_loss"] is not None]
            if rs:
                out[(wl, name)] = (rs[0]["lr"],
                                   _common.mean_std([r["final_loss"] for r in ok]) if ok
                                   else None,
                                   _common.mean_std([r["updates"] for r in ok]) if ok
                                   else None, len(rs) - len(ok), len(rs))
    return out


def _metric_cell(results, wl, name, w, lr, metric):
    xs = [r[metric] for r in results["rows"] if r.get("mode", "sim") == "sim"
          and r["workload"] == wl and name_of(r) == name and r["workers"] == w
          and r["lr"] == lr and r.get(metric) is not None]
    return _common.pm(_common.mean_std(xs)) if xs else "–"


def tables(results) -> str:
    """The write-up's tables, from ``results`` only."""
    cfg = results["config"]
    ws = cfg["workers"]
    t, g, e = tuned(results), gaps(results), edges(results)
    lines = []
    for wl in cfg["workloads"]:
        lines += [f"**{wl}** ({_METRIC.get(wl, 'loss')} after {spec(cfg, wl)['steps']:,} "
                  f"simulated updates)", "", "| rule | " + " | ".join(f"W={w}" for w in ws) + " |",
                  "|---|" + "---|" * len(ws)]
        for name in RULES:
            lines.append(f"| {name} | " + " | ".join(
                _cell(*t[(wl, name, w)], e.get((wl, name, w))) for w in ws) + " |")
        metric = spec(cfg, wl)["metric"]
        if metric:
            lines += ["", f"{wl}: `{metric[2:]}` at each cell's tuned lr (held out; not "
                      "what the lr was tuned on):", "",
                      "| rule | " + " | ".join(f"W={w}" for w in ws) + " |",
                      "|---|" + "---|" * len(ws)]
            for name in RULES:
                lines.append(f"| {name} | " + " | ".join(
                    _metric_cell(results, wl, name, w, t[(wl, name, w)][0], metric)
                    for w in ws) + " |")
        lines += ["", "| W | " + " | ".join(str(w) for w in ws) + " |",
                  "|---|" + "---|" * len(ws),
                  "| mean update gap | " + " | ".join(f"{g[(wl, w)]:.1f}" for w in ws)
                  + " |", ""]
    live, lv = live_table(results), cfg["live"]
    if live:
        lines += [f"**Live**, {lv['workers']} worker processes, {lv['seconds']:g} s each, "
                  f"every rule at its lr tuned at W = {lv['lr_from']} (simulated):", "",
                  "| rule | " + " | ".join(f"{wl}: loss | {wl}: updates"
                                           for wl in cfg["workloads"]) + " |",
                  "|---|" + "---|---|" * len(cfg["workloads"])]
        for name in RULES:
            cells = []
            for wl in cfg["workloads"]:
                lr, loss, upd, div, n = live[(wl, name)]
                cells.append("diverged" if loss is None else
                             f"{loss[0]:.4f} ± {loss[1]:.4f} (lr {lr:g})"
                             + (f", {div}/{n} diverged" if div else ""))
                cells.append("–" if upd is None else f"{upd[0]:,.0f} ± {upd[1]:,.0f}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines).rstrip()


def plot(results: dict, out_dir: str) -> str:
    plt = _common.pyplot()
    cfg = results["config"]
    ws, wls = cfg["workers"], list(cfg["workloads"])
    t = tuned(results)
    ncol = min(2, len(wls))
    nrow = -(-len(wls) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.5 * ncol, 4.5 * nrow), squeeze=False)
    for ax, wl in zip(axes.flat, wls):
        finite = [v[1] for k, v in t.items() if k[0] == wl and v[1] is not None]
        top = max(finite) * 3 if finite else 1.0
        for name in RULES:
            cells = [t[(wl, name, w)] for w in ws]
            ys = [c[1] if c[1] is not None else top for c in cells]
            sd = [c[2] or 0.0 for c in cells]
            line, = ax.plot(ws, ys, marker="o", label=name,
                            ls="--" if "momentum" in name else "-")
            ax.fill_between(ws, [y - s for y, s in zip(ys, sd)],
                            [y + s for y, s in zip(ys, sd)], color=line.get_color(),
                            alpha=0.15)
            for w, c in zip(ws, cells):
                if c[1] is None:
                    ax.plot([w], [top], marker="x", ms=12, mew=2.5, color=line.get_color())
        if any(t[(wl, name, w)][1] is None for name in RULES for w in ws):
            ax.axhline(top, color="gray", lw=0.5)
            ax.text(ws[0], top * 1.1, "x = diverged at every lr", fontsize=8)
        _common.workers_axis(ax, ws)
        ax.set_ylabel(f"{_METRIC.get(wl, 'loss')} after {spec(cfg, wl)['steps']:,} updates")
        ax.set_title(f"{wl}, simulated, each rule at its best lr; mean ± std over "
                     f"{len(cfg['seeds'])} seeds", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    return _common.save(fig, out_dir, "staleness_rules.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/staleness_rules",
                        argv)


if __name__ == "__main__":
    main()
