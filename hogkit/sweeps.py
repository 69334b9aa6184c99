"""Grids of runs into one tidy table: ``hogkit.sweep(grid)`` and ``hogkit sweep``.

A *cell* is a dict of knobs; a *grid* is a dict ``knob -> [values]`` (every
combination), or a list of such dicts (their union: e.g. each rule with its own
learning-rate grid). ``base`` holds the knobs every cell shares. Each cell runs once,
live (:func:`hogkit.train`: real processes) or simulated (:func:`hogkit.simulate`:
virtual time, any number of workers), and becomes one **row**: the cell's knobs, then
what it measured (final and initial loss, the workload's metrics as ``m.<name>``, the
update gap and clock lag summaries, updates, wall and virtual seconds, the engine and
lane, the
realised straggler slowdown, and the loss curve as ``[t, updates, loss]`` points).

**Resumable.** Rows go to ``out`` (JSON lines), one line per finished cell, flushed and
fsynced before the next cell starts. A cell whose key (its knobs, canonical JSON) is
already in the file is skipped, so an interrupted sweep started again does only what is
left; SIGINT stops the running cell and leaves every finished row (a torn last line,
after a SIGKILL mid-write, is ignored on reading).

**Knobs.** ``workload`` (a name), ``o.<option>`` (a workload option, e.g. ``o.preset``),
``mode`` (``"live"`` or ``"sim"``), ``workers``, ``steps``, ``seconds``, ``seed``,
``policy`` (``"async"``, ``"bsp"``, ``"ssp:S"``, ``"dssp:LO:HI"``, ``"local:H[:overlap]"``
or a policy object), ``rule`` (``"sgd"``, ``"staleness-aware"``, ``"dc-asgd"``,
``"dc-asgd-adaptive"``, ``"gap-aware"`` or a rule object) with ``lr`` and ``momentum``,
``density`` (a fraction, ``"topk:F"``, ``"random:F"``, ``"every:K"``, with ``":dropped"``
for no residual, or a :class:`~hogkit.rules.density.Density`), ``batch`` (an int or the
``"adaptive:B[:narx]"`` forms), ``straggler`` (``"RANK:FACTOR"``, ``"RANK:load:AMP:PERIOD"``,
``"RANK:pauses:PROB:SECONDS"``, a list of them, or a dict ``{rank: model}``), ``delays``
(simulated step times, the CLI's forms), ``shards``, ``nonfinite``, ``eval_every``,
``engine`` (as ``train``/``simulate`` take it: to compare like with like where one
cell could take the compiled step and another not). Every string form is read by the
parser the command line uses (:mod:`hogkit.parse`). Unknown knobs, bad values and a
knob the mode cannot take are refused for every cell before the first one runs.

A run that diverges (a non-finite gradient with ``nonfinite="raise"``) is a row with
``diverged: true`` and no loss: in a learning-rate grid that is a result, not a crash.

**Tuning that brackets.** :func:`tune` runs a grid the same way, then, for every group
of cells that differ only in ``lr`` and ``seed``, takes the best lr (fewest diverged
seeds, then the lowest mean loss) and, while it sits at an edge of the lrs tried, tries
one more lr past that edge (``factor`` times further), up to ``extend`` times per
edge. Every tuned cell then has a worse lr on both sides, or says which bound it hit
(``bracketed: false, bound: "low" | "high"``): a "tuned" method whose optimum lies
outside the grid is not reported as tuned. ``hogkit sweep --tune`` does it from the
command line.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import warnings
from typing import Iterable, Mapping

from hogkit import workloads
from hogkit.engine.mainguard import check_main_guard
from hogkit.engine.plan import make_plan
from hogkit.engine.runtime import train
from hogkit.engine.settings import Engine, Outputs, Workers
from hogkit.engine.simulator import simulate
from hogkit.errors import (EngineNotice, InvalidArgument, InvalidType, NonFiniteGradient,
                           WorkerFailed)
from hogkit.parse import parse_batch, parse_density, parse_policy, parse_rule

__all__ = ["sweep", "tune", "cells", "load", "aggregate", "mean_std", "plot", "KNOBS"]

KNOBS = ("workload", "mode", "workers", "steps", "seconds", "seed", "policy", "rule", "lr",
         "momentum", "density", "batch", "straggler", "delays", "shards", "nonfinite",
         "eval_every", "engine", "replication", "rule_state")
MODES = ("live", "sim")
#: what a live worker's NonFiniteGradient reaches the parent as (WorkerFailed.cause)
_NONFINITE = f"{NonFiniteGradient.__module__}.{NonFiniteGradient.__qualname__}"
_SIM_ONLY = ("delays", "rule_state")


# --------------------------------------------------------------------------- cells

def cells(grid, base=None) -> list:
    """Every cell of ``grid`` (a dict of lists, or a list of them), ``base`` under each,
    in order, without repeats."""
    if isinstance(grid, Mapping):
        grid = [grid]
    if not isinstance(grid, (list, tuple)) or not grid:
        raise InvalidType("grid must be a dict knob -> list of values, or a non-empty "
                          "list of such dicts")
    base = dict(base or {})
    out, seen = [], set()
    for part in grid:
        if not isinstance(part, Mapping):
            raise InvalidType(f"grid part {part!r} is not a dict knob -> list of values")
        keys = list(part)
        values = []
        for k in keys:
            v = part[k]
            if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
                raise InvalidType(f"grid[{k!r}] must be a list of values, got {v!r}; "
                                  f"write [{v!r}] for one value (or put it in base)")
            values.append(list(v))
        for combo in itertools.product(*values):
            cell = {**base, **dict(zip(keys, combo))}
            key = cell_key(cell)
            if key not in seen:
                seen.add(key)
                out.append(cell)
    return out


def _canon(v):
    if isinstance(v, Mapping):
        return {str(k): _canon(x) for k, x in sorted(v.items(), key=lambda i: str(i[0]))}
    if isinstance(v, (list, tuple)):
        return [_canon(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)          # hogkit's policies, rules, densities: frozen dataclasses


def cell_key(cell) -> str:
    """The cell's identity in a results file: its knobs as canonical JSON."""
    return json.dumps(_canon(cell), sort_keys=True)


