"""The open bars of issues 25 and 26, measured on a machine with many cores.

On a 2-core machine two workers and the parent share two cores, and the machine's
drift moves one worker's rate against the plain loop by a fifth between invocations.
Where there are more cores (a 16-core machine lent for a few minutes), every worker
and the parent get a core of their own. This driver runs, in this order, each part's
figures written to ``OUT/<part>.json`` as soon as that part ends (a run cut short
keeps the parts before it):

- ``replication``: :func:`benchmarks.dense.replication` on ``logreg`` alone
  (samples/s of two workers, shared copy and replicas, against one; issue 26);
- ``rates``: the mf rate rounds of :mod:`benchmarks.peers` on the default preset (one
  worker against the plain loop, alternating, at the lrs and batch of
  ``benchmarks/peers_session38_default.json``; issue 25);
- ``target``: :func:`benchmarks.dense.time_to_target` with :data:`TARGET_RUNS` (two
  workers' time to logreg's loss target against one worker's, each at its own lr;
  issue 26);
- ``simulate``: :func:`benchmarks.simulate.run` (the simulator's engine; issue 26).

Run from the repository root: ``python -m benchmarks.many_cores OUT [PART ...]``
(``benchmarks/many_cores_16/run.sh`` is the lent machine's wrapper; its figures are
in that folder, with the diagnosis scripts and outputs of ``diag/``).
:func:`format_markdown` renders RESULTS.md's section from a folder of figures.
"""

from __future__ import annotations

import json
import os
import sys
import time

#: time to target on many cores: the grids of :data:`benchmarks.dense.TARGET_RUNS`,
#: two workers on the shared copy with lr 32 added (on two cores its best, 16, was
#: the top of its grid), without ``local:K:sum`` (the same bits as
#: ``replication="worker:K"``)
TARGET_RUNS = (("sample", 1, {}, (2.0, 4.0, 8.0, 16.0)),
               ("sample", 2, {}, (4.0, 8.0, 16.0, 32.0)),
               ("worker4", 2, {"replication": "worker:4"}, (2.0, 4.0, 8.0, 16.0)),
               ("worker16", 2, {"replication": "worker:16"}, (1.0, 2.0, 4.0, 8.0, 16.0)))
TARGET_SECONDS = 3.0
#: the rate rounds' settings (peers_session38_default.json's best lrs and batch)
RATE_LR, RATE_BATCH, RATE_SECONDS, RATE_ROUNDS = 0.05, 256, 3.0, 6
PARTS = ("replication", "rates", "target", "simulate")


def rate_inputs():
    """``(wl, params, data)`` of the rate rounds (mf, default preset, seed 0), with the
    plain loop compiled before any round is timed."""
    from hogkit import workloads

    from . import peers
    wl = workloads.get("mf", preset="default")
    params, data = wl.build(0)
    peers.plain_mf_epoch(params["P"][:2].copy(), params["Q"][:2].copy(),
                         data["u"][:0], data["i"][:0], data["r"][:0], RATE_LR)  # compile
    return wl, params, data


def rates(wl, params, data, batch=RATE_BATCH) -> dict:
    """One set of rate rounds at :data:`RATE_LR`, the lane at ``batch`` ratings a step."""
    from . import peers
    c = {"plain": {"lr": RATE_LR}, "hogkit_sample_1": {"lr": RATE_LR, "batch": batch}}
    return peers._mf_rates(wl, params, data, c, RATE_SECONDS, RATE_ROUNDS)


def _rates():
    return {"preset": "default", "rates": rates(*rate_inputs())}


def part(name) -> dict:
    """One part's figures (see the module's docstring)."""
    from . import dense, simulate
    if name == "replication":
        return dense.replication(names=dense.REPLICATION_WORKLOADS[:1])
    if name == "rates":
        return _rates()
    if name == "target":
        return dense.time_to_target(runs=TARGET_RUNS, seconds=TARGET_SECONDS)
    if name == "simulate":
        return simulate.run()
    raise ValueError(f"unknown part {name!r}: pick from {', '.join(PARTS)}")


def load(folder) -> dict:
    """The parts' figures in ``folder`` (``<part>.json``), by part."""
    got = {}
    for name in PARTS:
        path = os.path.join(folder, f"{name}.json")
        if os.path.exists(path):
            with open(path) as f:
                got[name] = json.load(f)
    return got


def format_markdown(parts) -> str:
    """RESULTS.md's tables and lines of the parts in ``parts`` (:func:`load`)."""
    from . import dense, peers, simulate
    out = []
    if "replication" in parts:
        out += ["`replication=` on logreg, 2 s a run, three seeds: M samples/s (x one "
                "worker on the shared copy), final loss median [range]:", "",
                dense.format_replication_markdown({"replication": parts["replication"]}),
                ""]
    if "rates" in parts:
        out += ["mf, default preset: " + peers._mf_rates_line(parts["rates"]["rates"]), ""]
    if "target" in parts:
        t = parts["target"]
        out += [f"Time to logreg's loss {t['target_loss']} ({t['seconds']:g} s runs, "
                f"seeds {', '.join(map(str, t['seeds']))}; inf: not reached):", "",
                dense.format_target_markdown({"target": t}), ""]
    if "simulate" in parts:
        out += ["The simulator's engine (`hogkit bench simulate`'s figures):", "",
                simulate.format_markdown(parts["simulate"]), ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv=None) -> int:
    from hogkit.report import environment, write_json
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 2
    out, names = argv[0], argv[1:] or list(PARTS)
    os.makedirs(out, exist_ok=True)
    for name in names:
        t0 = time.perf_counter()
        got = part(name)
        got["part_seconds"] = time.perf_counter() - t0
        write_json(os.path.join(out, f"{name}.json"), {**got, "environment": environment()})
        print(f"{name}: {got['part_seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
