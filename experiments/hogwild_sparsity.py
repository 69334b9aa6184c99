"""Hogwild! on sparse logistic regression: speed-up and per-update progress vs conflicts.

Claim (Niu, Recht, Ré, Wright, "Hogwild!", NIPS 2011): when each update touches a
small part of the model, lock-free parallel SGD runs with a near-linear speed-up and
the occasional overwritten update does not slow convergence per update. Conflicts
grow with skew: with Zipf-popular features, every update touches the same few hot
coordinates.

Setup: ``hogkit.sweep`` of live ``hogkit.train("logreg")`` runs with feature
popularity Zipf(a), a ∈ ``zipfs`` (0 = uniform), 1 and 2 worker processes, the same
total number of updates, three seeds; measured: updates/s (→ speed-up, 2 workers over
1 at the same seed), final loss (→ progress per update, the same ratio), and the
update gap τ (mean, p99 and max). Mean ± std over seeds. The paper's locking
baselines run beside lock-free ones (``lock="model"``: each sample holds one lock on
the model; ``lock="feature"``: a lock per weight), at Zipf 0 and 1.1. Run:

    python experiments/hogwild_sparsity.py [--quick] [--out docs/experiments/hogwild_sparsity]

It writes ``cells.jsonl`` (the sweep's rows, resumable), ``results.json`` and, from
that file only, ``speedup.png``; :func:`tables` renders the write-up's table.
"""

from __future__ import annotations

import os

import _common
from _common import pm

CONFIG = {
    "zipfs": [0.0, 1.1, 1.5, 2.0],
    "workers": [1, 2],
    "steps": 120_000,
    "seeds": [0, 1, 2],
    # the same question at smaller batches (Zipf 1.1): samples per run held at
    # samples_per_run, so a batch-1 run is not over before it is measured
    "batches": [1, 8],
    "samples_per_run": 2_000_000,
    # the paper's locking baselines (its §5: a lock on the whole model, and a lock per
    # coordinate), with lock-free runs beside them in the same invocation
    "locks": {"lock": ["none", "model", "feature"], "zipfs": [0.0, 1.1]},
}
QUICK = {**CONFIG, "zipfs": [0.0, 2.0], "steps": 20_000, "seeds": [0], "batches": [8],
         "samples_per_run": 200_000, "locks": {"lock": ["none", "model"], "zipfs": [1.1]}}