def _kwargs(cell, mode_default):
    """``(mode, fn kwargs)`` for one cell; raises on anything wrong with it. The flat
    knobs go into the front doors' groups (``Workers``, ``Engine``, ``Outputs``), and
    what the cell leaves out comes from the workload's defaults, as for any run."""
    cell = dict(cell)
    unknown = [k for k in cell if k not in KNOBS and not k.startswith("o.")]
    if unknown:
        raise InvalidArgument(f"unknown sweep knob(s) {unknown}; expected {list(KNOBS)} or "
                              f"o.<workload option>")
    mode = cell.pop("mode", mode_default)
    if mode not in MODES:
        raise InvalidArgument(f"mode={mode!r}; expected 'live' or 'sim'")
    for k in _SIM_ONLY:
        if k in cell and mode != "sim":
            raise InvalidArgument(f"knob {k!r} is for simulated cells only (mode='sim')")
    options = {k[2:]: cell.pop(k) for k in list(cell) if k.startswith("o.")}
    wl = workloads.get(cell.pop("workload", "mf"), **options)
    kw = {"workload": wl}
    lr, momentum = cell.pop("lr", None), cell.pop("momentum", 0.0)
    rule = cell.pop("rule", None)
    if rule is None or isinstance(rule, str):
        kw["rule"] = parse_rule(rule, lr=lr, momentum=momentum, workload=wl)
    else:
        if lr is not None or momentum:
            raise InvalidArgument("lr/momentum go with a rule name; a rule object carries "
                                  "its own")
        kw["rule"] = rule
    if "policy" in cell:
        p = cell.pop("policy")
        kw["policy"] = parse_policy(p) if isinstance(p, str) else p
    if "density" in cell:
        d = cell.pop("density")
        kw["density"] = parse_density(d) if isinstance(d, (str, int, float)) else d
    workers = cell.pop("workers", 2)
    if "batch" in cell:
        b = cell.pop("batch")
        kw["batch"] = (parse_batch(b, per_worker=wl.default_batch, workers=workers)
                       if isinstance(b, str) else b)
    kw["workers"] = Workers(workers, stragglers=cell.pop("straggler", None),
                            delays=cell.pop("delays", None))
    engine = {k: cell.pop(k) for k in ("engine", "replication", "shards", "nonfinite",
                                       "rule_state") if k in cell}
    if "engine" in engine:
        engine["kind"] = engine.pop("engine")
    kw["engine"] = Engine(**engine)
    kw["outputs"] = Outputs(keep_params=False, eval_every=cell.pop("eval_every", "auto"),
                            progress=False if mode == "live" else None)
    kw.update(cell)            # steps, seconds, seed
    # every knob checked now, as the run will check it (nothing is built; the run says
    # which engine runs it)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EngineNotice)
        make_plan(**kw, mode="sim" if mode == "sim" else "live")
    return mode, kw


