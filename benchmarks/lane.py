"""Scenario ``lane``: the per-sample lane's mf kernel per rating, against the plain loop.

The kernel alone, one thread, no engine around it: ``kernels.mf.mf_lane`` called once
on every rating of an ``mf`` preset (seed 0) in stored order, for each rule the lane
runs (SGD; AdaGrad row-wise, as LIBMF's FPSG, and per coordinate; RMSProp row-wise),
against ``peers.plain_mf_epoch`` (the plain per-rating SGD loop ``bench peers`` calls
the ceiling) on the same ratings. Every contender runs one pass a round, rounds
interleaved, each on its own copy of the initial factors (state from 1 for the
adaptive rules); reported: the median ns per rating over the rounds and its ratio to
the plain loop's median. What it separates: ``bench peers``' one-worker lane against
the plain loop is this kernel ratio times the step around it (sampler, clocks,
policy, record).

``run(quick=False, preset="default") -> dict``; ``format_table(result) -> str``.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from hogkit import workloads
from hogkit.benchmarks.peers import plain_mf_epoch
from hogkit.kernels import rule as _rule
from hogkit.kernels.mf import mf_lane

LR = 0.05
#: the rules of the lane: (name, kind, row-wise)
RULES = (("sgd", _rule.SGD, False), ("adagrad-rowwise", _rule.ADAGRAD, True),
         ("adagrad", _rule.ADAGRAD, False), ("rmsprop-rowwise", _rule.RMSPROP, True))
ROUNDS = 7


def _lane_call(arrays, P, Q, kind, rowwise):
    """``f()``: one mf_lane pass over every rating, on fresh copies of P, Q and state."""
    n = len(arrays.r)
    idx = np.arange(n, dtype=np.int64)
    cfg = np.zeros(_rule.NCFG)
    cfg[_rule.LR], cfg[_rule.EPS], cfg[_rule.ALPHA] = LR, 1e-10, 0.99
    cols = 1 if rowwise else P.shape[1]

    def state():
        if kind == _rule.SGD:
            return (P[:0].copy(), Q[:0].copy())
        return (np.ones((P.shape[0], cols), P.dtype), np.ones((Q.shape[0], cols), Q.dtype))

    def f():
        p, q, s = P.copy(), Q.copy(), state()
        t = time.perf_counter()
        mf_lane(arrays, (p, q), idx, n, kind, cfg, s, True)
        return time.perf_counter() - t
    return f


def run(quick=False, preset="default") -> dict:
    wl = workloads.get("mf", preset="hot" if quick else preset)
    params, data = wl.build(0)
    P, Q = params["P"], params["Q"]
    arrays = wl.compiled(params, data).arrays
    u, i, r = data["u"], data["i"], data["r"]
    n = len(r)

    def plain():
        p, q = P.copy(), Q.copy()
        t = time.perf_counter()
        plain_mf_epoch(p, q, u, i, r, LR)
        return time.perf_counter() - t
    calls = {"plain": plain}
    calls.update({name: _lane_call(arrays, P, Q, kind, rw) for name, kind, rw in RULES})
    for f in calls.values():                      # compile and warm
        f()
    times = {k: [] for k in calls}
    for _ in range(2 if quick else ROUNDS):
        for k, f in calls.items():
            times[k].append(f() / n * 1e9)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"scenario": "lane", "quick": quick, "preset": wl.preset, "n_ratings": n,
            "rank": wl.rank, "ns_per_rating": med, "rounds": times,
            "ratios": {f"{k}_over_plain_time": med[k] / med["plain"] for k in med
                       if k != "plain"}}


def format_table(result) -> str:
    med = result["ns_per_rating"]
    lines = [f"mf_lane, one pass over {result['n_ratings']:,} ratings ({result['preset']} "
             f"preset, rank {result['rank']}), one thread, median of "
             f"{len(result['rounds']['plain'])} rounds:",
             f"  {'kernel':<28}{'ns/rating':>10}{'x plain':>9}"]
    for k, v in med.items():
        label = "plain numba SGD loop" if k == "plain" else f"mf_lane {k}"
        lines.append(f"  {label:<28}{v:>10.2f}{v / med['plain']:>9.2f}")
    return "\n".join(lines)


_LABELS = {"plain": "plain numba SGD loop", "sgd": "`mf_lane` SGD",
           "adagrad-rowwise": "`mf_lane` AdaGrad row-wise (mf's default rule)",
           "adagrad": "`mf_lane` AdaGrad per coordinate",
           "rmsprop-rowwise": "`mf_lane` RMSProp row-wise"}


def format_markdown(result) -> str:
    """The table RESULTS.md shows (a test checks it is this rendering of the JSON)."""
    med = result["ns_per_rating"]
    out = ["| kernel | ns/rating | x plain loop's time |", "|---|---|---|"]
    out += [f"| {_LABELS.get(k, k)} | {v:.2f} | {v / med['plain']:.2f} |"
            for k, v in med.items()]
    return "\n".join(out)
