"""Scenario ``explore``: how fast the race explorer checks a user's update function.

The racy example of docs/race-testing.md: two workers each add a delta to every
element of one row of ``W`` (``W[r, j] += g[j]``, a numba kernel run through its
Python source on instrumented arrays), for rows of 2, 3 and 4 elements:

- ``dpor``: every distinct outcome (``explore(strategy="dpor")``): schedules run,
  distinct outcomes, seconds, schedules/s;
- ``random``: 200 sampled schedules (``strategy="random"``), schedules/s;
- the baseline, measured in the same run: the same two calls run one after the other
  on plain numpy arrays (no instrumentation, no threads), and the ratio of one
  explored schedule's time to it: what instrumenting every element costs;
- ``stress``: the same kernel compiled, 2 spawned processes on shared memory, 200
  rounds of 200 row updates of 64 elements each: rounds/s and the share of rounds
  that lost an update (the real machine's rate, against exploration's "can").
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit


@njit
def add_row(W, r, g):
    for j in range(W.shape[1]):
        W[r, j] += g[j]


@njit
def add_row_times(W, r, g, times):
    for _ in range(times):
        for j in range(W.shape[1]):
            W[r, j] += g[j]


def _plain_s(width, repeat=2000):
    py = add_row.py_func
    g = np.ones(width)
    t0 = time.perf_counter()
    for _ in range(repeat):
        W = np.zeros((2, width))
        py(W, 0, g)
        py(W, 0, g)
    return (time.perf_counter() - t0) / repeat


def _explore(width, strategy, max_schedules):
    from hogkit.explore import explore
    g = np.ones(width)
    t0 = time.perf_counter()
    res = explore(add_row, {"W": np.zeros((2, width))}, [{"r": 0, "g": g}, {"r": 0, "g": g}],
                  lambda W: bool((W[0] == 2).all()), strategy=strategy,
                  max_schedules=max_schedules)
    s = time.perf_counter() - t0
    return {"schedules": res.schedules_tried,
            "outcomes": res.outcomes, "complete": res.complete, "holds": res.holds,
            "seconds": s, "schedules_per_s": res.schedules_tried / s}


def _stress(rounds):
    from hogkit.stress import stress
    g = np.ones(64)
    calls = [{"r": 0, "g": g, "times": 200}, {"r": 0, "g": g, "times": 200}]
    t0 = time.perf_counter()
    res = stress(add_row_times, {"W": np.zeros((2, 64))}, calls, rounds=rounds)
    s = time.perf_counter() - t0
    return {"rounds": res.rounds, "differs": res.differs, "rate": res.rate,
            "outcomes": len(res.outcomes), "seconds": s, "rounds_per_s": rounds / s}


def run(quick=False) -> dict:
    """Every width with DPOR and random sampling, and the stress run (``quick``: width
    2 only, 20 sampled schedules, 20 stress rounds)."""
    widths = (2,) if quick else (2, 3, 4)
    sampled = 20 if quick else 200
    out = {"scenario": "explore", "quick": quick, "by_width": {}, "ratios": {}}
    for w in widths:
        plain = _plain_s(w)
        d = _explore(w, "dpor", 100_000)
        r = _explore(w, "random", sampled)
        out["by_width"][str(w)] = {"plain_two_calls_s": plain, "dpor": d, "random": r}
        out["ratios"][f"w{w}_dpor_schedule_over_plain"] = (1 / d["schedules_per_s"]) / plain
        out["ratios"][f"w{w}_random_schedule_over_plain"] = (1 / r["schedules_per_s"]) / plain
    out["stress"] = _stress(20 if quick else 200)
    out["ratios"]["stress_lost_rate"] = out["stress"]["rate"]
    return out


def format_table(result) -> str:
    lines = [f"{'row width':>9} {'DPOR schedules':>15} {'outcomes':>9} {'DPOR sch/s':>11} "
             f"{'random sch/s':>13} {'x plain':>8}"]
    for w, r in result["by_width"].items():
        d, s = r["dpor"], r["random"]
        lines.append(f"{w:>9} {d['schedules']:>15,} {d['outcomes']:>9,} "
                     f"{d['schedules_per_s']:>11,.0f} {s['schedules_per_s']:>13,.0f} "
                     f"{result['ratios'][f'w{w}_dpor_schedule_over_plain']:>8,.0f}")
    st = result["stress"]
    lines.append(f"stress: {st['rounds']} rounds in {st['seconds']:.1f} s "
                 f"({st['rounds_per_s']:,.0f}/s); {st['differs']} lost an update "
                 f"({st['rate']:.0%}), {st['outcomes']} distinct outcomes")
    return "\n".join(lines)


def format_markdown(result) -> str:
    """The table RESULTS.md shows (a test checks it is this rendering of the JSON)."""
    rows = ["| row width | DPOR schedules | distinct outcomes | DPOR schedules/s "
            "| random schedules/s | one schedule / plain two calls |",
            "|---|---|---|---|---|---|"]
    for w, r in result["by_width"].items():
        d, s = r["dpor"], r["random"]
        rows.append(f"| {w} | {d['schedules']:,} | {d['outcomes']:,} | "
                    f"{d['schedules_per_s']:,.0f} | {s['schedules_per_s']:,.0f} | "
                    f"{result['ratios'][f'w{w}_dpor_schedule_over_plain']:,.0f}x |")
    return "\n".join(rows)


def main(argv=None):
    import argparse
    import json
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    result = run(quick=a.quick)
    print(format_table(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
