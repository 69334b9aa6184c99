"""Session 54's A/B of logreg's one-pass gap rules (benchmarks/RESULTS.md, "The gap in
the update pass, live: slower"): live 2-worker logreg runs of SGD, adaptive DC-ASGD
and Gap-Aware, each gap rule twice a round, once on the one-pass loops and once on the
two passes (``HOGKIT_SCRATCH_TWO_PASS=1``, which only the patched ``encode_rule``
reads: it then gives every worker an empty start-value scratch), the order rotating; a
cache line's hand-over time probed around every run, as ``hogkit bench rules --only
repeat`` does::

    git apply benchmarks/scratch/session54_one_pass.patch
    python benchmarks/scratch/session54_ab.py OUT.json 8
    git checkout kernels hogkit tests docs

Same compiled kernels on both sides (the scratch's size picks the path at run time), so
an A/B in one invocation. Not part of the package.
"""

import json
import os
import statistics
import sys

if __name__ == "__main__":
    from hogkit import workloads
    from hogkit.benchmarks import rules
    from hogkit.doctor import line_handover_ns
    from hogkit.engine.runtime import train

    wl = workloads.get("logreg")
    made = rules._rules(wl.default_lr)
    runs = {"sgd": (made["sgd"], False),
            "dc_adaptive": (made["dc_adaptive"], False),
            "dc_adaptive_2pass": (made["dc_adaptive"], True),
            "gap_aware": (made["gap_aware"], False),
            "gap_aware_2pass": (made["gap_aware"], True)}
    names = list(runs)
    out = []
    for k in range(int(sys.argv[2])):
        order = names[k % len(names):] + names[:k % len(names)]
        got = {"order": order}
        for name in order:
            rule, two = runs[name]
            os.environ["HOGKIT_SCRATCH_TWO_PASS"] = "1" if two else "0"
            before = line_handover_ns()
            run = train(wl, workers=rules.WORKERS, seconds=rules.SECONDS, rule=rule,
                        lane="batch", eval_every=None, progress=False, keep_params=False)
            got[name] = {"samples_per_s": run.extra["samples"] / run.wall_s,
                         "gap_mean": rules._gap_mean(run),
                         "handover_ns": [before, line_handover_ns()]}
        out.append(got)
        print(k, {n: round(got[n]["samples_per_s"] / 1e6, 2) for n in names}, flush=True)
    rep = {"workload": "logreg", "workers": rules.WORKERS, "seconds": rules.SECONDS,
           "rounds": out}
    rep["by_placement"] = rules.by_placement(rep)
    rep["over_sgd_each_round"] = {
        n: [g[n]["samples_per_s"] / g["sgd"]["samples_per_s"] for g in out]
        for n in names if n != "sgd"}
    rep["over_sgd"] = {n: statistics.median(v) for n, v in rep["over_sgd_each_round"].items()}
    with open(sys.argv[1], "w") as f:
        json.dump(rep, f, default=float)
    print(json.dumps(rep["by_placement"], default=float, indent=1))
    print(json.dumps(rep["over_sgd"], indent=1))
