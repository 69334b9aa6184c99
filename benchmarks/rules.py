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
``momentum`` (SGD with heavy-ball momentum, at ``lr·(1 - MU)``) is no staleness rule: it
is the floor of what a per-coordinate state costs. It reads and writes a table as large
as the model, as Gap-Aware's second moment and adaptive DC-ASGD's mean square do, and
does none of their gap work (no read copies, no gaps, no check).

Part ``one_worker``: the same rules' steps in this process, one worker, no other writer
(the compiled core on the workload's sampler and default batch, record on), the rules
taking turns, ``STEP_ROUNDS`` rounds of ``STEPS`` steps each: nanoseconds per sample
and each rule's median per-round ratio to SGD. No process, no second worker: when
these ratios equal the live ones, what a rule costs is its own work per step, not
contention between workers.

Part ``repeat`` (``--only repeat``, alone; ``--workload mf`` for mf's, logreg's by
default): the workload's live runs of ``REPEAT_RULES``,
``REPEAT_ROUNDS`` rounds, every run's figures
(samples/s, each worker's, the mean update gap) and every round's ratio: on a host
whose two cores sometimes run the same step three times slower (``RESULTS.md``,
session 52), a median of three rounds can land in either mode. Each run also records
the time a cache line takes to pass between the two cores just before and just after
it (:func:`hogkit.doctor.line_handover_ns`), which says where the host had placed them
(:func:`placement`: near, sharing a cache, or far), and :func:`by_placement` gives each
rule's ratio to SGD within one placement.
"""

from __future__ import annotations

import statistics
import hogkit

#: seconds per rule and round, rounds, workers
SECONDS, ROUNDS, WORKERS = 2.0, 3, 2
WORKLOADS = ("mf", "logreg")
#: the one-worker part: rounds, and steps per rule and round (per workload)
STEP_ROUNDS = 7
STEPS = {"mf": 2000, "logreg": 1000}


#: the ``repeat`` part: its rules and rounds (logreg, live, ``WORKERS`` workers): SGD,
#: the general path alone (staleness-aware), the gap work alone (constant DC-ASGD), the
#: state table alone (the momentum floor), both (adaptive DC-ASGD, Gap-Aware)
REPEAT_RULES = ("sgd", "staleness_aware", "dc", "momentum", "dc_adaptive", "gap_aware")
REPEAT_ROUNDS = 6

#: the momentum floor's decay (its lr is scaled by ``1 - MU``: the same step size as SGD's)
MU = 0.9


def _rules(lr):
    from hogkit.rules.core import SGD, DelayCompensated, GapAware, StalenessAware
    return {"sgd": SGD(lr), "staleness_aware": StalenessAware(lr),
            "momentum": SGD(lr * (1.0 - MU), momentum=MU), "dc": DelayCompensated(lr),
            "dc_adaptive": DelayCompensated(lr, adaptive=True), "gap_aware": GapAware(lr)}


def _live_rounds(wl, rules, rounds, seconds, workers, figure, handover=False):
    """``rounds`` rounds of live runs of ``wl``, each rule of ``rules`` (name -> rule)
    once a round, the order rotating by one each round: ``[{"order": [...], name:
    figure(run)}]``. ``handover``: ``figure`` returns a dict, and each gets
    ``handover_ns``, a cache line's hand-over time between two cores measured just
    before and just after the run (:func:`hogkit.doctor.line_handover_ns`)."""
    from hogkit.doctor import line_handover_ns
    from hogkit.engine.runtime import train
    names = list(rules)
    out = []
    for k in range(rounds):
        order = names[k % len(names):] + names[:k % len(names)]
        got = {"order": order}
        for rule in order:
            before = line_handover_ns() if handover else None
            run = train(wl, workers=workers, engine=hogkit.Engine(lane="batch"),
                        outputs=hogkit.Outputs(eval_every=None, progress=False, keep_params=False),
                        seconds=seconds, rule=rules[rule])
            got[rule] = figure(run)
            if handover:
                got[rule]["handover_ns"] = [before, line_handover_ns()]
        out.append(got)
    return out


def _one(name, seconds, rounds, workers, only=None):
    from hogkit import workloads
    wl = workloads.get(name)
    rules = {k: v for k, v in _rules(wl.default_lr).items() if only is None or k in only}
    names = list(rules)
    out = _live_rounds(wl, rules, rounds, seconds, workers,
                       lambda run: run.extra["samples"] / run.wall_s)
    med = {r: statistics.median(g[r] for g in out) for r in names}
    ratio = {r: statistics.median(g[r] / g["sgd"] for g in out) for r in names if r != "sgd"}
    return {"workload": name, "workers": workers, "seconds": seconds, "lr": wl.default_lr,
            "batch": wl.default_batch, "rounds": out, "samples_per_s": med,
            "over_sgd": ratio}


def _core(wl, rule):
    """A one-worker compiled step core for ``rule`` on fresh parameters of ``wl``, as a
    live worker builds it (its clock counts every writer: ``clock_fresh``)."""
    import numpy as np

    from hogkit.engine.step import CompiledStep
    from hogkit.engine.worker_loop import control_specs
    from hogkit.state.clocks import RUNNING, Clocks
    from hogkit.state.reader import StalenessLog
    params, data = wl.build(0)
    views = {k: np.zeros(shape, dt) for k, (shape, dt) in control_specs(1, ring=64).items()}
    clocks, log = Clocks(views), StalenessLog(views)
    clocks.state[:] = RUNNING
    ctx = wl.setup(params, data, rank=0, seed=0)
    return CompiledStep(ctx, rank=0, batch=wl.default_batch, rule=rule,
                        rule_state=rule.init(params), density=None, density_state=None,
                        slots=clocks.slots, rt=views["rt"], stop=clocks.stop,
                        log=log.arrays(), rng=np.random.default_rng([0, 0]),
                        clock_fresh=True)


def _one_worker(name, rounds, steps, only=None):
    """The ``one_worker`` part on workload ``name``: each rule's step, in turns."""
    import time

    from hogkit import workloads
    wl = workloads.get(name)
    rules = {k: v for k, v in _rules(wl.default_lr).items() if only is None or k in only}
    cores = {k: _core(wl, r) for k, r in rules.items()}
    for core in cores.values():
        core.run(min(steps, 50))              # compiled, caches warm
    per = wl.default_batch * steps
    out = []
    for k in range(rounds):
        names = list(cores)
        order = names[k % len(names):] + names[:k % len(names)]
        got = {"order": order}
        for rule in order:
            t0 = time.perf_counter()
            cores[rule].run(steps)
            got[rule] = (time.perf_counter() - t0) / per * 1e9
        out.append(got)
    med = {r: statistics.median(g[r] for g in out) for r in cores}
    ratio = {r: statistics.median(g["sgd"] / g[r] for g in out) for r in cores if r != "sgd"}
    return {"workload": name, "batch": wl.default_batch, "steps": steps, "rounds": out,
            "ns_per_sample": med, "over_sgd": ratio}


def _gap_mean(run):
    """The run's mean update gap (others' updates between a step's read and its
    update), over every worker's recorded steps."""
    gaps = [w["staleness"]["update_gap"] for w in run.per_worker]
    n = sum(g["count"] for g in gaps)
    return sum(g["mean"] * g["count"] for g in gaps) / n if n else 0.0


def repeat(quick=False, rules=REPEAT_RULES, rounds=REPEAT_ROUNDS, seconds=SECONDS,
           workload="logreg"):
    """Part ``repeat``: the live runs of ``rules`` on ``workload`` (its default preset),
    ``rounds`` times (the order rotating), each run's samples/s, its workers' own
    samples/s and its mean update gap, and each round's ratio of each rule to SGD: the
    spread a median of three rounds hides. ``quick``: SGD and Gap-Aware, two rounds of
    0.5 s."""
    from hogkit import workloads
    if quick:
        rules, rounds, seconds = ("sgd", "gap_aware"), 2, 0.5
    wl = workloads.get(workload)
    made = _rules(wl.default_lr)
    out = _live_rounds(wl, {r: made[r] for r in rules}, rounds, seconds, WORKERS,
                       lambda run: {"samples_per_s": run.extra["samples"] / run.wall_s,
                                    "per_worker": [w["samples"] / run.wall_s
                                                   for w in run.per_worker],
                                    "gap_mean": _gap_mean(run)}, handover=True)
    each = {r: [g[r]["samples_per_s"] / g["sgd"]["samples_per_s"] for g in out]
            for r in rules if r != "sgd"}
    rep = {"workload": workload, "workers": WORKERS, "seconds": seconds, "rounds": out,
           "over_sgd_each_round": each,
           "over_sgd": {r: statistics.median(v) for r, v in each.items()}}
    return {**rep, "best_over_sgd": best_over_sgd(rep), "by_placement": by_placement(rep)}


def placement(figures):
    """A run's cores as its hand-over times before and after it say: "near" (both
    under :data:`hogkit.doctor.FAR_NS`), "far" (both over), else "moved" (the host
    moved them during the run, or a probe failed)."""
    from hogkit.doctor import FAR_NS
    ns = figures.get("handover_ns") or [None]
    if any(v is None for v in ns):
        return "moved"
    if all(v < FAR_NS for v in ns):
        return "near"
    return "far" if all(v > FAR_NS for v in ns) else "moved"


def by_placement(rep):
    """For each placement ("near", "far": :func:`placement`), its runs per rule and
    each rule's median samples/s over its runs there against SGD's median there: the
    ratio within one placement, measured, not guessed from the speeds."""
    out = {}
    rules = rep["rounds"][0]["order"]
    for where in ("near", "far"):
        runs = {r: [g[r]["samples_per_s"] for g in rep["rounds"]
                    if placement(g[r]) == where] for r in rules}
        med = {r: statistics.median(v) for r, v in runs.items() if v}
        out[where] = {"runs": {r: len(v) for r, v in runs.items()},
                      "over_sgd": ({r: med[r] / med["sgd"] for r in med if r != "sgd"}
                                   if "sgd" in med else {})}
    return out


def best_over_sgd(rep):
    """Each rule's fastest run over SGD's fastest run in a ``repeat`` part: on a host
    with a fast and a slow mode, the ratio of the fast mode's figures (as long as every
    rule has a run in it), where a median of per-round ratios mixes the modes."""
    best = {r: max(g[r]["samples_per_s"] for g in rep["rounds"])
            for r in rep["rounds"][0]["order"]}
    return {r: v / best["sgd"] for r, v in best.items() if r != "sgd"}


def format_repeat(result) -> str:
    """The ``repeat`` part's table (markdown): one row per round, each rule's M
    samples/s with its run's mean update gap (and, where the run recorded them, the
    hand-over times before and after it, in ns), then each rule's ratio to SGD; the
    best runs' ratio, and where placements were recorded a row per placement
    (:func:`by_placement`)."""
    r = result["repeat"]
    rules = r["rounds"][0]["order"]
    rules = ["sgd"] + [x for x in rules if x != "sgd"]
    probed = any("handover_ns" in g[x] for g in r["rounds"] for x in rules)
    head = "M/s (gap; ns before/after)" if probed else "M/s (gap)"
    rows = ["| round | " + " | ".join(f"`{x}` {head}" for x in rules) + " | "
            + " | ".join(f"`{x}` / SGD" for x in rules[1:]) + " |",
            "|---|" + "---|" * (2 * len(rules) - 1)]
    for i, g in enumerate(r["rounds"]):
        cells = [f"{g[x]['samples_per_s'] / 1e6:.2f} ({g[x]['gap_mean']:.2f}"
                 + _ns(g[x]) + ")" for x in rules]
        cells += [f"{r['over_sgd_each_round'][x][i]:.2f}" for x in rules[1:]]
        rows.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    best = best_over_sgd(r)
    rows.append("| best run / SGD's best | " + " | ".join([""] * len(rules)) + " | "
                + " | ".join(f"{best[x]:.2f}" for x in rules[1:]) + " |")
    for where, got in (r.get("by_placement") or {}).items():
        n = got["runs"]
        rows.append(f"| {where}: median / SGD's median | "
                    + " | ".join(f"{n.get(x, 0)} run(s)" for x in rules) + " | "
                    + " | ".join(f"{got['over_sgd'][x]:.2f}" if x in got["over_sgd"]
                                 else "–" for x in rules[1:]) + " |")
    return "\n".join(rows)


def _ns(figures):
    """``; 41/43 ns``: a run's hand-over times before and after it, where measured."""
    ns = figures.get("handover_ns")
    if not ns:
        return ""
    return "; " + "/".join("?" if v is None else f"{v:.0f}" for v in ns) + " ns"


def run(quick=False, only=None, workload=None) -> dict:
    """Every rule on every workload; ``quick``: SGD and Gap-Aware on logreg, one round
    of 0.5 s (a smoke run: each rule compiles its own core on a cold cache).
    ``only="repeat"``: the part :func:`repeat` alone, on ``workload`` (default logreg)."""
    from hogkit.errors import InvalidArgument
    if only == "repeat":
        workload = workload or "logreg"
        if workload not in WORKLOADS:
            raise InvalidArgument(f"hogkit bench rules --only repeat --workload {workload}: "
                                  f"the part runs on {' or '.join(WORKLOADS)}")
        r = repeat(quick, workload=workload)
        return {"scenario": "rules", "quick": quick, "repeat": r, "ratios": {
            f"{workload}_{k}_over_sgd": v for k, v in r["over_sgd"].items()}}
    if only is not None:
        raise InvalidArgument(f"hogkit bench rules --only {only!r}: the one part is "
                              f"'repeat' (or leave --only out for the whole scenario)")
    if workload is not None:
        raise InvalidArgument(f"hogkit bench rules --workload {workload}: the whole "
                              f"scenario runs {' and '.join(WORKLOADS)}; --workload picks "
                              f"the workload of --only repeat")
    seconds, rounds = (0.5, 1) if quick else (SECONDS, ROUNDS)
    names = WORKLOADS[-1:] if quick else WORKLOADS
    only = ("sgd", "gap_aware") if quick else None
    result = {"scenario": "rules", "quick": quick, "by_workload": {}, "one_worker": {},
              "ratios": {}}
    for name in names:
        r = _one(name, seconds, rounds, WORKERS, only)
        result["by_workload"][name] = r
        for rule, v in r["over_sgd"].items():
            result["ratios"][f"{name}_{rule}_over_sgd"] = v
    for name in names:
        r = _one_worker(name, 1 if quick else STEP_ROUNDS, 20 if quick else STEPS[name],
                        only)
        result["one_worker"][name] = r
        for rule, v in r["over_sgd"].items():
            result["ratios"][f"{name}_{rule}_one_worker_over_sgd"] = v
    return result


def _table_lines(head, values, ratios, fmt):
    """A part's lines of :func:`format_table`: ``head``, then one per rule (its value
    through ``fmt`` and, except SGD's, its ratio to SGD)."""
    return [head] + [f"  {rule:16s} {fmt(v)}" + (f"   {ratios[rule]:.2f}x SGD"
                                                 if rule in ratios else "")
                     for rule, v in values.items()]


def format_table(result) -> str:
    if "repeat" in result:
        return format_repeat(result)
    lines = []
    for name, r in result["by_workload"].items():
        lines += _table_lines(f"{name}: {r['workers']} workers, batch {r['batch']}, "
                              f"{len(r['rounds'])} round(s) of {r['seconds']:g} s per rule",
                              r["samples_per_s"], r["over_sgd"],
                              lambda v: f"{v / 1e6:8.2f} M samples/s")
    for name, r in result.get("one_worker", {}).items():
        lines += _table_lines(f"{name}: one worker in this process, batch {r['batch']}, "
                              f"{len(r['rounds'])} round(s) of {r['steps']} steps per rule",
                              r["ns_per_sample"], r["over_sgd"],
                              lambda v: f"{v:8.1f} ns/sample")
    return "\n".join(lines)


def format_one_worker(result) -> str:
    """The ``one_worker`` part's table (markdown): ns per sample and the ratio to SGD
    beside the live ratio of the same invocation."""
    names = list(result["one_worker"])
    cols = [f"`{n}` ns/sample | `{n}` / SGD | live" for n in names]
    rows = ["| rule (one worker, in process) | " + " | ".join(cols) + " |",
            "|---|" + "---|---|---|" * len(names)]
    for rule in result["one_worker"][names[0]]["ns_per_sample"]:
        cells = []
        for n in names:
            r, live = result["one_worker"][n], result["by_workload"][n]["over_sgd"]
            ratio = r["over_sgd"].get(rule)
            cells.append(f"{r['ns_per_sample'][rule]:.1f} | "
                         + (f"{ratio:.2f} | {live[rule]:.2f}" if ratio is not None
                            else "1 | 1"))
        rows.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


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
                then = before["by_workload"][n]["over_sgd"].get(rule)   # "–": not run
                cell += " | " + (f"{then:.2f}" if then is not None else
                                 "1" if rule == "sgd" else "–")
            cells.append(cell)
        rows.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
