"""Staleness rules at W = 64 with every lr bracketed and the rules' own knobs tried.

``staleness_rules`` tuned every rule on one three-point lr grid per workload; at W = 64
most tuned cells sat at an edge of it, staleness-aware's grid was SGD's although it
divides the lr by the staleness (~62), and constant DC-ASGD ran only at λ = 0.04. This
re-asks its W = 64 question fairly, on the two workloads the simulator's fused engine
runs fast (``mf``, ``logreg``):

- every (workload, rule) is tuned with :func:`hogkit.sweeps.tune`: lrs are added past
  the edge holding the best (twice as far, at most ``extend`` per edge) until a worse
  lr lies on both sides, or the table says which bound it hit;
- staleness-aware starts from SGD's lrs times the staleness it divides by (``scale``);
- constant DC-ASGD runs at λ in ``lambdas`` (the paper's 0.04 among them), each tuned.

Same simulation as ``staleness_rules`` (20,000 updates, log-normal step times, seeds 0,
1, 2, Async), so its SGD cells at the old grid's lrs are the same runs.

    python experiments/fair_rules.py [--quick] [--out docs/experiments/fair_rules]

Writes ``cells.jsonl`` (resumable), ``results.json`` and ``fair_rules.png``;
:func:`tables` renders the write-up's tables from results.json.
"""

from __future__ import annotations

import os

import _common

CONFIG = {
    # workload -> SGD's starting lrs, or a dict with "lrs" and optional "steps", workload
    # "options", and overrides of "lambdas" / "momentum" (the mlp and the rnn run the
    # rules of the staleness_rules verdicts, the λ study and momentum staying on mf and
    # logreg)
    "workloads": {
        "mf": [0.05, 0.1], "logreg": [0.1, 0.2],
        "mlp": {"lrs": [0.05, 0.1], "steps": 4_000, "lambdas": [0.04], "momentum": None},
        "rnn": {"lrs": [0.25, 0.5], "steps": 1_000, "lambdas": [0.04], "momentum": None,
                "options": {"text": "markov", "hidden": 64, "embed": 32, "bptt": 16,
                            "chars": 50_000}},
    },
    "workers": 64,
    "steps": 20_000,
    "delays": "lognormal:1e-3:0.5",
    "seeds": [0, 1, 2],
    "scale": 64,                    # staleness-aware's lrs start at SGD's x this
    "lambdas": [0.01, 0.04, 0.2, 1.0],
    "extend": 6,
    "momentum": 0.9,                # GA + momentum: per worker and shared (a server's)
}
QUICK = {**CONFIG, "workloads": {"mf": [0.05, 0.1]}, "workers": 16, "steps": 4_000,
         "seeds": [0], "lambdas": [0.04], "extend": 1, "momentum": None}


def spec(config, wl) -> dict:
    """A workload's entry as a dict: lrs, steps, options, and the config it tunes its
    rules under (``lambdas``, ``momentum`` overridden where it says)."""
    x = _common.workload_spec(config, wl)
    own = {k: x.pop(k) for k in ("lambdas", "momentum") if k in x}
    return {**x, "config": {**config, **own}}


def rules(config) -> dict:
    """name -> (sweep rule string, lr multiplier of the starting grid, other knobs)."""
    out = {"SGD": ("sgd", 1.0, {}),
           f"staleness-aware (lrs x {config['scale']})": ("staleness-aware",
                                                         float(config["scale"]), {}),
           "DC-ASGD (adaptive)": ("dc-asgd-adaptive", 1.0, {}),
           "Gap-Aware": ("gap-aware", 1.0, {})}
    for lam in config["lambdas"]:
        out[f"DC-ASGD (constant, λ = {lam:g})"] = (f"dc-asgd:{lam:g}", 1.0, {})
    mu = config.get("momentum")
    if mu:                              # GA + momentum: per worker, or the server's
        out[f"GA + momentum {mu:g} (per worker)"] = ("gap-aware", 1.0, {"momentum": mu})
        out[f"GA + momentum {mu:g} (shared)"] = ("gap-aware", 1.0,
                                                 {"momentum": mu, "rule_state": "shared"})
    return out


