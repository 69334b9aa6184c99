"""What every experiment script shares: its command line and how results are kept.

An experiment is a ``CONFIG`` dict, ``run(config) -> results`` (JSON-able, trains) and
``plot(results, out_dir) -> png path`` (reads results, never trains). ``main`` runs it,
writes ``results.json`` and the plot into ``--out``; ``--replot`` redraws from an
existing ``results.json`` without training.
"""

from __future__ import annotations

import argparse
import json
import os


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
        import inspect
        cfg = quick if args.quick else config
        # a sweep-based experiment keeps its resumable table (cells.jsonl) in OUT
        results = (run(cfg, args.out) if "out_dir" in inspect.signature(run).parameters
                   else run(cfg))
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        print(f"results: {path}")
    print(f"plot: {plot(results, args.out)}")
    return results


def tuned(rows, group, n_seeds, y="final_loss"):
    """Each group's best learning rate: ``{group(row): (lr, mean, std, diverged, n)}``.

    ``group(row)`` names a cell without its lr; the lr with the fewest diverged seeds,
    then the lowest mean ``y`` over the seeds that finished, wins (a diverged seed
    makes an lr lose). ``mean``/``std`` are None where every seed diverged."""
    from hogkit.sweeps import aggregate
    agg = aggregate([{**r, "_g": group(r)} for r in rows], y, ("_g", "lr"))
    best = {}
    for (g, lr), (mean, std, n) in agg.items():
        div = n_seeds - n if mean is not None else n_seeds
        score = (div, mean if mean is not None else float("inf"), lr)
        if g not in best or score < best[g][0]:
            best[g] = (score, (lr, mean, std, div, n_seeds))
    return {g: v[1] for g, v in best.items()}
