"""Does the simulator's staleness match a real run's?

For 2 live workers (``hogkit.train``), fit the simulator's step-time model to the
measured per-worker step times (``hogkit.calibrate.fit_delays``: mean step time per
worker, log-normal spread from the event log's step intervals), simulate the twin
run with the same workload, policy, rule and total iterations, and compare the
update-gap distributions (total-variation distance, means). Two cases: both workers
at full speed, and worker 1 slowed 3× (``Slowdown(3)``), where the gap distribution
has structure (the fast worker sees ~1/3 update per step, the slow one ~3).

    python experiments/sim_vs_real.py [--quick] [--out docs/experiments/sim_vs_real]

Writes ``results.json`` and, from it only, ``sim_vs_real.png``. The real runs depend
on the machine (core count, other load); the write-up quotes the figures measured.
"""

from __future__ import annotations

import os
import tempfile

import _common
import hogkit

CONFIG = {"workload": "mf", "seconds": 4.0, "repeats": 3, "seed": 0,
          "cases": {"even": {}, "straggler 1:3": {"1": 3.0}}}
QUICK = {**CONFIG, "seconds": 1.0, "repeats": 1}


def run(config: dict, out_dir=None) -> dict:
    from hogkit.engine.delays import Slowdown
    from hogkit.report import environment
    from hogkit.calibrate import agreement
    out = {"config": config, "cases": {}, "environment": environment()}
    for name, slow in config["cases"].items():
        stragglers = {int(r): Slowdown(f) for r, f in slow.items()}
        reps = []
        for k in range(config["repeats"]):
            with tempfile.TemporaryDirectory() as tmp:
                real = hogkit.train(config["workload"],
                                    workers=hogkit.Workers(2, stragglers=stragglers),
                                    outputs=hogkit.Outputs(tmp, eval_every=None, progress=False,
                                                           keep_params=False),
                                    seconds=config["seconds"], seed=config["seed"] + k)
                cmp = agreement(real, config["workload"], seed=config["seed"] + k,
                                events=os.path.join(tmp, "events.jsonl"))
            reps.append({"tv": cmp["tv"], "mean_sim": cmp["mean_a"], "mean_real": cmp["mean_b"],
                         "p_sim": {str(g): p for g, p in cmp["p_a"].items()},
                         "p_real": {str(g): p for g, p in cmp["p_b"].items()},
                         "delays": cmp["delays"],
                         "real_iterations": [w["iterations"] for w in real.per_worker],
                         "real_gap_p99": real.staleness["update_gap"]["p99"],
                         "real_gap_max": real.staleness["update_gap"]["max"]})
            print(f"{name:<14} rep {k}: TV {cmp['tv']:.3f}  mean gap sim {cmp['mean_a']:.3f} "
                  f"real {cmp['mean_b']:.3f}", flush=True)
        out["cases"][name] = reps
    return out


def tables(results) -> str:
    """The write-up's table: per case, mean and range over the repeats of the total
    variation distance and of the mean update gap, real and simulated."""
    def cell(xs):
        return f"{sum(xs) / len(xs):.3f} ({min(xs):.3f}–{max(xs):.3f})"

    lines = ["| case | TV | mean gap, real | mean gap, simulated |", "|---|---|---|---|"]
    for case, reps in results["cases"].items():
        lines.append(f"| {case} | {cell([r['tv'] for r in reps])} | "
                     f"{cell([r['mean_real'] for r in reps])} | "
                     f"{cell([r['mean_sim'] for r in reps])} |")
    return "\n".join(lines)


def plot(results: dict, out_dir: str) -> str:
    plt = _common.pyplot()
    cases = results["cases"]
    fig, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 4), squeeze=False)
    for ax, (name, reps) in zip(axes[0], cases.items()):
        rep = reps[0]
        xs = list(range(0, 9))
        width = 0.4
        for off, key, label in ((-width / 2, "p_real", "real (2 processes)"),
                                (width / 2, "p_sim", "simulated twin")):
            ax.bar([x + off for x in xs], [rep[key].get(str(x), 0.0) for x in xs], width,
                   label=label)
        ax.set_title(f"{name}: TV {rep['tv']:.2f}, mean gap real {rep['mean_real']:.2f} / "
                     f"sim {rep['mean_sim']:.2f}", fontsize=9)
        ax.set_xlabel("update gap τ")
        ax.set_ylabel("fraction of updates")
        ax.set_xticks(xs)
        ax.legend(fontsize=8)
    return _common.save(fig, out_dir, "sim_vs_real.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/sim_vs_real", argv)


if __name__ == "__main__":
    main()
