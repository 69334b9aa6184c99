"""The floor a plain compiled loop pays for a rule's per-coordinate state on mf's
minibatch step (issue 26, item 3).

Issue 26 asks adaptive DC-ASGD and Gap-Aware for >= 0.7x SGD's live samples/s. Those
rules read and write a state table as large as the factors, and the gap rules keep read
copies of every row they read. :file:`rules_floor.cpp` writes the same steps as a C++
programmer would (``K`` a compile-time constant, restrict pointers, ``-O3 -march=native
-ffast-math``) on the data of mf's default preset: plain SGD, SGD moving a state row
per factor row (adaptive DC-ASGD's step on a fresh read), the same from read copies,
and hogkit's general shape (copies and gradient rows into buffers, then a pass per
table). Each variant's ratio to SGD in the same round says what the bytes cost a loop
with no overhead of its own, on this host: the floor under hogkit's ratios.

Run: ``python -m benchmarks.rules_floor --json FILE`` (needs ``g++``; ~1 minute). The
JSON keeps every round's ns per rating per thread for 1 and 2 threads (two threads:
Hogwild! on shared factors, each thread's state its own, as hogkit's workers), the
medians, and each variant's median per-round ratio to SGD (SGD's ns over the
variant's: samples/s, as ``hogkit bench rules`` reports).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

#: threads, rounds (the variants' order rotating each round), steps of 64 ratings per
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
    """The program's output: ``{variant: [ns per rating per thread, each round]}``."""
    out = {}
    for line in text.splitlines():
        name, *vals = line.split()
        if name in VARIANTS:
            out[name] = [float(v) for v in vals]
    missing = set(VARIANTS) - set(out)
    if missing:
        raise RuntimeError(f"rules_floor printed no figures for {sorted(missing)}:\n{text}")
    return out


def summarise(rounds: dict) -> dict:
    """Medians of ns per rating, and each variant's median per-round ratio to SGD."""
    med = {k: statistics.median(v) for k, v in rounds.items()}
    over = {k: statistics.median(s / x for s, x in zip(rounds["sgd"], v))
            for k, v in rounds.items() if k != "sgd"}
    return {"rounds": rounds, "ns_per_rating": med, "over_sgd": over}


def format_markdown(hosts) -> str:
    """RESULTS.md's table: ``hosts`` is ``[(label, figures), ...]`` (this scenario's
    JSON each), a row per host and thread count: each variant's median ns per rating
    per thread and its median per-round ratio to SGD."""
    head = ("| host | threads | " + " | ".join(f"`{v}` ns" for v in VARIANTS) + " |\n"
            + "|---|---|" + "---|" * len(VARIANTS) + "\n")
    rows = []
    for label, fig in hosts:
        for n, s in fig["threads"].items():
            cells = [f"{s['ns_per_rating']['sgd']:.1f}"] + [
                f"{s['ns_per_rating'][v]:.1f} ({s['over_sgd'][v]:.2f}x)" for v in VARIANTS[1:]]
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
    out = run(rounds=args.rounds, steps=args.steps)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
