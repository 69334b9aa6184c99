"""What every experiment script shares: its command line and how results are kept.

An experiment is a ``CONFIG`` dict, ``run(config, out_dir) -> results`` (JSON-able,
trains; a sweep keeps its resumable tables in ``out_dir``) and
``plot(results, out_dir) -> png path`` (reads results, never trains). ``main`` runs it,
writes ``results.json`` and the plot into ``--out``; ``--replot`` redraws from an
existing ``results.json`` without training.
"""

from __future__ import annotations

import argparse
import json
import os

from hogkit.sweeps import mean_std  # noqa: F401  (re-exported: the one definition)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, out_dir, name) -> str:
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def main(doc, run, plot, config, quick, default_out, argv=None) -> dict:
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a small grid, for a smoke test")
    p.add_argument("--out", default=default_out, help=f"results folder ({default_out})")
    p.add_argument("--replot", action="store_true",
                   help="redraw the plot from OUT/results.json without training")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    if args.replot:
        with open(path) as f:
            results = json.load(f)
    else:
        # a sweep-based experiment keeps its resumable tables (cells*.jsonl) in OUT
        results = run(quick if args.quick else config, args.out)
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        print(f"results: {path}")
    print(f"plot: {plot(results, args.out)}")
    return results


def tuned(rows, group, n_seeds, y="final_loss"):
    """Each group's best learning rate: ``{group(row): (lr, mean, std, diverged, n)}``.

    ``group(row)`` names a cell without its lr; the lr with the fewest diverged seeds,
    then the lowest mean ``y`` over the seeds that finished, wins (a diverged seed
    makes an lr lose: ``hogkit.sweeps.lr_score``, the order ``hogkit.sweeps.tune``
    ranks by). ``mean``/``std`` are None where every seed diverged."""
    from hogkit.sweeps import aggregate, lr_score
    agg = aggregate([{**r, "_g": group(r)} for r in rows], y, ("_g", "lr"))
    best = {}
    for (g, lr), (mean, std, n) in agg.items():
        div = n_seeds - n if mean is not None else n_seeds
        score = lr_score(mean, div, lr)
        if g not in best or score < best[g][0]:
            best[g] = (score, (lr, mean, std, div, n_seeds))
    return {g: v[1] for g, v in best.items()}


def slim(row):
    """A sweep row for a results file: no key, the curve as ``[t, loss]`` pairs (six
    significant digits), or None for a diverged run."""
    out = {k: v for k, v in row.items() if k not in ("curve", "key")}
    out["curve"] = ([[round(t, 6), float(f"{loss:.6g}")] for t, _, loss in row["curve"]]
                    if row.get("curve") else None)
    return out


def mean_curve(runs):
    """Mean loss over seeds at each evaluation time (runs share the time grid)."""
    n = min(len(r["curve"]) for r in runs)
    return ([runs[0]["curve"][i][0] for i in range(n)],
            [sum(r["curve"][i][1] for r in runs) / len(runs) for i in range(n)])


def value_at(curve_t, curve_y, t):
    for (t0, y0), (t1, y1) in zip(zip(curve_t, curve_y), zip(curve_t[1:], curve_y[1:])):
        if t0 <= t <= t1:
            return y0 + (y1 - y0) * (t - t0) / (t1 - t0) if t1 > t0 else y1
    return curve_y[-1]


def time_to(curve, target):
    """First time a (t, loss) curve reaches ``target`` (linear between points), or None."""
    for (t0, y0), (t1, y1) in zip(curve, curve[1:]):
        if y1 <= target:
            if y0 <= target or y1 == y0:
                return t0 if y0 <= target else t1
            return t0 + (t1 - t0) * (y0 - target) / (y0 - y1)
    return None


def edges(rows, best, group):
    """``{g: "low" | "high" | None}``: which edge of the lrs group ``g`` tried its tuned
    lr (``best`` from :func:`tuned`) sits at, or None when a worse lr lies on both
    sides (its optimum may lie outside the lrs tried otherwise)."""
    tried = {}
    for r in rows:
        tried.setdefault(group(r), set()).add(r["lr"])
    return {g: ("low" if best[g][0] == min(lrs) else
                "high" if best[g][0] == max(lrs) else None)
            for g, lrs in tried.items() if g in best}


#: what the experiments pin per workload, so a cell keeps its meaning when the
#: workload's defaults move: their mf cells run plain SGD over the ratings in their
#: shuffled order (the papers' Hogwild! setting), not mf's defaults (row-wise AdaGrad
#: in the block order)
PINNED = {"mf": {"rule": "sgd", "o.order": "sweep"}}


def pinned(wl, *, rule=True) -> dict:
    """``wl``'s pinned knobs (:data:`PINNED`) as a sweep grid's one-value lists; without
    ``rule`` where the experiment names the rule itself."""
    return {k: [v] for k, v in PINNED.get(wl, {}).items() if rule or k != "rule"}


def workload_spec(config, wl, **defaults):
    """An experiment's ``config["workloads"][wl]``, a list of lrs or a dict, as a dict:
    ``lrs``, ``steps`` (default the config's), ``options`` (the pinned ones of
    :data:`PINNED` first) and ``defaults``."""
    x = config["workloads"][wl]
    x = {"lrs": x} if isinstance(x, list) else dict(x)
    pins = {k[2:]: v for k, v in PINNED.get(wl, {}).items() if k.startswith("o.")}
    x["options"] = {**pins, **x.get("options", {})}
    return {"steps": config["steps"], **defaults, **x}


def at_tuned(rows, best, group):
    """``{g: the finished runs of group g at its tuned lr}`` (``best`` from :func:`tuned`)."""
    return {g: [r for r in rows if group(r) == g and r["lr"] == cell[0]
                and r["final_loss"] is not None] for g, cell in best.items()}


def loss_cell(cell):
    """``mean ± std`` of a tuned cell, with its diverged count."""
    lr, mean, std, div, n = cell
    if mean is None:
        return f"diverged ({n}/{n})"
    return f"{mean:.4f} ± {std:.4f}" + (f" ({div}/{n} diverged)" if div else "")


def pm(pair, spec=".4f"):
    """``"mean ± std"`` of a :func:`mean_std` pair, both in ``spec``."""
    return f"{pair[0]:{spec}} ± {pair[1]:{spec}}"


def workers_axis(ax, ws):
    """A log2 x-axis of (virtual) worker counts, log y."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ws, [str(w) for w in ws])
    ax.set_xlabel("virtual workers (mean update gap ≈ W − 1)")


def _sweep_job(job):
    path, grid, base = job
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.set_num_threads(1)             # one core per process; sums in a fixed order
    from hogkit import sweep
    return sweep(grid, base=base, out=path, mode="sim", progress=False)


def parallel_sweeps(jobs, processes=2) -> list:
    """Run simulated sweeps ``[(out path, grid, base)]`` in ``processes`` spawned
    processes (each a resumable table of its own, torch on one thread); returns each
    job's rows, in order."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(_sweep_job, jobs))
