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

``--only target``: time to a loss target at bracketed lrs, the replicas also through
``replication="worker:K"``; ``--only replication``: ``replication=`` shared, worker
and auto on five workloads (:func:`replication`).

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
import hogkit

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
    run = train(wl, workers=workers,
                outputs=hogkit.Outputs(eval_every=None, progress=False, keep_params=False),
                seconds=seconds, **opts)
    return {"samples_per_s": run.extra["samples"] / run.wall_s,
            "updates_per_s": run.updates_per_s, "final_loss": run.final_loss}


#: time to a loss target: (name, workers, knobs, lrs), each at three seeds; knobs:
#: a policy spelling and/or a replication for train()
TARGET_RUNS = (("sample", 1, {}, (2.0, 4.0, 8.0, 16.0)),
               ("sample", 2, {}, (2.0, 4.0, 8.0, 16.0)),
               ("sum16", 2, {"policy": "local:16:sum"}, (1.0, 2.0, 4.0, 8.0, 16.0)),
               ("sum256", 2, {"policy": "local:256:sum"}, (1.0, 2.0, 4.0, 8.0)),
               ("worker4", 2, {"replication": "worker:4"}, (2.0, 4.0, 8.0, 16.0)),
               ("worker16", 2, {"replication": "worker:16"}, (1.0, 2.0, 4.0, 8.0, 16.0)))
TARGET_LOSS, TARGET_SECONDS, TARGET_SEEDS = 0.09, 4.0, (0, 1, 2)


def time_to_target(quick=False, runs=None, seconds=None) -> dict:
    """Seconds of training to the loss target (the first evaluation at or below it, the
    parent evaluating every 0.1 s), each contender at each of its lrs and three seeds;
    a contender's figure is its best lr's median over the seeds (inf: not reached in
    ``seconds``, by default ``TARGET_SECONDS``), with the seeds' range; the lrs bracket
    each side's best. ``runs``: contenders as in :data:`TARGET_RUNS` (the default)."""
    from hogkit import workloads
    from hogkit.engine.runtime import train
    from hogkit.parse import parse_policy
    from hogkit.rules.core import SGD
    wl = workloads.get("logreg")
    runs = TARGET_RUNS if runs is None else runs
    seconds, seeds = ((0.5, (0,)) if quick else (seconds or TARGET_SECONDS, TARGET_SEEDS))
    out = {"target_loss": TARGET_LOSS, "seconds": seconds, "seeds": list(seeds),
           "contenders": {}}
    for name, workers, knobs, lrs in runs[:2] if quick else runs:
        key = f"{name}_{workers}w"
        policy = knobs.get("policy")
        by_lr = {}
        for lr in lrs[1:2] if quick else lrs:
            times, finals = [], []
            for seed in seeds:
                kw = {"policy": parse_policy(policy)} if policy else {}
                kw.update({k: v for k, v in knobs.items() if k != "policy"})
                r = train(wl, workers=workers,
                          outputs=hogkit.Outputs(eval_every=0.1, progress=False, keep_params=False),
                          seconds=seconds, rule=SGD(lr), seed=seed, **kw)
                hit = [c["t"] for c in r.loss_curve if c["loss"] <= TARGET_LOSS]
                times.append(min(hit) if hit else float("inf"))
                finals.append(r.final_loss)
            by_lr[str(lr)] = {"seconds": times, "median_s": statistics.median(times),
                              "final_loss": finals}
        best = min(by_lr, key=lambda k: by_lr[k]["median_s"])
        out["contenders"][key] = {"workers": workers, "policy": policy or "async",
                                  **({"replication": knobs["replication"]}
                                     if "replication" in knobs else {}),
                                  "by_lr": by_lr, "best_lr": float(best),
                                  "median_s": by_lr[best]["median_s"],
                                  "range_s": [min(by_lr[best]["seconds"]),
                                              max(by_lr[best]["seconds"])]}
    return out


#: replication=: (label, workload, workload options) x (workers, replication)
REPLICATION_WORKLOADS = (("logreg", "logreg", {}), ("logreg_zipf0", "logreg", {"zipf": 0.0}),
                         ("mf_hot_sweep", "mf", {"preset": "hot", "order": "sweep"}),
                         ("mf_hot_blocks", "mf", {"preset": "hot"}), ("mlp", "mlp", {}))
REPLICATION_CASES = ((1, "shared"), (2, "shared"), (2, "worker"), (2, "auto"))


