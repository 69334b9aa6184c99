"""The per-sample lane's step size: one mf worker's rate against the plain loop's, at
several ratings a step (issue 25).

A lane step is the unit of the clocks, the policy and the staleness record: its clock
reads, tick and record are paid once per ``batch`` ratings. This driver runs the rate
rounds of :mod:`benchmarks.peers` (one worker against the plain loop, alternating, on
the default preset, at :data:`benchmarks.many_cores.RATE_LR`) once per step size in
:data:`BATCHES`, the sizes' order reversed in every other repeat, :data:`REPEATS`
times; every figure is a ratio measured inside one set of rounds.

Run from the repository root: ``python -m benchmarks.lane_steps OUT.json``;
:func:`format_markdown` renders RESULTS.md's table from the JSON.
"""

from __future__ import annotations

import sys

#: the step sizes compared: the old default and the new (mf's ``default_sample_batch``)
BATCHES = (256, 4096)
REPEATS = 2


def run(batches=BATCHES, repeats=REPEATS) -> dict:
    """The rate rounds at each step size, ``repeats`` times (see the docstring)."""
    from .many_cores import rate_inputs, rates
    inputs = rate_inputs()
    runs = []
    for k in range(repeats):
        for b in (batches if k % 2 == 0 else batches[::-1]):
            runs.append({"batch": b, "repeat": k, "rates": rates(*inputs, batch=b)})
    return {"preset": "default", "batches": list(batches), "repeats": repeats, "runs": runs}


def format_markdown(result) -> str:
    """RESULTS.md's table: per step size, each set of rounds' median ratio (range)."""
    out = ["| ratings a step | hogkit / plain loop, each set of rounds: median (range) |",
           "|---|---|"]
    for b in result["batches"]:
        cells = []
        for r in result["runs"]:
            if r["batch"] == b:
                g = r["rates"]
                lo, hi = g["ratio_range"]
                cells.append(f"{g['median']['ratio']:.2f} ({lo:.2f}–{hi:.2f})")
        out.append(f"| {b:,} | " + "; ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    from hogkit.report import environment, write_json
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__)
        return 2
    write_json(argv[0], {**run(), "environment": environment()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
