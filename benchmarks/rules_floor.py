"""What a plain compiled loop pays for a rule's per-coordinate state on mf's minibatch
step (issue 26, item 3).

Issue 26 asks adaptive DC-ASGD and Gap-Aware for >= 0.7x SGD's live samples/s, "so a
live run pays at most the extra bytes each rule must move". Those rules read and write
a state table as large as the factors, and the gap rules keep read copies of every row
they read. :file:`rules_floor.cpp` writes the same steps as a C++ programmer would
(``K`` a compile-time constant, restrict pointers, ``-O3 -march=native -ffast-math``,
each variant without and with a software prefetch of the rows ahead, its faster
setting taken per round) on the data of mf's default preset: plain SGD, SGD moving a
state row per factor row (adaptive DC-ASGD's step on a fresh read), the same from read
copies, and hogkit's general shape (copies and gradient rows into buffers, then a pass
per table). What each variant adds to SGD's nanoseconds says what those bytes cost a
loop with almost no overhead of its own, on this host; its ratio to SGD, what they
cost that loop in the issue's terms.

Run: ``python -m benchmarks.rules_floor --json FILE`` (needs ``g++``; ~15 s).
The JSON keeps every round's wall nanoseconds per rating of one thread (every thread
runs the same steps at once) for 1 and 2 threads (two threads: Hogwild! on shared
factors, each thread's state its own, as hogkit's workers), for each prefetch setting;
the medians; and each variant's ratio to SGD in every round and their median (SGD's ns
over the variant's: samples/s, as ``hogkit bench rules`` reports).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile

#: threads, rounds (the runs' order rotating each round), steps of 64 ratings per
#: thread and run
THREADS, ROUNDS, STEPS = (1, 2), 7, 50000
VARIANTS = ("sgd", "state", "state_copies", "general")
FLAGS = ("-O3", "-march=native", "-ffast-math", "-pthread")
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules_floor.cpp")


def _data(folder: str) -> dict:
    """mf's default preset (seed 0), written raw where the program reads it."""
    import numpy as np

    from hogkit.workloads.mf import MatrixFactorization

    wl = MatrixFactorization()
    params, data = wl.build(0)
    arrays = {"P": params["P"], "Q": params["Q"], "u": data["u"], "i": data["i"],
              "r": data["r"]}
    want = {"P": ((5000, 32), np.float32), "Q": ((5000, 32), np.float32),
            "u": ((500_000,), np.int32), "i": ((500_000,), np.int32),
            "r": ((500_000,), np.float32)}
    for name, a in arrays.items():
        shape, dtype = want[name]
        if a.shape != shape or a.dtype != dtype:     # the program's sizes are constants
            raise RuntimeError(f"mf's default preset changed: {name} is {a.dtype} "
                               f"{a.shape}, rules_floor.cpp expects {dtype.__name__} {shape}")
        np.ascontiguousarray(a).tofile(os.path.join(folder, f"{name}.bin"))
    return {"preset": "default", "rank": 32, "n_ratings": 500_000, "batch": 64}


def parse(text: str) -> dict:
    """The program's output: ``{variant: {prefetch distance: [ns, each round]}}``, ns
    being wall nanoseconds per rating of one thread."""
    out = {}
    for line in text.splitlines():
        name, *vals = line.split()
        variant, _, pf = name.partition("/")
        if variant in VARIANTS and pf.isdigit():
            out.setdefault(variant, {})[pf] = [float(v) for v in vals]
    missing = [v for v in VARIANTS if len(out.get(v, {})) != 2]
    counts = {len(x) for d in out.values() for x in d.values()}
    if missing or len(counts) != 1:
        raise RuntimeError(f"rules_floor printed no figures, or rounds of unequal "
                           f"counts, for {missing or sorted(out)}:\n{text}")
    return out


def summarise(rounds: dict) -> dict:
    """Each variant's faster prefetch setting in each round (``best``), the medians of
    those and of each setting's own runs, each variant's ratio to SGD in every round
    (SGD's best over the variant's best: samples/s, as ``hogkit bench rules``
    reports) and the median of those ratios."""
    best = {v: [min(xs) for xs in zip(*by.values())] for v, by in rounds.items()}
    per_round = {v: [s / x for s, x in zip(best["sgd"], best[v])]
                 for v in best if v != "sgd"}
    return {"rounds": rounds, "best": best,
            "ns_per_rating": {v: statistics.median(x) for v, x in best.items()},
            "by_prefetch": {v: {pf: statistics.median(x) for pf, x in by.items()}
                            for v, by in rounds.items()},
            "over_sgd_each_round": per_round,
            "over_sgd": {v: statistics.median(x) for v, x in per_round.items()}}


def format_markdown(hosts) -> str:
    """RESULTS.md's table: ``hosts`` is ``[(label, figures), ...]`` (this scenario's
    JSON each), a row per host and thread count: each variant's median ns per rating of
    one thread and its median per-round ratio to SGD, then the range of every
    variant's ratio over the rounds."""
    head = ("| host | threads | " + " | ".join(f"`{v}` ns" for v in VARIANTS)
            + " | ratios' range over the rounds |\n"
            + "|---|---|" + "---|" * (len(VARIANTS) + 1) + "\n")
    rows = []
    for label, fig in hosts:
        for n, s in fig["threads"].items():
            cells = [f"{s['ns_per_rating']['sgd']:.1f}"] + [
                f"{s['ns_per_rating'][v]:.1f} ({s['over_sgd'][v]:.2f}x)" for v in VARIANTS[1:]]
            each = [x for v in VARIANTS[1:] for x in s["over_sgd_each_round"][v]]
            cells.append(f"{min(each):.2f}-{max(each):.2f}")
            rows.append(f"| {label} | {n} | " + " | ".join(cells) + " |")
    return head + "\n".join(rows)


def run(threads=THREADS, rounds=ROUNDS, steps=STEPS) -> dict:
    from hogkit.report import environment

    cxx = shutil.which("g++")
    if cxx is None:
        raise RuntimeError("benchmarks/rules_floor needs g++ on PATH")
    out = {"scenario": "rules_floor", "flags": list(FLAGS), "steps": steps,
           "rounds_each": rounds, "threads": {}}
    with tempfile.TemporaryDirectory(prefix="hogkit_rules_floor_") as tmp:
        out["data"] = _data(tmp)
        exe = os.path.join(tmp, "rules_floor")
        subprocess.run([cxx, *FLAGS, "-o", exe, SOURCE], check=True)
        for n in threads:
            res = subprocess.run([exe, tmp, str(n), str(rounds), str(steps)], check=True,
                                 capture_output=True, text=True, timeout=600)
            out["threads"][str(n)] = summarise(parse(res.stdout))
            s = out["threads"][str(n)]
            print(f"{n} thread(s): " + ", ".join(
                f"{k} {s['ns_per_rating'][k]:.1f} ns" + (
                    f" ({s['over_sgd'][k]:.2f}x SGD)" if k != "sgd" else "")
                for k in VARIANTS), flush=True)
    out["environment"] = environment()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rules_floor",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, help="where to write the figures")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    args = ap.parse_args(argv)
    from hogkit.report import write_json
    write_json(args.json, run(rounds=args.rounds, steps=args.steps))
    print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