def run(config: dict, out_dir=None) -> dict:
    from hogkit.report import environment
    from hogkit.sweeps import load, tune
    out_dir = out_dir or "."
    path = os.path.join(out_dir, "cells.jsonl")
    groups = []
    for wl in config["workloads"]:
        sp = spec(config, wl)
        base = {"workers": config["workers"], "steps": sp["steps"],
                "delays": config["delays"],
                **{f"o.{k}": v for k, v in sp["options"].items()}}
        for name, (rule, x, extra) in rules(sp["config"]).items():
            got = tune({"workload": [wl], "rule": [rule],
                        "lr": [round(lr * x, 6) for lr in sp["lrs"]],
                        "seed": config["seeds"], **{k: [v] for k, v in extra.items()}},
                       base=base, out=path, mode="sim", extend=config["extend"],
                       progress=True)
            groups += [{**g, "name": name,
                        "tried": [[lr, m] for lr, m in g["tried"].items()]} for g in got]
    frozen = _frozen(config, path) if config.get("momentum") else []
    return {"config": config, "tuned": groups, "frozen": frozen,
            "rows": [_common.slim(r) for r in load(path)], "environment": environment()}


def _frozen(config, path) -> list:
    """Barkai et al.'s no-retuning claim: GA + momentum's lr tuned at W = 1, then run
    frozen at W = ``workers``, per worker and shared; per workload, the lr and each
    variant's mean ± std (and diverged seeds) at both W."""
    from hogkit.sweeps import aggregate, sweep, tune
    mu, out = config["momentum"], []
    base = {"steps": config["steps"], "delays": config["delays"]}
    for wl in config["workloads"]:
        sp = spec(config, wl)
        if not sp["config"].get("momentum"):
            continue
        lrs = sp["lrs"]
        pins = _common.pinned(wl, rule=False)
        g, = tune({"workload": [wl], **pins, "rule": ["gap-aware"], "momentum": [mu],
                   "lr": lrs, "seed": config["seeds"]}, base={**base, "workers": 1}, out=path,
                  mode="sim", extend=config["extend"], progress=True)
        item = {"workload": wl, "lr": g["lr"], "bracketed": g["bracketed"],
                "bound": g.get("bound"), "w1": [g["mean"], g["std"], g["diverged"]]}
        for state in ("worker", "shared"):
            rows = sweep({"workload": [wl], **pins, "rule": ["gap-aware"], "momentum": [mu],
                          "lr": [g["lr"]], "seed": config["seeds"],
                          **({"rule_state": [state]} if state == "shared" else {})},
                         base={**base, "workers": config["workers"]}, out=path,
                         mode="sim", progress=True)
            agg = aggregate(rows, "final_loss", ("lr",))
            mean, std, n = agg.get((g["lr"],), (None, None, 0))
            item[state] = [mean, std, len(config["seeds"]) - (0 if mean is None else n)]
        out.append(item)
    return out


def _cell(g):
    if g["mean"] is None:
        return f"diverged ({g['n']}/{g['n']})"
    text = f"{g['mean']:.4f} ± {g['std']:.4f}"
    return text + (f", {g['diverged']}/{g['n']} diverged" if g["diverged"] else "")


def _lrs(g):
    return ", ".join(f"{lr:g}" for lr, _ in sorted(g["tried"]))


def tables(results) -> str:
    cfg = results["config"]
    lines = []
    for wl in cfg["workloads"]:
        rows = [g for g in results["tuned"] if g["cell"]["workload"] == wl]
        sgd = next(g for g in rows if g["name"] == "SGD")
        lines += [f"**{wl}** (final training loss after {spec(cfg, wl)['steps']:,} "
                  f"simulated updates, "
                  f"W = {cfg['workers']}, {len(cfg['seeds'])} seeds)", "",
                  "| rule | tuned lr | bracketed | loss | vs SGD | lrs tried |",
                  "|---|---|---|---|---|---|"]
        for g in rows:
            if g["mean"] is None or sgd["mean"] is None:
                vs = "–"
            elif abs(g["mean"] - sgd["mean"]) <= g["std"] + sgd["std"]:
                vs = "within spread"
            else:
                vs = "better" if g["mean"] < sgd["mean"] else "worse"
            mark = "yes" if g["bracketed"] else f"no ({g['bound']} bound)"
            lines.append(f"| {g['name']} | {g['lr']:g} | {mark} | {_cell(g)} | "
                         f"{vs if g is not sgd else '–'} | {_lrs(g)} |")
        lines.append("")
    lines += _frozen_table(results)
    return "\n".join(lines).rstrip()


