"""Scenario ``coldstart``: a first ``hogkit run`` on a machine against a later one.

The README's main command as a new user meets it: ``hogkit run --seconds 2`` (mf, 2
workers) in a fresh process, its stderr a pipe (so one line per stage), twice a round:
*cold* with an empty ``NUMBA_CACHE_DIR`` (every kernel compiled, as on a fresh install)
and *warm* on the cache the cold run just filled. Per run: the seconds from start to
exit, when the first stage line arrived (how long a user waits without being told
anything), and the stages' start times from their ``[ t s]`` prefixes (compiling:
from "compiling" to "kernels ready"). Medians over rounds. Issue 28's bar: a cold run
done in at most 20 s on the 2-core development machine.

``ratios``: ``cold_s``, ``warm_s``, ``compile_s`` (cold), ``first_line_s`` (cold) and
``cold_over_warm``.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

#: the command, after ``hogkit``
COMMAND = ("run", "--seconds", "2")
_STAGE = re.compile(r"^\[\s*([0-9.]+) s\] (.*)$")


def stages(stderr: str) -> dict:
    """``{"compile_s", "first_stage_s", "training_s", ...}`` from a run's stage lines
    (``hogkit.engine.progress``): "compile_s" is from the "compiling" line to "kernels
    ready"; absent what the lines do not show."""
    seen = []
    for line in stderr.splitlines():
        m = _STAGE.match(line.strip())
        if m:
            seen.append((float(m.group(1)), m.group(2)))
    out = {}
    if seen:
        out["first_stage_s"] = seen[0][0]
    at = {next((k for k in ("compiling", "kernels ready", "training done", "training")
                if text.startswith(k)), None): t for t, text in seen}
    if "compiling" in at and "kernels ready" in at:
        out["compile_s"] = round(at["kernels ready"] - at["compiling"], 2)
    if "training" in at:
        out["training_starts_s"] = at["training"]
    return out


def _once(cache_dir, seconds) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    with tempfile.TemporaryDirectory(prefix="hogkit-coldstart-") as out:
        argv = [sys.executable, "-m", "hogkit.cli",
                *COMMAND[:-1], str(seconds), "--out", os.path.join(out, "run")]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        first = None
        err = []
        for line in proc.stderr:             # the first line's arrival, as a user sees it
            if first is None:
                first = time.monotonic() - t0
            err.append(line)
        stdout = proc.stdout.read()
        rc = proc.wait()
        wall = time.monotonic() - t0
    if rc != 0:
        raise RuntimeError(f"hogkit {' '.join(COMMAND)} exited {rc}:\n{''.join(err)}{stdout}")
    return {"wall_s": round(wall, 2), "first_line_s": round(first or wall, 2),
            **stages("".join(err))}


def run(quick=False, rounds=None) -> dict:
    rounds = rounds or (1 if quick else 3)
    seconds = 0.5 if quick else float(COMMAND[-1])
    cold, warm = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="hogkit-numba-") as cache:
            cold.append(_once(cache, seconds))
            warm.append(_once(cache, seconds))

    def med(runs, key):
        vals = [r[key] for r in runs if key in r]
        return round(statistics.median(vals), 2) if vals else float("nan")

    ratios = {"cold_s": med(cold, "wall_s"), "warm_s": med(warm, "wall_s"),
              "compile_s": med(cold, "compile_s"), "first_line_s": med(cold, "first_line_s")}
    ratios["cold_over_warm"] = round(ratios["cold_s"] / ratios["warm_s"], 2)
    return {"scenario": "coldstart", "quick": quick, "rounds": rounds,
            "command": "hogkit " + " ".join(COMMAND[:-1] + (f"{seconds:g}",)),
            "cold": cold, "warm": warm, "ratios": ratios}


def format_table(result) -> str:
    r = result["ratios"]
    rows = [f"coldstart: `{result['command']}`, medians of {result['rounds']} round(s)",
            f"  cold (empty numba cache)  {r['cold_s']:6.1f} s   first line after "
            f"{r['first_line_s']:.1f} s, compiling {r['compile_s']:.1f} s",
            f"  warm (cache filled)       {r['warm_s']:6.1f} s",
            f"  cold / warm               {r['cold_over_warm']:6.2f}"]
    return "\n".join(rows)


def format_markdown(result, before=None) -> str:
    """The RESULTS.md table: cold and warm medians (and ``before``'s, the same scenario
    run against an earlier commit), the first line's arrival and the compile stage."""
    def cell(r, key, fmt="{:.1f} s"):
        v = r["ratios"].get(key) if r else None
        return "-" if v is None or v != v else fmt.format(v)
    rows = ["| | after | before |", "|---|---|---|"]
    for label, key in (("cold: empty numba cache", "cold_s"), ("warm: cache filled", "warm_s"),
                       ("cold / warm", "cold_over_warm"),
                       ("first line on stderr (cold)", "first_line_s"),
                       ("compiling stage (cold)", "compile_s")):
        fmt = "{:.2f}" if key == "cold_over_warm" else "{:.1f} s"
        rows.append(f"| {label} | {cell(result, key, fmt)} | {cell(before, key, fmt)} |")
    return "\n".join(rows)
