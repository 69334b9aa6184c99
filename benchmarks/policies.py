"""Scenario ``policies``: consistency policies and batch sizing against a straggler.

1. One of two workers slowed 3× (``Slowdown(3)``: each of its steps takes three times
   its own compute time). For BSP, SSP(1), SSP(3), SSP(10), DSSP(1,10) and Async on
   matrix factorisation: updates/s, each worker's wait fraction (time in
   ``policy.wait`` over time in the loop), clock lag and final loss, for the same
   wall-time budget. Baseline: Async, measured in the same run.
2. LB-BSP: under BSP on the digits MLP with one of two workers at 0.4× speed
   (``Slowdown(2.5)``), a fixed batch (b per worker) against ``AdaptiveBatch(2b)``
   (same global batch, shares ∝ predicted speed) for the same number of iterations,
   hence the same samples and epochs. Figures: mean iteration time (wall / iterations
   per worker), the ratio fixed/adaptive (goal ≥ 1.5), and the loss reached. The
   batch (1024 per worker) is chosen so a gradient (~0.6 ms) outweighs the fixed
   per-step costs (the barrier's wake-up, torch's call overhead): LB-BSP rebalances
   compute, and cannot shorten what does not scale with the batch.
"""

from __future__ import annotations

import statistics

import hogkit
from hogkit.rules.batching import AdaptiveBatch, FixedBatch
from hogkit.engine.delays import Slowdown
from hogkit.policy import BSP, DSSP, SSP, Async
from hogkit.engine.runtime import train

POLICIES = (("bsp", BSP()), ("ssp1", SSP(1)), ("ssp3", SSP(3)), ("ssp10", SSP(10)),
            ("dssp1_10", DSSP(1, 10)), ("async", Async()))


def _policies(seconds, rounds):
    rows = {}
    for name, policy in POLICIES:
        runs = [train("mf", workers=hogkit.Workers(2, stragglers={1: Slowdown(3.0)}),
                      outputs=hogkit.Outputs(eval_every=None, progress=False, keep_params=False),
                      seconds=seconds, policy=policy) for _ in range(rounds)]
        ups = statistics.median(r.updates_per_s for r in runs)
        run = sorted(runs, key=lambda r: r.updates_per_s)[len(runs) // 2]
        s = run.summary()
        rows[name] = {"updates_per_s": ups, "wait_fraction": s["wait_fraction"],
                      "clock_lag_mean": s["staleness"]["clock_lag"]["mean"],
                      "clock_lag_max": s["staleness"]["clock_lag"]["max"],
                      "final_loss": s["final_loss"],
                      "iterations": [w["iterations"] for w in s["per_worker"]],
                      "dssp_grants": s.get("dssp_grants")}
    base = rows["async"]["updates_per_s"]
    for r in rows.values():
        r["of_async"] = r["updates_per_s"] / base
    return rows


def _batching(steps, b, rounds):
    out = {}
    for name, batch in (("fixed", FixedBatch(2 * b)), ("adaptive", AdaptiveBatch(2 * b))):
        times, losses, shares = [], [], []
        for _ in range(rounds):
            run = train("mlp", workers=hogkit.Workers(2, stragglers={1: Slowdown(2.5)}),
                        outputs=hogkit.Outputs(eval_every=None, progress=False, keep_params=False),
                        steps=steps, policy=BSP(), batch=batch)
            times.append(run.wall_s / (steps // 2))
            losses.append(run.final_loss)
            shares.append(run.summary()["samples"])
        out[name] = {"iteration_ms": statistics.median(times) * 1e3,
                     "final_loss": statistics.median(losses), "samples": shares[0]}
    out["speedup"] = out["fixed"]["iteration_ms"] / out["adaptive"]["iteration_ms"]
    return out


def run(quick=False, rounds=None) -> dict:
    rounds = rounds or (1 if quick else 3)
    seconds = 1.5 if quick else 5.0
    steps = 400 if quick else 1000
    pol = _policies(seconds, rounds)
    bat = _batching(steps, 1024, rounds)
    return {"scenario": "policies", "rounds": rounds, "seconds_per_run": seconds,
            "straggler": "worker 1 at 1/3 speed (policies), 0.4x speed (batching)",
            "policies": pol, "batching": bat,
            "ratios": {"adaptive_iteration_speedup": bat["speedup"],
                       **{f"{k}_of_async": v["of_async"] for k, v in pol.items()}}}


def format_table(result) -> str:
    lines = [f"policies: worker 1 slowed 3x, median of {result['rounds']} x "
             f"{result['seconds_per_run']} s (mf)",
             f"{'policy':<10}{'updates/s':>11}{'of async':>9}{'wait w0':>9}{'wait w1':>9}"
             f"{'lag mean':>9}{'lag max':>8}{'loss':>9}"]
    for name, r in result["policies"].items():
        w = r["wait_fraction"]
        lines.append(f"{name:<10}{r['updates_per_s']:>11,.0f}{r['of_async']:>9.2f}"
                     f"{w[0]:>9.3f}{w[1]:>9.3f}{r['clock_lag_mean']:>9.2f}"
                     f"{r['clock_lag_max']:>8}{r['final_loss']:>9.4f}")
    b = result["batching"]
    lines.append("")
    lines.append("LB-BSP: BSP, mlp, worker 1 at 0.4x speed, same iterations and samples")
    for name in ("fixed", "adaptive"):
        lines.append(f"  {name:<9} iteration {b[name]['iteration_ms']:7.2f} ms   "
                     f"loss {b[name]['final_loss']:.4f}   samples {b[name]['samples']}")
    lines.append(f"  adaptive is {b['speedup']:.2f}x faster per iteration (goal >= 1.5)")
    return "\n".join(lines)