def _msd(x):
    mean, std, div = x
    if mean is None:
        return "diverged (all seeds)"
    return f"{mean:.4f} ± {std:.4f}" + (f", {div} diverged" if div else "")


def _frozen_table(results) -> list:
    """The no-retuning table: GA + momentum's lr tuned at W = 1, frozen at W."""
    frozen = results.get("frozen") or []
    if not frozen:
        return []
    cfg = results["config"]
    mu = cfg["momentum"]
    by = {(g["cell"]["workload"], g["name"]): g for g in results["tuned"]}
    lines = [f"**GA + momentum {mu:g}, lr tuned at W = 1 and frozen** (final training loss "
             f"after {cfg['steps']:,} simulated updates, {len(cfg['seeds'])} seeds; the last "
             f"column is the same variant at its own tuned lr at W = {cfg['workers']})", "",
             f"| workload | lr (tuned at W = 1) | loss at W = 1 | momentum buffer | "
             f"loss at W = {cfg['workers']}, frozen lr | at W = {cfg['workers']}, "
             f"retuned (lr) |", "|---|---|---|---|---|---|"]
    for f in frozen:
        mark = "" if f["bracketed"] else f", {f['bound']} bound"
        for state, label in (("worker", "per worker"), ("shared", "shared")):
            g = by.get((f["workload"], f"GA + momentum {mu:g} ({label})"))
            own = "–" if g is None else f"{_cell(g)} ({g['lr']:g})"
            lines.append(f"| {f['workload']} | {f['lr']:g}{mark} | {_msd(f['w1'])} | "
                         f"{label} | {_msd(f[state])} | {own} |")
    return lines


def highlight(results) -> str:
    """The README's line on this experiment, rendered from the results (a test checks
    the README carries it word for word)."""
    by = {(g["cell"]["workload"], g["name"]): g for g in results["tuned"]}

    def cell(wl, name):
        g = by[(wl, name)]
        edge = "" if g["bracketed"] else f", at its {g['bound']} bound"
        return f"{g['mean']:.4f} ± {g['std']:.4f} (lr {g['lr']:g}{edge})"
    return (f"with every lr bracketed at W = {results['config']['workers']}, on logreg "
            f"Gap-Aware reaches {cell('logreg', 'Gap-Aware')} and adaptive DC-ASGD "
            f"{cell('logreg', 'DC-ASGD (adaptive)')} against plain SGD's "
            f"{cell('logreg', 'SGD')}; on mf plain SGD's {cell('mf', 'SGD')} stays best.")


def plot(results: dict, out_dir: str) -> str:
    """Mean final loss against lr for every rule (one panel per workload): the
    brackets the tuning found."""
    plt = _common.pyplot()
    cfg = results["config"]
    fig, axes = plt.subplots(1, len(cfg["workloads"]),
                             figsize=(5.5 * len(cfg["workloads"]), 4), squeeze=False)
    for ax, wl in zip(axes.flat, cfg["workloads"]):
        for i, g in enumerate(g for g in results["tuned"] if g["cell"]["workload"] == wl):
            pts = [(lr, m) for lr, m in sorted(g["tried"]) if m is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", ms=3, lw=1.0, color=f"C{i % 10}",
                        ls="-" if i < 10 else "--", label=g["name"])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sgd = next(g for g in results["tuned"] if g["cell"]["workload"] == wl
                   and g["name"] == "SGD")
        low = min((m for g in results["tuned"] if g["cell"]["workload"] == wl
                   for _, m in g["tried"] if m is not None), default=None)
        if sgd["mean"] is not None and low is not None:   # a diverging lr's loss
            ax.set_ylim(0.7 * low, 20 * sgd["mean"])       # would flatten the rest
        ax.set_xlabel("lr")
        ax.set_ylabel("mean final training loss (3 seeds)")
        ax.set_title(f"{wl}: W = {cfg['workers']}, simulated", fontsize=9)
        ax.legend(fontsize=6)
        ax.grid(True, alpha=0.3)
    return _common.save(fig, out_dir, "fair_rules.png")


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/fair_rules",
                        argv)


if __name__ == "__main__":
    main()
