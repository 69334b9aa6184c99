"""Scenario ``dense``: why a dense-ish model slows down with more workers (issue 26).

``logreg`` (20,000 float32 weights, 80 kB: inside one core's L2) with 1 to N workers,
Hogwild! (async, plain SGD, the workload's default lr and batch), in variants that
each remove one suspect:

- ``sample`` (the default: per-sample lane, Zipf 1.1 features: a handful of features
  sit in most samples, so every worker writes their weights every few samples);
- ``zipf0``: the same with uniform features (no hot weight; every line of the small
  vector is still written by every worker within microseconds);
- ``batch``: the minibatch lane (one write per touched weight per 64 samples);
- ``local16`` and ``local256``: per-worker replicas averaged into the shared vector
  every 16 or 256 steps (``LocalSGD(h)``: local SGD, ``shared += Δ / W``), so no two
  workers write one line between merges;
- ``sum16`` and ``sum256``: the same replicas, each change added whole
  (``LocalSGD(h, merge="sum")``, ``shared += Δ``: Hogwild!'s full-weight updates,
  written in bulk every h steps; DimmWitted's per-core replication).

A round runs every variant at every worker count for ``seconds``, the order of the
variants rotating by one each round, so the machine's drift falls on all of them; the
figures are medians over rounds of samples/s (each run's samples over its training
time), the speedup is over the same variant's one-worker median, and the final loss
(at a fixed time, on the quiesced weights) says what each variant bought. Where the
machine has more cores (``--workers 16`` on a 16-core machine), the parent sits on a
core of its own, so core contention is ruled out as a cause.
"""

from __future__ import annotations

import os
import statistics

#: name -> (workload options, train options)
VARIANTS = {
    "sample": ({}, {}),
    "zipf0": ({"zipf": 0.0}, {}),
    "batch": ({}, {"lane": "batch"}),
    "local16": ({}, {"policy": "local:16"}),
    "local256": ({}, {"policy": "local:256"}),
    "sum16": ({}, {"policy": "local:16:sum"}),
    "sum256": ({}, {"policy": "local:256:sum"}),
}


def _counts(top):
    return sorted({1, top} | {2 ** k for k in range(1, 8) if 2 ** k < top})


def _one(wl, workers, seconds, opts):
    from hogkit.engine.runtime import train
    from hogkit.parse import parse_policy
    opts = dict(opts)
    if "policy" in opts:
        opts["policy"] = parse_policy(opts["policy"])
    run = train(wl, workers=workers, seconds=seconds, eval_every=None, progress=False,
                keep_params=False, **opts)
    return {"samples_per_s": run.extra["samples"] / run.wall_s,
            "updates_per_s": run.updates_per_s, "final_loss": run.final_loss}


def run(quick=False, workers=None, rounds=None, seconds=None, counts=None,
        variants=None) -> dict:
    """Every variant (or ``variants``) at 1, 2, 4, ... ``workers`` (default: the cores,
    at most 2; or exactly ``counts``); ``quick``: 1 and 2 workers, one round of 0.3 s,
    two variants."""
    from hogkit import workloads
    top = workers or min(os.cpu_count() or 1, 2)
    counts = tuple(counts) if counts else (1, 2) if quick else _counts(top)
    rounds = rounds or (1 if quick else 3)
    seconds = seconds or (0.3 if quick else 2.0)
    names = tuple(variants) if variants else ("sample", "local256") if quick else tuple(VARIANTS)
    wls = {n: workloads.get("logreg", **VARIANTS[n][0]) for n in names}
    raw = {n: {c: [] for c in counts} for n in names}
    for k in range(rounds):
        for n in names[k % len(names):] + names[:k % len(names)]:
            for c in counts:
                raw[n][c].append(_one(wls[n], c, seconds, VARIANTS[n][1]))
    result = {"scenario": "dense", "rounds": rounds, "seconds_per_run": seconds,
              "cpus": os.cpu_count(), "workers": list(counts), "variants": {}}
    for n in names:
        per = {c: {key: statistics.median(r[key] for r in raw[n][c])
                   for key in ("samples_per_s", "updates_per_s", "final_loss")}
               for c in counts}
        for c in counts:
            per[c]["speedup"] = per[c]["samples_per_s"] / per[1]["samples_per_s"]
            per[c]["all"] = raw[n][c]
        result["variants"][n] = {"workload": wls[n].config(), "train": VARIANTS[n][1],
                                 "by_workers": {str(c): per[c] for c in counts}}
    top = counts[-1]
    result["ratios"] = {f"{n}_speedup_{top}": result["variants"][n]["by_workers"][str(top)]
                        ["speedup"] for n in names}
    return result


def format_table(result) -> str:
    lines = [f"dense (logreg): median of {result['rounds']} round(s) x "
             f"{result['seconds_per_run']} s, {result['cpus']} cpus",
             f"{'variant':<10}{'workers':>8}{'M samples/s':>13}{'speedup':>9}{'loss':>9}"]
    for name, v in result["variants"].items():
        for c, r in v["by_workers"].items():
            lines.append(f"{name:<10}{c:>8}{r['samples_per_s'] / 1e6:>13.2f}"
                         f"{r['speedup']:>9.2f}{r['final_loss']:>9.4f}")
    return "\n".join(lines)


def format_markdown(result) -> str:
    """The RESULTS.md table: per variant, M samples/s, speedup over one worker and the
    final loss at each worker count."""
    counts = [str(c) for c in result["workers"]]
    rows = ["| variant | " + " | ".join(f"{c} w: M samples/s (x) loss" for c in counts) + " |",
            "|---|" + "---|" * len(counts)]
    for name, v in result["variants"].items():
        cells = [f"{r['samples_per_s'] / 1e6:.2f} ({r['speedup']:.2f}x) {r['final_loss']:.4f}"
                 for r in (v["by_workers"][c] for c in counts)]
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)
