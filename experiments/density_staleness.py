"""Update density × staleness: how much of each update must be applied, and does
keeping the rest as a residual matter, as workers (and so staleness) grow?

The stale-value tolerance question: applying only a fraction d of every update
(the top-|d·n| entries by magnitude) cuts write traffic and conflicts; the unsent
part is either dropped or kept as a per-worker residual added to the next update
(error feedback). This experiment measures the loss reached after the same number
of updates for d ∈ ``densities`` × W ∈ ``workers`` virtual workers, residual on and
off, on sparse logistic regression with plain SGD.

Setup: ``hogkit.sweep`` of ``hogkit.simulate`` runs (virtual time, exact staleness,
deterministic per seed), log-normal step times, the same total number of updates per
cell, three seeds. **Each (density, unsent part, W) at its own learning rate**, tuned
by :func:`hogkit.sweeps.tune` from ``lrs``: the lowest mean final loss over the seeds
wins (a diverged seed makes an lr lose), and lrs are added past the edge holding the
best (twice as far, at most ``extend`` per edge) until a worse lr lies on both sides,
or the table says which bound it hit. Dropping part of every update also shrinks the
step, so without tuning a filter's "staleness tolerance" would partly be a smaller
learning rate's.

    python experiments/density_staleness.py [--quick] [--out docs/experiments/density_staleness]

Writes ``cells.jsonl`` (the sweep's table: resumable), ``results.json`` and, from it
only, ``density_staleness.png``; :func:`tables` renders the write-up's table.
"""

from __future__ import annotations

import os

import _common

CONFIG = {
    "workload": "logreg",
    "workers": [1, 8, 32, 64],
    "densities": [1.0, 0.5, 0.25, 0.1],
    "residual": [True, False],
    "steps": 30_000,
    "delays": "lognormal:1e-3:0.5",
    "seeds": [0, 1, 2],
    "lrs": [0.25, 0.5, 1.0, 2.0],
    "extend": 6,
}
QUICK = {**CONFIG, "workers": [1, 32], "densities": [1.0, 0.25], "steps": 6_000,
         "seeds": [0], "lrs": [0.5], "extend": 1}


def spec(d, residual):
    """The sweep's density string (1.0: the full update)."""
    return 1.0 if d == 1.0 else f"topk:{d:g}" + ("" if residual else ":dropped")


def filters(config):
    """``[(d, residual or None)]`` in table order."""
    return [(d, r) for d in config["densities"]
            for r in (config["residual"] if d < 1.0 else [None])]


def run(config: dict, out_dir=None) -> dict:
    from hogkit.report import environment
    from hogkit.sweeps import load, tune
    path = os.path.join(out_dir or ".", "cells.jsonl")
    groups = tune({"density": [spec(d, r) for d, r in filters(config)],
                   "workers": config["workers"], "lr": config["lrs"],
                   "seed": config["seeds"]},
                  base={"workload": config["workload"], "steps": config["steps"],
                        "delays": config["delays"]}, out=path, mode="sim",
                  extend=config.get("extend", 0), progress=True)
    edges = [{"key": list(_key(g["cell"])), "bracketed": g["bracketed"],
              "bound": g.get("bound")} for g in groups]
    return {"config": config, "rows": [_common.slim(r) for r in load(path)],
            "edges": edges, "environment": environment()}


def bracketed(results):
    """``{(d, residual, W): None (bracketed) or the bound its tuning hit}``; every
    cell "not recorded" for results made before the tuning widened its grid."""
    if "edges" not in results:
        return {}
    return {tuple(e["key"]): (None if e["bracketed"] else e["bound"])
            for e in results["edges"]}


def _key(r):
    d = r["density"]
    if d in (1, 1.0):
        return (1.0, None, r["workers"])
    bits = str(d).split(":")
    return (float(bits[1]), bits[-1] != "dropped", r["workers"])


def tuned(results):
    """``{(d, residual, W): (lr, mean, std, diverged, n)}``."""
    return _common.tuned(results["rows"], _key, len(results["config"]["seeds"]))


