"""Scenario ``lane``: the per-sample lane's mf kernel per rating, against the plain loop.

The kernel alone, one thread, no engine around it: ``kernels.mf``'s lane kernel called once
on every rating of an ``mf`` preset (seed 0) in stored order, for each rule the lane
runs (SGD; AdaGrad row-wise, as LIBMF's FPSG, and per coordinate; RMSProp row-wise),
against ``peers.plain_mf_epoch`` (the plain per-rating SGD loop ``bench peers`` calls
the ceiling) on the same ratings. Every contender runs one pass a round, rounds
interleaved, each on its own copy of the initial factors (state from 1 for the
adaptive rules); reported: the median ns per rating over the rounds and its ratio to
the plain loop's median. What it separates: ``bench peers``' one-worker lane against
the plain loop is this kernel ratio times the step around it (sampler, clocks,
policy, record). Both presets: ``default`` (1.3 MB of factors, inside one core's L2)
and ``large`` (102 MB, outside it: there the lane prefetches rows ahead, and SGD and
row-wise AdaGrad are also timed with the prefetch off, and on the default preset with
it on). Every array a kernel writes
starts on a 64-byte line, as in the engine's shared memory.

``run(quick=False, presets=None) -> dict``; ``format_table``, ``format_markdown``.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from hogkit import workloads
from hogkit.procfs import cache_bytes
from hogkit.benchmarks.peers import plain_mf_epoch
from hogkit.kernels.adaptive import AdaGradCfg, RMSPropCfg
from hogkit.kernels.mf import mf_lane_adagrad, mf_lane_rmsprop, mf_lane_sgd
from hogkit.kernels.sgd import SGDCfg
from hogkit.workloads.mf import PREFETCH_AHEAD

LR = 0.05
#: the rules of the lane: (name, lane kernel, its configuration, row-wise)
RULES = (("sgd", mf_lane_sgd, SGDCfg(LR), False),
         ("adagrad-rowwise", mf_lane_adagrad, AdaGradCfg(LR, 1e-10, False), True),
         ("adagrad", mf_lane_adagrad, AdaGradCfg(LR, 1e-10, False), False),
         ("rmsprop-rowwise", mf_lane_rmsprop, RMSPropCfg(LR, 0.99, 1e-10, False), True))
ROUNDS = 7
#: the rules also timed with the prefetch off where the preset turns it on, and on
#: where it does not
PREFETCH_AB = ("sgd", "adagrad-rowwise")


def _aligned_copy(a):
    """A copy of ``a`` starting on a 64-byte line, as the engine's shared memory places
    every array: a private numpy copy starts anywhere in a line, and a row that then
    straddles one more line than it must would time the layout, not the kernel."""
    buf = np.empty(a.nbytes + 64, np.uint8)
    off = (-buf.ctypes.data) % 64
    out = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _lane_call(arrays, P, Q, lane, cfg, rowwise, prefetch):
    """``f()``: one pass of the lane kernel ``lane`` under the rule ``cfg`` over every
    rating, on fresh copies of P, Q and state, with the prefetch distance ``prefetch``."""
    n = len(arrays.r)
    idx = np.arange(n, dtype=np.int64)
    arrays = arrays._replace(prefetch=prefetch)
    cols = 1 if rowwise else P.shape[1]

    def state():
        if isinstance(cfg, SGDCfg):
            return (P[:0].copy(), Q[:0].copy())
        return (_aligned_copy(np.ones((P.shape[0], cols), P.dtype)),
                _aligned_copy(np.ones((Q.shape[0], cols), Q.dtype)))

    def f():
        p, q, s = _aligned_copy(P), _aligned_copy(Q), state()
        t = time.perf_counter()
        lane(arrays, (p, q), idx, n, cfg, s, True)
        return time.perf_counter() - t
    return f


def _one(preset, rounds):
    wl = workloads.get("mf", preset=preset)
    params, data = wl.build(0)
    P, Q = params["P"], params["Q"]
    arrays = wl.compiled(params, data).arrays
    u, i, r = data["u"], data["i"], data["r"]
    n = len(r)

    def plain():
        p, q = _aligned_copy(P), _aligned_copy(Q)
        t = time.perf_counter()
        plain_mf_epoch(p, q, u, i, r, LR)
        return time.perf_counter() - t
    calls = {"plain": plain}
    ahead = arrays.prefetch
    for name, lane, cfg, rw in RULES:
        calls[name] = _lane_call(arrays, P, Q, lane, cfg, rw, ahead)
        if name in PREFETCH_AB:                  # what the prefetch does, same run
            if ahead > 0:
                calls[f"{name}, no prefetch"] = _lane_call(arrays, P, Q, lane, cfg, rw, 0)
            else:
                calls[f"{name}, prefetch {PREFETCH_AHEAD}"] = _lane_call(
                    arrays, P, Q, lane, cfg, rw, PREFETCH_AHEAD)
    for f in calls.values():                      # compile and warm
        f()
    times = {k: [] for k in calls}
    for _ in range(rounds):
        for k, f in calls.items():
            times[k].append(f() / n * 1e9)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"preset": wl.preset, "n_ratings": n, "rank": wl.rank, "prefetch": ahead,
            "factor_bytes": int(P.nbytes + Q.nbytes), "ns_per_rating": med,
            "rounds": times,
            "ratios": {f"{k}_over_plain_time": med[k] / med["plain"] for k in med
                       if k != "plain"}}


def run(quick=False, presets=None) -> dict:
    presets = presets or (("hot",) if quick else ("default", "large"))
    rounds = 2 if quick else ROUNDS
    per = {p: _one(p, rounds) for p in presets}
    return {"scenario": "lane", "quick": quick, "cache_l2_bytes": cache_bytes(2),
            "presets": per,
            "ratios": {f"{p}_{k}": v for p, m in per.items() for k, v in m["ratios"].items()}}


def format_table(result) -> str:
    lines = []
    for p, m in result["presets"].items():
        med = m["ns_per_rating"]
        lines += [f"mf_lane, one pass over {m['n_ratings']:,} ratings ({p} preset, rank "
                  f"{m['rank']}, {m['factor_bytes'] / 2**20:.1f} MiB of factors, prefetch "
                  f"{m['prefetch']}), one thread, median of {len(m['rounds']['plain'])} "
                  f"rounds:", f"  {'kernel':<34}{'ns/rating':>10}{'x plain':>9}"]
        for k, v in med.items():
            label = "plain numba SGD loop" if k == "plain" else f"mf_lane {k}"
            lines.append(f"  {label:<34}{v:>10.2f}{v / med['plain']:>9.2f}")
    return "\n".join(lines)


_LABELS = {"plain": "plain numba SGD loop", "sgd": "`mf_lane` SGD",
           "adagrad-rowwise": "`mf_lane` AdaGrad row-wise (mf's default rule)",
           "adagrad": "`mf_lane` AdaGrad per coordinate",
           "rmsprop-rowwise": "`mf_lane` RMSProp row-wise"}


def _label(k):
    base, _, rest = k.partition(", ")
    return _LABELS.get(base, base) + (f", {rest}" if rest else "")


def format_markdown(result) -> str:
    """The table RESULTS.md shows (a test checks it is this rendering of the JSON)."""
    presets = list(result["presets"])
    head = " | ".join(f"{p}: ns/rating | x plain" for p in presets)
    out = [f"| kernel | {head} |", "|---|" + "---|---|" * len(presets)]
    keys = []
    for m in result["presets"].values():
        keys += [k for k in m["ns_per_rating"] if k not in keys]
    for k in keys:
        cells = []
        for m in result["presets"].values():
            med = m["ns_per_rating"]
            cells.append(f"{med[k]:.2f} | {med[k] / med['plain']:.2f}" if k in med
                         else "— | —")
        out.append(f"| {_label(k)} | {' | '.join(cells)} |")
    return "\n".join(out)
