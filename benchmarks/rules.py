"""Scenario ``rules``: each staleness rule's live samples/s against plain SGD.

``train`` with 2 workers (Async, the minibatch lane, the workload's default batch,
record on) on ``mf`` (default preset) and ``logreg``, for SGD and the rules the seeds
are about: staleness-aware, DC-ASGD (constant and adaptive) and Gap-Aware. Each round
runs every rule once for ``SECONDS``, the order rotating by one each round, so the
machine's drift falls on every rule; the figure is the median over rounds of
samples/s, and each rule's ratio is the median of its per-round ratio to SGD in the
same round (issue 26 asks >= 0.7 for Gap-Aware and adaptive DC-ASGD). Plain SGD takes
the workload's fused kernel where it has one; every other rule the general path (the
gradient into buffers, then the rule's row kernel), so the ratio is what choosing the
rule costs a user. The lr is each workload's default: speed does not depend on it.
"""

from __future__ import annotations

import statistics

#: seconds per rule and round, rounds, workers
SECONDS, ROUNDS, WORKERS = 2.0, 3, 2
WORKLOADS = ("mf", "logreg")


def _rules(lr):
    from hogkit.rules.core import SGD, DelayCompensated, GapAware, StalenessAware
    return {"sgd": SGD(lr), "staleness_aware": StalenessAware(lr),
            "dc": DelayCompensated(lr), "dc_adaptive": DelayCompensated(lr, adaptive=True),
            "gap_aware": GapAware(lr)}


def _one(name, seconds, rounds, workers, only=None):
    from hogkit import workloads
    from hogkit.engine.runtime import train
    wl = workloads.get(name)
    rules = {k: v for k, v in _rules(wl.default_lr).items() if only is None or k in only}
    names = list(rules)
    out = []
    for k in range(rounds):
        order = names[k % len(names):] + names[:k % len(names)]
        got = {"order": order}
        for rule in order:
            run = train(wl, workers=workers, seconds=seconds, rule=rules[rule],
                        lane="batch", eval_every=None, progress=False, keep_params=False)
            got[rule] = run.extra["samples"] / run.wall_s
        out.append(got)
    med = {r: statistics.median(g[r] for g in out) for r in names}
    ratio = {r: statistics.median(g[r] / g["sgd"] for g in out) for r in names if r != "sgd"}
    return {"workload": name, "workers": workers, "seconds": seconds, "lr": wl.default_lr,
            "batch": wl.default_batch, "rounds": out, "samples_per_s": med,
            "over_sgd": ratio}


def run(quick=False) -> dict:
    """Every rule on every workload; ``quick``: SGD and Gap-Aware on logreg, one round
    of 0.5 s (a smoke run: each rule compiles its own core on a cold cache)."""
    seconds, rounds = (0.5, 1) if quick else (SECONDS, ROUNDS)
    names = WORKLOADS[-1:] if quick else WORKLOADS
    only = ("sgd", "gap_aware") if quick else None
    result = {"scenario": "rules", "quick": quick, "by_workload": {}, "ratios": {}}
    for name in names:
        r = _one(name, seconds, rounds, WORKERS, only)
        result["by_workload"][name] = r
        for rule, v in r["over_sgd"].items():
            result["ratios"][f"{name}_{rule}_over_sgd"] = v
    return result


def format_table(result) -> str:
    lines = []
    for name, r in result["by_workload"].items():
        lines.append(f"{name}: {r['workers']} workers, batch {r['batch']}, "
                     f"{len(r['rounds'])} round(s) of {r['seconds']:g} s per rule")
        for rule, v in r["samples_per_s"].items():
            ratio = r["over_sgd"].get(rule)
            lines.append(f"  {rule:16s} {v / 1e6:8.2f} M samples/s"
                         + (f"   {ratio:.2f}x SGD" if ratio is not None else ""))
    return "\n".join(lines)


def format_markdown(result, before=None) -> str:
    """The table RESULTS.md shows (a test checks it is this rendering of the JSON);
    with ``before`` (the scenario's JSON at an earlier commit) its ratio beside each."""
    names = list(result["by_workload"])
    cols = [f"`{n}` M samples/s | `{n}` / SGD" + (" | before" if before else "")
            for n in names]
    rows = ["| rule | " + " | ".join(cols) + " |",
            "|---|" + ("---|---|---|" if before else "---|---|") * len(names)]
    for rule in result["by_workload"][names[0]]["samples_per_s"]:
        cells = []
        for n in names:
            r = result["by_workload"][n]
            ratio = r["over_sgd"].get(rule)
            cell = (f"{r['samples_per_s'][rule] / 1e6:.2f} | "
                    + (f"{ratio:.2f}" if ratio is not None else "1"))
            if before:
                then = before["by_workload"][n]["over_sgd"].get(rule)
                cell += " | " + (f"{then:.2f}" if then is not None else "1")
            cells.append(cell)
        rows.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