def _run(mode, kw):
    return (simulate if mode == "sim" else train)(**kw)


# --------------------------------------------------------------------------- rows

def _stats(part):
    return {"mean": round(float(part.get("mean", 0.0)), 4), "p50": part.get("p50"),
            "p99": part.get("p99"), "max": part.get("max")}


def _finite(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def _row(cell, key, mode, run) -> dict:
    s = run.summary()
    if _finite(s["final_loss"]) is None:
        # the parameters grew until the loss overflowed (the guard checks gradients,
        # and nonfinite="skip" drops them): diverged as surely as a non-finite gradient
        return _diverged(cell, key, mode, "the loss became non-finite: the parameters "
                         "overflowed")
    row = {"key": key, **_canon(cell), "mode": mode, "diverged": False, "error": None}
    row.update(final_loss=s["final_loss"], initial_loss=s["initial_loss"],
               updates=s["updates"], samples=s.get("samples"), wall_s=s["wall_s"],
               virtual_s=s.get("virtual_time_s"), engine=s.get("engine"),
               lane=(run.config or {}).get("lane"))
    for name, v in (s.get("metrics") or {}).items():
        row[f"m.{name}"] = _finite(v)
    for name, part in (("gap", s["staleness"]["update_gap"]),
                       ("lag", s["staleness"]["clock_lag"])):
        for k, v in _stats(part).items():
            row[f"{name}_{k}"] = v
    slow = [w["slowdown_realised"] for w in s["per_worker"] if "slowdown_realised" in w]
    row["slowdown_realised"] = max(slow) if slow else None
    row["wait_fraction"] = round(sum(s["wait_fraction"]) / max(len(s["wait_fraction"]), 1),
                                 4)
    if s.get("dssp_grants") is not None:        # DSSP: {extra iterations: waits granted}
        row["dssp_grants"] = s["dssp_grants"]
    row["curve"] = [[c["t"], c["updates"], _finite(c["loss"])] for c in s["loss_curve"]]
    return row


def _diverged(cell, key, mode, error) -> dict:
    return {"key": key, **_canon(cell), "mode": mode, "diverged": True,
            "error": str(error).splitlines()[0][:300], "final_loss": None}


def load(path) -> list:
    """The rows of a results file (a torn last line is skipped)."""
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue        # the line a SIGKILL cut short
    return rows


def _append(path, row):
    with open(path, "a") as f:
        f.write(json.dumps(row, allow_nan=False, default=float) + "\n")
        f.flush()
        os.fsync(f.fileno())


# --------------------------------------------------------------------------- sweep

def sweep(grid, *, base=None, out=None, mode="sim", progress=None) -> list:
    """Run every cell of ``grid`` (see the module docstring) not already in ``out``;
    returns all rows of the sweep (earlier ones from ``out`` included), in cell order.

    ``mode``: ``"sim"`` (default) or ``"live"`` for cells without a ``mode`` knob.
    ``out``: a ``.jsonl`` results file (appended; makes the sweep resumable), or None
    (rows only returned). ``progress``: a tqdm bar (None: when stderr is a terminal).
    """
    todo = cells(grid, base)
    plans = [(c, cell_key(c), *_kwargs(c, mode)) for c in todo]      # all checked first
    if any(m == "live" for _, _, m, _ in plans):
        check_main_guard("hogkit.sweep() with live cells")
    done = {}
    if out is not None:
        out = os.fspath(out)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        done = {r["key"]: r for r in load(out) if "key" in r}
    left = [p for p in plans if p[1] not in done]
    bar = _bar(progress, len(plans), len(plans) - len(left))
    try:
        for cell, key, m, kw in left:
            if bar is not None:
                bar.set_postfix_str(_short(cell), refresh=False)
            try:
                row = _row(cell, key, m, _run(m, kw))
            except (NonFiniteGradient, WorkerFailed) as e:
                if isinstance(e, WorkerFailed) and e.cause != _NONFINITE:
                    raise
                row = _diverged(cell, key, m, e)
            done[key] = row
            if out is not None:
                _append(out, row)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return [done[k] for _, k, _, _ in plans if k in done]


def lr_score(mean, diverged, lr):
    """The order :func:`tune` and the experiments rank learning rates by: fewer diverged
    seeds first, then the lower mean loss (None: every seed diverged), then the lower
    lr."""
    return (diverged, mean if mean is not None else math.inf, lr)


def _group_of(cell) -> str:
    return cell_key({k: v for k, v in cell.items() if k not in ("lr", "seed")})


def _lr_table(rows, y):
    """``{group: {lr: (mean, std, finished, runs)}}`` of a tuning's rows."""
    out = {}
    for r in rows:
        g = _group_of(json.loads(r["key"]))          # the cell as it was given
        out.setdefault(g, {}).setdefault(r["lr"], []).append(r.get(y))
    table = {}
    for g, per in out.items():
        table[g] = {}
        for lr, vals in per.items():
            xs = [float(v) for v in vals if v is not None and math.isfinite(float(v))]
            m, sd = mean_std(xs) if xs else (None, None)
            table[g][lr] = (m, sd, len(xs), len(vals))
    return table


def tune(grid, *, base=None, out=None, mode="sim", y="final_loss", factor=2.0, extend=3,
         progress=None) -> list:
    """Tune ``lr`` for every group of ``grid``'s cells (cells that differ only in
    ``lr`` and ``seed``), widening the lrs tried until the best is bracketed (see the
    module docstring). Every cell must have an ``lr`` (in the grid or ``base``); the
    lrs of a group start as its cells' lrs. Returns one dict per group, in the grid's
    order: its knobs (``cell``), the best ``lr`` with its ``mean``/``std`` of ``y`` over
    the seeds that finished, ``diverged`` and ``n`` seeds, every lr ``tried`` with its
    mean (None: all diverged), ``bracketed`` and, when not, the ``bound`` it hit.
    ``out`` keeps every run's row (resumable, as :func:`sweep`)."""
    if not (isinstance(factor, (int, float)) and factor > 1.0 and math.isfinite(factor)):
        raise InvalidArgument(f"factor={factor!r}; expected a number > 1 (each new lr is "
                              f"factor times past the edge; 2 is common)")
    if not (isinstance(extend, int) and not isinstance(extend, bool) and extend >= 0):
        raise InvalidArgument(f"extend={extend!r}; expected an int >= 0 (how many lrs "
                              f"may be added past each edge)")
    todo = cells(grid, base)
    if any("lr" not in c or not isinstance(c["lr"], (int, float)) for c in todo):
        raise InvalidArgument("tune needs a numeric lr in every cell: put lr in the grid "
                              "(e.g. {'lr': [0.01, 0.1]}) or in base")
    groups, seeds, added = {}, {}, {}
    for c in todo:
        g = _group_of(c)
        groups.setdefault(g, {k: v for k, v in c.items() if k not in ("lr", "seed")})
        seeds.setdefault(g, [])
        if c.get("seed") not in seeds[g]:
            seeds[g].append(c.get("seed"))
        added.setdefault(g, {"low": 0, "high": 0})
    rows = sweep(_explicit(todo), base=None, out=out, mode=mode, progress=progress)
    while True:
        table = _lr_table(rows, y)
        more = []
        for g in groups:
            per = table[g]
            best = _best_lr(per)
            lrs = sorted(per)
            for edge, at, nxt in (("low", lrs[0], lrs[0] / factor),
                                  ("high", lrs[-1], lrs[-1] * factor)):
                if best == at and added[g][edge] < extend:
                    if edge == "high" and per[at][2] == 0:
                        continue            # it diverged on every seed: higher will too
                    added[g][edge] += 1
                    more += [{**groups[g], "lr": _round_lr(nxt),
                              **({} if s is None else {"seed": s})} for s in seeds[g]]
        if not more:
            break
        rows += sweep(_explicit(more), base=None, out=out, mode=mode, progress=progress)
    return [_tuned_group(groups[g], table[g], len(seeds[g]), added[g], extend)
            for g in groups]


def _round_lr(lr):
    return float(f"{lr:.6g}")


def _explicit(cells_):
    """A grid whose cells are exactly ``cells_``."""
    return [{k: [v] for k, v in c.items()} for c in cells_]


def _best_lr(per):
    """The best lr of a group's ``{lr: (mean, std, finished, runs)}`` (:func:`lr_score`)."""
    return min(per, key=lambda lr: lr_score(per[lr][0], per[lr][3] - per[lr][2], lr))


def _tuned_group(cell, per, n, added, extend) -> dict:
    best = _best_lr(per)
    lrs = sorted(per)
    m, sd, fin, runs = per[best]
    bracketed = lrs[0] < best < lrs[-1]
    bound = (None if bracketed else "both" if len(lrs) == 1
             else "low" if best == lrs[0] else "high")
    return {"cell": cell, "lr": best, "mean": m, "std": sd, "diverged": runs - fin,
            "n": n, "tried": {lr: per[lr][0] for lr in lrs}, "bracketed": bracketed,
            "bound": bound, "extended": dict(added), "extend_limit": extend}


def _short(cell):
    return " ".join(f"{k}={v}" for k, v in cell.items() if not isinstance(v, (dict, list)))[:60]


def _bar(progress, total, initial):
    import sys
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return None
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, unit="run", desc="sweep", leave=False)