def highlight(results) -> str:
    """The README's line on this experiment, rendered from the results (a test checks
    the README carries it word for word)."""
    t, b = tuned(results), bracketed(results)

    def cell(d, residual, w):
        return f"{t[(d, residual, w)][1]:.4f} ± {t[(d, residual, w)][2]:.4f}"
    edge = [k for k in ((1.0, None, 64), (0.1, True, 64), (0.1, False, 64))
            if b.get(k, "not recorded")]
    tuning = ("every lr bracketed" if not edge else
              f"{len(edge)} of these cells' lr at an edge of its grid")
    at64 = {k: v[1] for k, v in t.items() if k[2] == 64 and v[1] is not None}
    best = min(at64, key=at64.get) == (0.1, False, 64)
    return (f"with fresh updates (W = 1) top-10 % with a residual matches full updates "
            f"({cell(0.1, True, 1)} against {cell(1.0, None, 1)}); at W = 64 it ends "
            f"worse ({cell(0.1, True, 64)} against {cell(1.0, None, 64)}), and dropping "
            f"the rest ends {'lowest of all, at' if best else 'at'} {cell(0.1, False, 64)}; "
            f"{tuning}. Simulated, one workload (logreg).")


def gaps(results):
    from hogkit.sweeps import aggregate
    return {w: m for (w,), (m, _, _) in aggregate(results["rows"], "gap_mean",
                                                    ("workers",)).items()}


def _cell(lr, mean, std, div, n, bound=None):
    if mean is None:
        return f"diverged ({n}/{n})"
    edge = f", {bound} bound" if bound else ""
    return (f"{mean:.4f} ± {std:.4f} (lr {lr:g}{edge})"
            + (f", {div}/{n} diverged" if div else ""))


def tables(results) -> str:
    cfg = results["config"]
    ws, t, g, b = cfg["workers"], tuned(results), gaps(results), bracketed(results)
    lines = ["| density | unsent part | " + " | ".join(f"W={w}" for w in ws) + " |",
             "|---|---|" + "---|" * len(ws)]
    for d, r in filters(cfg):
        unsent = "—" if r is None else ("residual" if r else "dropped")
        lines.append(f"| {d:g} | {unsent} | " + " | ".join(
            _cell(*t[(d, r, w)], b.get((d, r, w))) for w in ws) + " |")
    lines += ["", "| W | " + " | ".join(str(w) for w in ws) + " |",
              "|---|" + "---|" * len(ws),
              "| mean update gap | " + " | ".join(f"{g[w]:.1f}" for w in ws) + " |"]
    return "\n".join(lines)


def plot(results: dict, out_dir: str) -> str:
    plt = _common.pyplot()
    cfg = results["config"]
    ws, t = cfg["workers"], tuned(results)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for d, r in filters(cfg):
        cells = [t[(d, r, w)] for w in ws]
        ys = [c[1] for c in cells]
        sd = [c[2] or 0.0 for c in cells]
        label = "d = 1 (full update)" if r is None else \
            f"d = {d:g}, {'residual kept' if r else 'rest dropped'}"
        line, = ax.plot(ws, ys, marker="o", label=label, ls="-" if r in (True, None) else ":")
        ok = [(w, y, s) for w, y, s in zip(ws, ys, sd) if y is not None]
        if ok:
            ax.fill_between([w for w, _, _ in ok], [y - s for _, y, s in ok],
                            [y + s for _, y, s in ok], color=line.get_color(), alpha=0.15)
    _common.workers_axis(ax, ws)
    ax.set_ylabel(f"log-loss after {cfg['steps']:,} updates")
    ax.set_title(f"{cfg['workload']}, simulated: update density (top-k) × staleness, each "
                 f"cell at its tuned lr, mean ± std over {len(cfg['seeds'])} seeds",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return _common.save(fig, out_dir, "density_staleness.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/density_staleness", argv)


if __name__ == "__main__":
    main()
