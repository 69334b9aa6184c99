"""Scenario ``simulate``: simulated updates per second, fused engine vs general engine.

Sparse logistic regression (the default data: 50k samples × 20k features, Zipf
features, ~30 nonzeros per sample), 64 virtual workers, Async, plain SGD,
log-normal compute times. For each batch size the figure is updates applied per
second of the event loop (``Run.extra["engine_updates_per_s"]``: data generation,
the kernel's load from numba's cache and the initial/final loss are excluded), the
median over rounds; the baseline is the general (Python) engine on the same
configuration, measured in the same invocation. ``ratios`` holds
``fused_over_python_b<B>`` and ``fused_1e6_updates_s_b<B>`` (seconds a 10^6-update
study takes).

What bounds the fused engine: not the event loop (~0.5 µs per update at 64 workers)
but the gradient's random reads of the CSR rows (12 MB, beyond L2): about 25-40 ns
per nonzero, so a batch of 64 samples (~1500 nonzeros) costs ~15 µs whatever the
engine; the loop reaches ≥ 200k updates/s at batch ≤ 16.

``ssp``: issue 26's configuration, ``hogkit sim --workload logreg --workers 64 --policy
ssp:3 --batch 16`` (200,000 updates, the default step times and evaluation points),
the fused engine's ``engine_updates_per_s`` after a first run that loads the kernels,
median over rounds, with evaluation points and without (``eval_every=None``); and the
same at 512 workers without evaluation points (where finding the next event among
the workers weighs most).

``queue``: the same configuration (with its evaluation points) at 8, 16, 32 and 64
workers, the next event found by the scan of every worker and by the tournament tree
(``kernels.layout.QUEUE_MIN_WORKERS`` set for the run: the loop's code is the same,
only the queue's slots decide), alternating in every round so that a drift of the
machine favours neither; medians and the median of each round's tree / scan ratio.

``cli``: the same command as a user runs it, each round a fresh process after one that
fills numba's cache (not counted): the ``engine_updates_per_s`` and ``engine_setup_s``
of its ``summary.json`` (the per-worker set-up before the loop), its ``wall_s`` and the
whole process's seconds, medians.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import hogkit
from hogkit import workloads
from hogkit.engine.simulator import simulate

BATCHES = (64, 16, 4)


def _rate(wl, batch, steps, engine, rounds):
    rates = []
    for r in range(rounds):
        run = simulate(wl, workers=hogkit.Workers(64, delays="lognormal:1e-3:0.5"),
                       engine=engine, outputs=hogkit.Outputs(evals=1, keep_params=False),
                       steps=steps, batch=batch, seed=r)
        rates.append(run.extra["engine_updates_per_s"])
    return statistics.median(rates), rates, run


def _ssp(steps, rounds):
    from hogkit.policy import SSP
    out = {}
    for label, every in (("evals", "auto"), ("no_evals", None)):
        simulate("logreg", workers=64,
                 outputs=hogkit.Outputs(eval_every=every, keep_params=False), policy=SSP(3),
                 batch=16, steps=steps // 10)
        rates = [simulate("logreg", workers=64,
                          outputs=hogkit.Outputs(eval_every=every, keep_params=False),
                          policy=SSP(3), batch=16, steps=steps).extra["engine_updates_per_s"]
                 for _ in range(rounds)]
        out[label] = {"updates_per_s": statistics.median(rates), "all": rates}
    simulate("logreg", workers=512,
             outputs=hogkit.Outputs(eval_every=None, keep_params=False), policy=SSP(3),
             batch=16, steps=steps // 10)
    rates = [simulate("logreg", workers=512,
                      outputs=hogkit.Outputs(eval_every=None, keep_params=False),
                      policy=SSP(3), batch=16, steps=steps).extra["engine_updates_per_s"]
             for _ in range(rounds)]
    out["w512_no_evals"] = {"updates_per_s": statistics.median(rates), "all": rates}
    return {"workers": 64, "policy": "ssp:3", "batch": 16, "steps": steps, **out}


QUEUE_WORKERS = (8, 16, 32, 64)


def _queue(steps, rounds, counts=QUEUE_WORKERS):
    from hogkit.kernels import layout
    from hogkit.policy import SSP
    kept = layout.QUEUE_MIN_WORKERS
    out = {}
    try:
        for W in counts:
            rates = {"scan": [], "tree": []}
            for r in range(rounds):
                for how in (("scan", "tree") if r % 2 == 0 else ("tree", "scan")):
                    layout.QUEUE_MIN_WORKERS = W + 1 if how == "scan" else W
                    run = simulate("logreg", workers=W,
                                   outputs=hogkit.Outputs(keep_params=False), policy=SSP(3),
                                   batch=16, steps=steps)
                    rates[how].append(run.extra["engine_updates_per_s"])
            out[str(W)] = {"scan": statistics.median(rates["scan"]),
                           "tree": statistics.median(rates["tree"]),
                           "tree_over_scan": statistics.median(
                               t / s for t, s in zip(rates["tree"], rates["scan"])),
                           "scan_all": rates["scan"], "tree_all": rates["tree"]}
    finally:
        layout.QUEUE_MIN_WORKERS = kept
    return {"policy": "ssp:3", "batch": 16, "steps": steps, "rounds": rounds,
            "by_workers": out}


def _cli(steps, rounds):
    cmd = [sys.executable, "-m", "hogkit.cli", "sim", "--workload", "logreg", "--workers",
           "64", "--policy", "ssp:3", "--batch", "16", "--steps", str(steps), "--no-progress"]
    runs = []
    for r in range(rounds + 1):                   # the first fills the cache: not counted
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            subprocess.run(cmd + ["--out", d], check=True, capture_output=True, timeout=600)
            process_s = time.perf_counter() - t
            with open(os.path.join(d, "summary.json")) as f:
                s = json.load(f)
        if r:
            runs.append({"process_s": process_s, "wall_s": s["wall_s"],
                         "engine_updates_per_s": s["engine_updates_per_s"],
                         "engine_setup_s": s.get("engine_setup_s")})
    med = {k: statistics.median(x[k] for x in runs) for k in runs[0]
           if runs[0][k] is not None}
    return {"command": " ".join(["hogkit"] + cmd[3:]), "runs": runs, "median": med}


def run(quick=False, rounds=None, batches=BATCHES) -> dict:
    rounds = rounds or (1 if quick else 3)
    wl = workloads.get("logreg")
    simulate(wl, workers=64, outputs=hogkit.Outputs(evals=1), steps=640,
             batch=4)                                            # load/compile kernels
    fused_steps = 100_000 if quick else 500_000
    python_steps = 5_000 if quick else 20_000
    result = {"scenario": "simulate", "rounds": rounds, "workers": 64,
              "workload": wl.config(), "by_batch": {}, "ratios": {}}
    for b in batches:
        f, f_all, frun = _rate(wl, b, fused_steps, "compiled", rounds)
        p, p_all, _ = _rate(wl, b, python_steps, "python", rounds)
        result["by_batch"][str(b)] = {
            "fused_updates_per_s": f, "fused_all": f_all, "fused_steps": fused_steps,
            "python_updates_per_s": p, "python_all": p_all, "python_steps": python_steps,
            "mean_gap": frun.staleness["update_gap"]["mean"]}
        result["ratios"][f"fused_over_python_b{b}"] = f / p if p else 0.0
        result["ratios"][f"fused_1e6_updates_s_b{b}"] = 1e6 / f if f else 0.0
    result["ssp"] = _ssp(20_000 if quick else 200_000, rounds)
    result["queue"] = _queue(20_000 if quick else 200_000, max(rounds, 2 if quick else 5))
    result["cli"] = _cli(20_000 if quick else 200_000, rounds)
    return result


def format_table(result) -> str:
    lines = [f"simulate: logreg, {result['workers']} virtual workers, median of "
             f"{result['rounds']} round(s)",
             f"{'batch':>6}{'fused upd/s':>14}{'python upd/s':>14}{'speedup':>9}"
             f"{'1e6 upd (s)':>13}{'mean gap':>10}"]
    for b, r in result["by_batch"].items():
        lines.append(f"{b:>6}{r['fused_updates_per_s']:>14,.0f}"
                     f"{r['python_updates_per_s']:>14,.0f}"
                     f"{result['ratios'][f'fused_over_python_b{b}']:>9.1f}"
                     f"{result['ratios'][f'fused_1e6_updates_s_b{b}']:>13.2f}"
                     f"{r['mean_gap']:>10.1f}")
    if "ssp" in result:
        s = result["ssp"]
        lines.append(f"ssp:3, 64 workers, batch 16, {s['steps']:,} updates: fused engine "
                     f"{s['evals']['updates_per_s']:,.0f} upd/s with evaluation points, "
                     f"{s['no_evals']['updates_per_s']:,.0f} without")
    if "queue" in result:
        lines.append("next event at 64 workers and fewer, tree / scan (ssp:3, batch 16): " +
                     ", ".join(f"{w} workers {q['tree_over_scan']:.2f}x"
                               for w, q in result["queue"]["by_workers"].items()))
    if "cli" in result:
        m = result["cli"]["median"]
        setup = f", set-up {m['engine_setup_s']:.3f} s" if "engine_setup_s" in m else ""
        lines.append(f"{result['cli']['command']} (fresh processes): engine "
                     f"{m['engine_updates_per_s']:,.0f} upd/s{setup}, wall {m['wall_s']:.2f} s, "
                     f"process {m['process_s']:.2f} s")
    return "\n".join(lines)


def format_queue(result) -> str:
    """The scan against the tree, by workers, as RESULTS.md shows it."""
    q = result["queue"]
    rows = ["| workers | scan upd/s | tree upd/s | tree / scan (median of rounds) |",
            "|---|---|---|---|"]
    for w, r in q["by_workers"].items():
        rows.append(f"| {w} | {r['scan']:,.0f} | {r['tree']:,.0f} | "
                    f"{r['tree_over_scan']:.2f}x |")
    return "\n".join(rows)


def format_markdown(result, before=None) -> str:
    """The fused engine's rates as RESULTS.md shows them; with ``before`` (the same
    scenario's JSON at an earlier commit) a column of its rates and the ratio."""
    head = "| configuration | fused engine upd/s |"
    rule = "|---|---|"
    if before:
        head += " before | after / before |"
        rule += "---|---|"
    rows = [head, rule]

    def row(label, now, then):
        line = f"| {label} | {now:,.0f} |"
        if before:
            line += f" {then:,.0f} | {now / then:.2f}x |"
        rows.append(line)
    for b, r in result["by_batch"].items():
        then = before["by_batch"][b]["fused_updates_per_s"] if before else None
        row(f"Async, lognormal step times, batch {b}", r["fused_updates_per_s"], then)
    if "ssp" in result:
        for key, label in (("evals", "with evaluation points"),
                           ("no_evals", "without evaluation points")):
            then = before["ssp"][key]["updates_per_s"] if before else None
            row(f"SSP(3), batch 16, {label}", result["ssp"][key]["updates_per_s"], then)
        if "w512_no_evals" in result["ssp"] and (not before or "w512_no_evals"
                                                 in before["ssp"]):
            then = before["ssp"]["w512_no_evals"]["updates_per_s"] if before else None
            row("SSP(3), batch 16, 512 workers, without evaluation points",
                result["ssp"]["w512_no_evals"]["updates_per_s"], then)
    cli, was = result.get("cli"), (before or {}).get("cli")
    if cli and (not before or was):
        m = cli["median"]
        row(f"`{cli['command']}`, a fresh process", m["engine_updates_per_s"],
            was["median"]["engine_updates_per_s"] if was else None)
        rows.append("")
        line = (f"That command's process: {m['process_s']:.2f} s in all, `wall_s` "
                f"{m['wall_s']:.2f} s, set-up before the loop {m['engine_setup_s']:.3f} s")
        if was:
            w = was["median"]
            setup = (f"{w['engine_setup_s']:.3f} s" if "engine_setup_s" in w
                     else "the set-up counted in the engine's time")
            line += f" (before: {w['process_s']:.2f} s, {w['wall_s']:.2f} s, {setup})"
        rows.append(line + ".")
    return "\n".join(rows)
