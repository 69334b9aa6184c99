"""P3: does sending input-side slices first pay, how much, and does the model predict it?

Runs the ``p3`` benchmark scenario (``hogkit.benchmarks.p3``: the communication model
on VGG-19, ResNet-50 and a Sockeye-like model across bandwidths, and the live trainer
+ parameter-server demonstration, three rounds of every schedule) and plots the
simulated gain against bandwidth with the live figures beside it.
Write-up: docs/experiments/p3.md.

    python experiments/p3.py            # ~6 minutes
    python experiments/p3.py --quick    # ~1 minute, a smoke test
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import main as _main  # noqa: E402
from _common import pyplot, save  # noqa: E402

CONFIG = {"quick": False}
QUICK = {"quick": True}
SCHEDULES = ("fifo", "slicing", "priority", "p3")


def run(config, out_dir=None) -> dict:
    from hogkit.benchmarks import p3
    return p3.run(quick=config["quick"])


def plot(results, out_dir) -> str:
    from hogkit.benchmarks.p3 import draw_gains
    plt = pyplot()
    n = len(results["simulated"]["sweep"])
    fig, axes = plt.subplots(1, n + 1, figsize=(4.6 * (n + 1), 4))
    draw_gains(axes[:n], results)
    lv = results["live"]
    ax = axes[-1]
    xs = range(len(SCHEDULES))
    for k, s in enumerate(SCHEDULES):
        row = lv["schedules"][s]
        ax.scatter([k] * len(row["iteration_s"]), [t * 1e3 for t in row["iteration_s"]],
                   color="C0", s=14, label="live (each run)" if k == 0 else None)
        ax.scatter([k], [row["predicted_iteration_s"] * 1e3], marker="x", color="C3",
                   s=50, label="model (measured profile)" if k == 0 else None)
        if "calibrated_iteration_s" in row:
            ax.scatter([k], [row["calibrated_iteration_s"] * 1e3], marker="+",
                       color="C2", s=60,
                       label="model (calibrated compute)" if k == 0 else None)
    ax.set_xticks(list(xs), SCHEDULES)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("ms per iteration")
    ax.set_title(f"live: trainer + server, {lv['bandwidth'] / 1e6:g} MB/s links")
    ax.legend(fontsize=8)
    return save(fig, out_dir, "p3.png")


def tables(results) -> str:
    """The write-up's tables (docs/experiments/p3.md, between the ``tables`` markers),
    rendered from results; ``tests/test_experiments.py`` checks the committed write-up
    against its results file with this."""
    sim = results["simulated"]
    ref = results["reference_gbps"]
    out = [f"Simulated gain over FIFO ({sim['workers']} workers, {sim['servers']} shards, "
           f"BSP, slices of {sim['slice']:,}; compute from FLOPs at 5 TFLOP/s):", "",
           "| model | params | compute/iter | FIFO iter at " + f"{ref:g} Gbit/s | "
           + " | ".join(f"{s} at {ref:g}" for s in SCHEDULES[1:])
           + " | P3 peak (at Gbit/s) | slicing, priority at that peak |",
           "|---|---|---|---|" + "---|" * (len(SCHEDULES) - 1) + "---|---|"]
    for name, rows in sim["sweep"].items():
        p = sim["profiles"][name]
        row = next(r for r in rows if r["gbps"] == ref)
        pk = results["peak"][name]
        out.append(f"| {name} | {p['params'] / 1e6:.1f} M | {p['compute_s'] * 1e3:.0f} ms | "
                   f"{row['fifo']['iteration_s'] * 1e3:.0f} ms | "
                   + " | ".join(f"{row[s]['gain']:.2f}" for s in SCHEDULES[1:])
                   + f" | **{pk['gain']:.2f}** ({pk['gbps']:g}) | "
                   f"{pk['slicing']:.2f}, {pk['priority']:.2f} |")
    lv = results["live"]
    out += ["", f"Live, trainer + parameter server, {lv['bandwidth'] / 1e6:g} MB/s links, "
            f"{lv['rounds']} runs per schedule (median, range); model = "
            f"`simulate_comm` on the measured profile (compute "
            f"{lv['profile']['compute_s'] * 1e3:.0f} ms/iteration):", "",
            "| schedule | live ms/iter | model ms/iter | model error | calibrated model | "
            "layer-1 wait, live | layer-1 wait, model | trainer CPU/iter |",
            "|---|---|---|---|---|---|---|---|"]
    for s in SCHEDULES:
        row = lv["schedules"][s]
        it = row["iteration_s"]
        w0 = sorted(row["layer0_wait_s"])
        cpu = sorted(row["trainer_cpu_s"])
        cal = (f"{row['calibrated_iteration_s'] * 1e3:.0f} ({row['calibrated_error'] * 100:+.0f} %)"
               if "calibrated_iteration_s" in row else "")
        out.append(f"| {s} | {row['median_iteration_s'] * 1e3:.0f} ({min(it) * 1e3:.0f}–"
                   f"{max(it) * 1e3:.0f}) | {row['predicted_iteration_s'] * 1e3:.0f} | "
                   f"{row['prediction_error'] * 100:+.0f} % | {cal} | "
                   f"{w0[len(w0) // 2] * 1e3:.0f} ms | "
                   f"{row['predicted_layer0_wait_s'] * 1e3:.0f} ms | "
                   f"{cpu[len(cpu) // 2] * 1e3:.0f} ms |")
    out += ["", f"Live gain of P3 over FIFO: **{lv['live_gain_p3']:.2f}** "
            f"(model: {lv['predicted_gain_p3']:.2f})."]
    return "\n".join(out)


def main(argv=None):
    return _main(__doc__, run, plot, CONFIG, QUICK,
                 os.path.join("docs", "experiments", "p3"), argv)


if __name__ == "__main__":
    main()
