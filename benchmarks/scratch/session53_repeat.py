"""Session 53's scratch runs (benchmarks/RESULTS.md, "What the gap pass costs live"): the
repeat part of ``hogkit bench rules`` on five rules, at main's kernels or with one of
this folder's patches applied to ``kernels/delayed.py`` (then reverted)::

    git apply benchmarks/scratch/session53_no_gap_read.patch
    python benchmarks/scratch/session53_repeat.py OUT.json 8
    git checkout kernels/delayed.py

Not part of the package; the patches change what the rules compute and are never kept.
"""

import json
import sys

if __name__ == "__main__":
    from hogkit.benchmarks import rules
    from hogkit.kernels import delayed

    print("kernels:", delayed.__file__)      # the tree the (patched) kernels come from
    rep = rules.repeat(rules=("sgd", "dc", "momentum", "dc_adaptive", "gap_aware"),
                       rounds=int(sys.argv[2]))
    with open(sys.argv[1], "w") as f:
        json.dump(rep, f, default=float)
    print(rules.format_repeat({"repeat": rep}))