def run(config: dict, out_dir=None) -> dict:
    from hogkit import sweep
    from hogkit.report import environment
    path = os.path.join(out_dir, "cells.jsonl") if out_dir else None
    rows = sweep({"o.zipf": config["zipfs"], "workers": config["workers"],
                  "seed": config["seeds"]},
                 base={"workload": "logreg", "steps": config["steps"], "eval_every": None},
                 out=path, mode="live", progress=True)
    small = [{"batch": [b], "steps": [config["samples_per_run"] // b]}
             for b in config.get("batches", [])]
    for part in small:
        part.update({"o.zipf": [1.1], "workers": config["workers"], "seed": config["seeds"]})
    if small:
        rows += sweep(small, base={"workload": "logreg", "eval_every": None}, out=path,
                      mode="live", progress=True)
    locks = config.get("locks")
    if locks:
        rows += sweep({"o.lock": locks["lock"], "o.zipf": locks["zipfs"],
                       "workers": config["workers"], "seed": config["seeds"]},
                      base={"workload": "logreg", "steps": config["steps"],
                            "eval_every": None}, out=path, mode="live", progress=True)
    keep = [{k: v for k, v in r.items() if k not in ("curve", "key")} for r in rows]
    return {"config": config, "rows": keep, "environment": environment()}


def cells(results):
    """``{(zipf, W): dict}``: mean ± std over seeds of the rate, loss and gaps, and of
    the per-seed speed-up and loss ratio against one worker."""
    rows, out = [r for r in results["rows"] if "batch" not in r and "o.lock" not in r], {}
    for a in results["config"]["zipfs"]:
        one = {r["seed"]: r for r in rows if r["o.zipf"] == a and r["workers"] == 1}
        for w in results["config"]["workers"]:
            rs = [r for r in rows if r["o.zipf"] == a and r["workers"] == w]
            rate = [r["updates"] / r["wall_s"] for r in rs]
            out[(a, w)] = {
                "n": len(rs),
                "rate": _common.mean_std(rate),
                "speedup": _common.mean_std([x / (one[r["seed"]]["updates"]
                                                  / one[r["seed"]]["wall_s"])
                                             for x, r in zip(rate, rs)]),
                "loss": _common.mean_std([r["final_loss"] for r in rs]),
                "loss_ratio": _common.mean_std([r["final_loss"] / one[r["seed"]]["final_loss"]
                                                for r in rs]),
                "gap_mean": _common.mean_std([r["gap_mean"] for r in rs]),
                "gap_p99": max(r["gap_p99"] for r in rs),
                "gap_max": max(r["gap_max"] for r in rs)}
    return out


def by_batch(results):
    """``{(batch, W): (rate mean/std, speed-up mean/std, gap mean/std)}`` of the
    small-batch part (Zipf 1.1), speed-up per seed against one worker."""
    rows, out = [r for r in results["rows"] if "batch" in r], {}
    for b in results["config"].get("batches", []):
        one = {r["seed"]: r["updates"] / r["wall_s"] for r in rows
               if r["batch"] == b and r["workers"] == 1}
        for w in results["config"]["workers"]:
            rs = [r for r in rows if r["batch"] == b and r["workers"] == w]
            rate = [r["updates"] / r["wall_s"] for r in rs]
            out[(b, w)] = (_common.mean_std(rate),
                           _common.mean_std([x / one[r["seed"]] for x, r in zip(rate, rs)]),
                           _common.mean_std([r["gap_mean"] for r in rs]))
    return out


def by_lock(results):
    """``{(lock, zipf, W): dict}`` of the locking part: rate, its ratio to the lock-free
    run's at the same seed and worker count, the speed-up over the same lock's one
    worker, and the final loss (mean ± std over seeds)."""
    spec = results["config"].get("locks")
    rows, out = [r for r in results["rows"] if "o.lock" in r], {}
    if not spec:
        return out
    rate = {(r["o.lock"], r["o.zipf"], r["workers"], r["seed"]): r["updates"] / r["wall_s"]
            for r in rows}
    for lock in spec["lock"]:
        for a in spec["zipfs"]:
            for w in results["config"]["workers"]:
                rs = [r for r in rows if (r["o.lock"], r["o.zipf"], r["workers"])
                      == (lock, a, w)]
                mine = [rate[(lock, a, w, r["seed"])] for r in rs]
                out[(lock, a, w)] = {
                    "rate": _common.mean_std(mine),
                    "vs_free": _common.mean_std([x / rate[("none", a, w, r["seed"])]
                                                 for x, r in zip(mine, rs)]),
                    "speedup": _common.mean_std([x / rate[(lock, a, 1, r["seed"])]
                                                 for x, r in zip(mine, rs)]),
                    "loss": _common.mean_std([r["final_loss"] for r in rs])}
    return out


def tables(results) -> str:
    c = cells(results)
    lines = ["| Zipf a | workers | updates/s | speed-up | final log-loss | loss ratio vs 1 | "
             "mean update gap | p99 gap (max over seeds) | max gap |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (a, w), x in c.items():
        lines.append(f"| {a:g} | {w} | {pm(x['rate'], ',.0f')} | {pm(x['speedup'], '.2f')} | "
                     f"{pm(x['loss'])} | {pm(x['loss_ratio'], '.3f')} | "
                     f"{pm(x['gap_mean'], '.2f')} | {x['gap_p99']} | {x['gap_max']} |")
    small = by_batch(results)
    if small:
        lines += ["", f"Smaller batches at Zipf 1.1 ({results['config']['samples_per_run']:,} "
                  "samples per run; batch 64 is the table above):", "",
                  "| batch | workers | updates/s | speed-up | mean update gap |",
                  "|---|---|---|---|---|"]
        for (b, w), (rate, sp, gap) in small.items():
            lines.append(f"| {b} | {w} | {pm(rate, ',.0f')} | {pm(sp, '.2f')} | "
                         f"{pm(gap, '.2f')} |")
    locked = by_lock(results)
    if locked:
        lines += ["", f"Locking baselines ({results['config']['steps']:,} updates of batch "
                  f"64 per run, lock-free runs beside them in the same invocation):", "",
                  "| lock | Zipf a | workers | updates/s | x lock-free, same workers | "
                  "speed-up over 1 worker | final log-loss |", "|---|---|---|---|---|---|---|"]
        for (lock, a, w), x in locked.items():
            lines.append(f"| {lock} | {a:g} | {w} | {pm(x['rate'], ',.0f')} | "
                         f"{pm(x['vs_free'], '.2f')} | {pm(x['speedup'], '.2f')} | "
                         f"{pm(x['loss'])} |")
    return "\n".join(lines)


def plot(results: dict, out_dir: str) -> str:
    plt = _common.pyplot()
    c = cells(results)
    top = max(results["config"]["workers"])
    zs = results["config"]["zipfs"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    sp = [c[(z, top)]["speedup"] for z in zs]
    axes[0].bar([f"{z:g}" for z in zs], [m for m, _ in sp], yerr=[s for _, s in sp],
                capsize=4)
    axes[0].axhline(top, ls="--", c="gray", label="linear")
    axes[0].set_xlabel("Zipf exponent of feature popularity (0 = uniform)")
    axes[0].set_ylabel(f"speed-up, {top} workers over 1")
    axes[0].legend()
    for w in results["config"]["workers"]:
        ls = [c[(z, w)]["loss"] for z in zs]
        axes[1].errorbar([f"{z:g}" for z in zs], [m for m, _ in ls], yerr=[s for _, s in ls],
                         marker="o", capsize=3, label=f"{w} worker(s)")
    axes[1].set_xlabel("Zipf exponent")
    axes[1].set_ylabel(f"log-loss after {results['config']['steps']:,} updates")
    axes[1].legend()
    fig.suptitle("Hogwild! sparse logistic regression: same updates, 1 vs "
                 f"{top} lock-free workers, mean ± std over "
                 f"{len(results['config']['seeds'])} seeds", fontsize=10)
    return _common.save(fig, out_dir, "speedup.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/hogwild_sparsity", argv)


if __name__ == "__main__":
    main()