def replication(quick=False, names=None) -> dict:
    """``replication=`` on each workload of :data:`REPLICATION_WORKLOADS` (or of
    ``names``, a part of it): one worker
    on the shared copy, then two on the shared copy, on replicas (the default merge
    period) and on what "auto" picks, ``seconds`` each at the workload's default lr
    and lane, three seeds (the order of the cases rotating with the seed); medians of
    samples/s and of the final loss, with the seeds' range."""
    from hogkit.engine.runtime import train
    seconds, seeds = (0.3, (0,)) if quick else (2.0, (0, 1, 2))
    names = REPLICATION_WORKLOADS if names is None else names
    names = names[:1] if quick else names
    raw = {(n, w, r): [] for n, _, _ in names for w, r in REPLICATION_CASES}
    chosen = {}
    for seed in seeds:
        cases = REPLICATION_CASES[seed % 4:] + REPLICATION_CASES[:seed % 4]
        for label, wl, opts in names:
            for w, rep in cases:
                run = train(hogkit.workload(wl, **opts), workers=w,
                            engine=hogkit.Engine(replication=rep),
                            outputs=hogkit.Outputs(eval_every=None, progress=False,
                                                   keep_params=False),
                            seconds=seconds, seed=seed)
                raw[(label, w, rep)].append({
                    "samples_per_s": run.extra["samples"] / run.wall_s,
                    "samples": run.extra["samples"], "final_loss": run.final_loss,
                    "gap_mean": run.staleness["update_gap"]["mean"]})
                if rep == "auto":
                    chosen[label] = run.config.get("replication")
    out = {"seconds": seconds, "seeds": list(seeds), "workloads": {}}
    for label, wl, opts in names:
        rows = {}
        for w, rep in REPLICATION_CASES:
            got = raw[(label, w, rep)]
            rows[f"{w}w_{rep}"] = {
                "samples_per_s": statistics.median(g["samples_per_s"] for g in got),
                "final_loss": statistics.median(g["final_loss"] for g in got),
                "loss_range": [min(g["final_loss"] for g in got),
                               max(g["final_loss"] for g in got)],
                "all": got}
        base = rows["1w_shared"]["samples_per_s"]
        for r in rows.values():
            r["speedup"] = r["samples_per_s"] / base
        out["workloads"][label] = {"workload": wl, "options": opts, "auto": chosen.get(label),
                                   "cases": rows}
    return out


def format_replication_markdown(result) -> str:
    """The RESULTS.md table of :func:`replication`: per workload and case, M samples/s
    (x one worker on the shared copy) and the final loss, median [range]; what auto
    chose and the overlap it measured."""
    r = result["replication"]
    rows = ["| workload | " + " | ".join(f"{w} w {rep}" for w, rep in REPLICATION_CASES)
            + " | auto chose (overlap) |", "|---|" + "---|" * (len(REPLICATION_CASES) + 1)]
    for label, v in r["workloads"].items():
        cells = []
        for w, rep in REPLICATION_CASES:
            c = v["cases"][f"{w}w_{rep}"]
            cells.append(f"{c['samples_per_s'] / 1e6:.2f} ({c['speedup']:.2f}x), "
                         f"{c['final_loss']:.4f} [{c['loss_range'][0]:.4f}-"
                         f"{c['loss_range'][1]:.4f}]")
        a = v["auto"] or {}
        ov = a.get("write_overlap")
        cells.append(f"{a.get('mode', '?')} ({'-' if ov is None else f'{ov:.3f}'})")
        rows.append(f"| `{label}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def run(quick=False, workers=None, rounds=None, seconds=None, counts=None,
        variants=None, only=None) -> dict:
    """Every variant (or ``variants``) at 1, 2, 4, ... ``workers`` (default: the cores,
    at most 2; or exactly ``counts``); ``quick``: 1 and 2 workers, one round of 0.3 s,
    two variants. ``only="target"``: :func:`time_to_target` alone."""
    if only == "target":
        r = time_to_target(quick)
        return {"scenario": "dense", "target": r, "ratios": {
            f"{k}_s": v["median_s"] for k, v in r["contenders"].items()}}
    if only == "replication":
        r = replication(quick)
        return {"scenario": "dense", "replication": r, "ratios": {
            f"{n}_{c}_speedup": x["speedup"] for n, v in r["workloads"].items()
            for c, x in v["cases"].items() if c != "1w_shared"}}
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
    if "replication" in result:
        return format_replication_markdown(result)
    if "target" in result:
        t = result["target"]
        lines = [f"time to loss {t['target_loss']} (logreg), best lr per contender, "
                 f"median over seeds {t['seeds']} [range]"]
        for k, v in t["contenders"].items():
            lines.append(f"{k:<12} lr {v['best_lr']:<5g} {v['median_s']:.2f} s "
                         f"[{v['range_s'][0]:.2f}-{v['range_s'][1]:.2f}]  " + "  ".join(
                             f"lr {lr}: {x['median_s']:.2f}" for lr, x in v["by_lr"].items()))
        return "\n".join(lines)
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
    final loss at each worker count (median, and its range over the rounds)."""
    counts = [str(c) for c in result["workers"]]
    rows = ["| variant | " + " | ".join(f"{c} w: M samples/s (x), loss [range]"
                                        for c in counts) + " |",
            "|---|" + "---|" * len(counts)]

    def cell(r):
        losses = [a["final_loss"] for a in r["all"]]
        return (f"{r['samples_per_s'] / 1e6:.2f} ({r['speedup']:.2f}x), "
                f"{r['final_loss']:.4f} [{min(losses):.4f}-{max(losses):.4f}]")
    for name, v in result["variants"].items():
        cells = [cell(v["by_workers"][c]) for c in counts]
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def format_target_markdown(result) -> str:
    """The RESULTS.md table of :func:`time_to_target`: each contender's seconds to the
    target at every lr (median over the seeds), its best lr, and the seeds' range."""
    t = result["target"]
    rows = ["| contender | seconds to loss " + f"{t['target_loss']} at each lr (median) | "
            "best lr | median [range] |", "|---|---|---|---|"]
    for k, v in t["contenders"].items():
        lrs = ", ".join(f"{float(lr):g}: {x['median_s']:.2f}" for lr, x in v["by_lr"].items())
        rows.append(f"| `{k}` | {lrs} | {v['best_lr']:g} | {v['median_s']:.2f} "
                    f"[{v['range_s'][0]:.2f}-{v['range_s'][1]:.2f}] |")
    return "\n".join(rows)