# --------------------------------------------------------------------------- analysis

def aggregate(rows, y, by) -> dict:
    """``{group: (mean, std, n)}`` of ``y`` over rows grouped by the knobs ``by`` (a
    tuple of names; the group is the tuple of their values); rows where ``y`` is
    missing or non-finite count in ``n`` only through ``diverged``."""
    groups = {}
    for r in rows:
        g = tuple(r.get(b) for b in by)
        groups.setdefault(g, []).append(r.get(y))
    out = {}
    for g, vals in groups.items():
        xs = [float(v) for v in vals if v is not None and math.isfinite(float(v))]
        if not xs:
            out[g] = (None, None, len(vals))
            continue
        out[g] = (*mean_std(xs), len(xs))
    return out


def mean_std(xs) -> tuple:
    """``(mean, sample standard deviation)`` of a non-empty sequence (std 0.0 for one
    value): the spread every table of seeds reports."""
    xs = [float(x) for x in xs]
    mean = sum(xs) / len(xs)
    std = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return mean, std


def plot(rows, x, y, *, line=None, path=None, ax=None, logx=False, logy=False,
         title=None):
    """``y`` against knob ``x``, one line per value of ``line``: the mean over the other
    knobs (seeds) with a ±1 std band. Writes ``path`` (PNG) when given; returns the
    axes."""
    import matplotlib
    if ax is None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 4))
    by = (line, x) if line else (x,)
    agg = aggregate(rows, y, by)
    lines = sorted({g[0] for g in agg}, key=str) if line else [None]
    for lv in lines:
        pts = sorted(((g[-1], v) for g, v in agg.items()
                      if (not line or g[0] == lv) and v[0] is not None),
                     key=lambda p: p[0])
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ms = [p[1][0] for p in pts]
        sd = [p[1][1] for p in pts]
        label = f"{line}={lv}" if line else None
        ax.plot(xs, ms, marker="o", label=label)
        ax.fill_between(xs, [m - s for m, s in zip(ms, sd)], [m + s for m, s in zip(ms, sd)],
                        alpha=0.2)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    if line:
        ax.legend(fontsize=8)
    if fig is not None and path is not None:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return ax
