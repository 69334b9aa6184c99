"""Stale-value tolerance of a recurrent network: update density × activation × lr.

Question (the stale-value tolerance study on RNNs that hogkit's density knob comes
from): how much of each update can a worker hold back, spatially (top-k or random
entries) or temporally (one update in k), before a recurrent network trains worse, and
how does that depend on the recurrent activation, the learning rate and whether the
unsent part is kept as a residual or dropped (a flag "since it changes the result")?

Setup: ``hogkit.sweep`` of ``hogkit.simulate`` runs (deterministic per seed): the
``rnn`` workload (a character-level Elman RNN in torch, hidden 64, embedding 32,
truncated BPTT over 16 characters) on generated order-2 Markov text (50,000
characters, known entropy rate), W = 8 virtual workers with log-normal step times,
1,000 updates per run, three seeds. Update density (``hogkit.rules.density``): spatial
``topk:d`` and ``random:d`` for d ∈ {0.5, 0.25, 0.1, 0.05} and temporal ``every:k``
(one update in k sent, density 1/k) for k ∈ {2, 4, 10, 20}; each with the unsent part
kept as a residual (error feedback) or dropped. Activation ∈ {sigmoid, tanh, relu};
lr ∈ {0.5, 1.0} as a factor of the study (not tuned away). Reported: validation
bits per character (``m.val_bpc``) after the budget, mean ± std over seeds, and
**d\\***: the lowest density of the ladder at which a filter still trains within 1 %
of the full-density run's bits/char at the same activation and lr, going down the
ladder from the top (the first level that is worse ends it; "none" if even the top
level is).

    python experiments/rnn_density.py [--quick] [--out docs/experiments/rnn_density]

Runs two simulation processes at a time (one per core). Writes ``cells-*.jsonl`` (one
resumable sweep table per activation and lr), ``results.json`` and
``rnn_density.png``; :func:`tables` renders the write-up's tables from results.json.
"""

from __future__ import annotations

import json
import os

import _common

CONFIG = {
    "options": {"text": "markov", "hidden": 64, "embed": 32, "bptt": 16, "chars": 50_000},
    "workers": 8,
    "steps": 1_000,
    "delays": "lognormal:1e-3:0.5",
    "seeds": [0, 1, 2],
    "activations": ["sigmoid", "tanh", "relu"],
    "lrs": [0.5, 1.0],
    "fractions": [0.5, 0.25, 0.1, 0.05],
    "every": [2, 4, 10, 20],
    "tolerance": 0.01,
    "processes": 2,
}
FILTERS = [(kind, unsent) for kind in ("topk", "random", "every")
           for unsent in ("residual", "dropped")]
#: the study again at W = 32 with three times the budget (issue 30: more staleness, and
#: more updates for sigmoid to learn in): top-k and every-k, residual and dropped, on a
#: shorter ladder; lr 0.25 and 0.5 (W = 32's mean gap is ~30: the W = 8 grid's top, 1,
#: left out); sigmoid (the slow learner) and tanh (every-k's worst case at W = 8)
SCALE = {**CONFIG, "workers": 32, "steps": 3_000, "lrs": [0.25, 0.5],
         "activations": ["sigmoid", "tanh"],
         "fractions": [0.5, 0.1, 0.05], "every": [2, 10, 20],
         "filters": [[k, u] for k in ("topk", "every") for u in ("residual", "dropped")],
         "prefix": "w32-"}
#: sigmoid with ten times the W = 8 budget (10,000 updates; issue 30: "a budget long
#: enough for sigmoid": a probe at lr 1 reached 2.662 bits/char there), at the sparsest
#: level of each filter
LONG = {**CONFIG, "steps": 10_000, "activations": ["sigmoid"], "lrs": [1.0],
        "fractions": [0.05], "every": [20],
        "filters": [[k, u] for k in ("topk", "every") for u in ("residual", "dropped")],
        "prefix": "long-"}
#: the extra studies, each with its own cells files and rows (``<key>_rows``)
STUDIES = ("scale", "long")
CONFIG["scale"] = SCALE
CONFIG["long"] = LONG
QUICK = {k: v for k, v in CONFIG.items() if k not in STUDIES}
QUICK.update({"steps": 200, "seeds": [0], "activations": ["tanh"], "lrs": [0.5],
              "fractions": [0.25], "every": [4],
              "options": {**CONFIG["options"], "chars": 10_000, "hidden": 16}})
QUICK["scale"] = {**QUICK, "workers": 16, "filters": [["topk", "residual"]],
                  "prefix": "w16-"}


def filters(config):
    """The (kind, unsent) filters a study runs (the W = 8 study: every one)."""
    return [tuple(f) for f in config.get("filters", FILTERS)]


def ladder(config, kind):
    """``[(density spec without the unsent suffix, density)]``, densest first."""
    if kind == "every":
        return [(f"every:{k}", 1.0 / k) for k in config["every"]]
    return [(f"{kind}:{d:g}", d) for d in config["fractions"]]


def parts(config):
    """One sweep per (activation, lr): ``[(file name, grid, base)]``."""
    out = []
    for act in config["activations"]:
        for lr in config["lrs"]:
            specs = [1.0] + [s + ("" if unsent == "residual" else ":dropped")
                             for kind, unsent in filters(config)
                             for s, _ in ladder(config, kind)]
            base = {"workload": "rnn", "workers": config["workers"],
                    "steps": config["steps"], "delays": config["delays"],
                    "o.activation": act, "lr": lr,
                    **{f"o.{k}": v for k, v in config["options"].items()}}
            out.append((f"cells-{config.get('prefix', '')}{act}-{lr:g}.jsonl",
                        {"density": specs, "seed": config["seeds"]}, base))
    return out


def run(config: dict, out_dir=None) -> dict:
    from hogkit.report import environment
    out_dir = out_dir or "."
    extra = [k for k in STUDIES if k in config]
    studies = [config] + [config[k] for k in extra]
    jobs, owner = [], []
    for k, cfg in enumerate(studies):
        for name, grid, base in parts(cfg):
            jobs.append((os.path.join(out_dir, name), grid, base))
            owner.append(k)
    rows = [[] for _ in studies]
    for k, got in zip(owner, _common.parallel_sweeps(jobs, config["processes"])):
        for r in got:
            row = _common.slim(r)
            row.pop("curve")             # the figures are end-of-budget metrics
            rows[k].append(row)
    env = environment()
    out = {"config": config, "rows": rows[0], "environment": _kept_environment(config,
                                                                             out_dir, env)}
    for k, key in enumerate(extra, 1):
        out[f"{key}_rows"] = rows[k]
        out[f"{key}_environment"] = env
    return out


def _kept_environment(config, out_dir, env):
    """The machine the W = 8 rows were made on: a rerun resumes them from the cells
    files, so where the previous results.json ran the same W = 8 study its machine is
    kept (the rerun test compares a rerun with the figure to 1e-6 on that processor
    only); else this one."""
    path = os.path.join(out_dir, "results.json")
    if not os.path.exists(path):
        return env
    with open(path) as f:
        old = json.load(f)
    same = ({k: v for k, v in old.get("config", {}).items() if k not in STUDIES}
            == {k: v for k, v in config.items() if k not in STUDIES})
    return old.get("environment", env) if same else env


def study(results, key):
    """Extra study ``key`` ("scale": W = 32; "long": sigmoid's long budget) as a results
    dict of its own (``None`` without one)."""
    if f"{key}_rows" not in results:
        return None
    return {"config": results["config"][key], "rows": results[f"{key}_rows"]}


# --------------------------------------------------------------------------- analysis

def _parse(spec):
    """``(kind, unsent, density)`` of a row's density spec (1.0: the full update)."""
    if spec in (1, 1.0, "1", "1.0"):
        return "full", None, 1.0
    bits = str(spec).split(":")
    unsent = "dropped" if bits[-1] == "dropped" else "residual"
    kind = bits[0]
    d = 1.0 / int(bits[1]) if kind == "every" else float(bits[1])
    return kind, unsent, d


def cells(results):
    """``{(activation, lr, kind, unsent, density): (mean, std, n)}`` of val bits/char."""
    from hogkit.sweeps import aggregate
    rows = []
    for r in results["rows"]:
        kind, unsent, d = _parse(r["density"])
        rows.append({**r, "_k": (r["o.activation"], r["lr"], kind, unsent, d)})
    return {k[0]: v for k, v in aggregate(rows, "m.val_bpc", ("_k",)).items()}


def d_star(results):
    """``{(activation, lr, kind, unsent): d* or None}`` (see the module docstring)."""
    cfg, c = results["config"], cells(results)
    out = {}
    for act in cfg["activations"]:
        for lr in cfg["lrs"]:
            base = c[(act, lr, "full", None, 1.0)][0]
            for kind, unsent in filters(cfg):
                best = None
                for _, d in ladder(cfg, kind):
                    m = c.get((act, lr, kind, unsent, d), (None,))[0]
                    if m is None or base is None or m > base * (1 + cfg["tolerance"]):
                        break
                    best = d
                out[(act, lr, kind, unsent)] = best
    return out


def _fmt_d(kind, d):
    if d is None:
        return "none"
    return f"every {round(1 / d)}" if kind == "every" else f"{d:g}"


def tables(results) -> str:
    text = _tables(results)
    big = study(results, "scale")
    if big is not None:
        cfg = big["config"]
        text += (f"\n\n**At W = {cfg['workers']}, {cfg['steps']:,} updates** (mean update "
                 f"gap {_mean_gap(big):.1f}):\n\n" + _tables(big))
    long = study(results, "long")
    if long is not None:
        cfg = long["config"]
        text += (f"\n\n**{', '.join(cfg['activations'])} with {cfg['steps']:,} updates** "
                 f"(W = {cfg['workers']}):\n\n" + _tables(long))
    return text


def _mean_gap(results):
    gaps = [r["gap_mean"] for r in results["rows"] if r.get("gap_mean") is not None]
    return sum(gaps) / len(gaps)


def _tables(results) -> str:
    cfg, c, ds = results["config"], cells(results), d_star(results)
    combos = [(a, lr) for a in cfg["activations"] for lr in cfg["lrs"]]
    head = "| | " + " | ".join(f"{a}, lr {lr:g}" for a, lr in combos) + " |"
    rule = "|---|" + "---|" * len(combos)

    def bpc(key):
        m = c.get(key)
        return "diverged" if m is None or m[0] is None else f"{m[0]:.3f} ± {m[1]:.3f}"

    lines = ["Validation bits/char with the full update (the baseline each d* is measured "
             "against):", "", head, rule,
             "| full update | " + " | ".join(bpc((a, lr, "full", None, 1.0))
                                             for a, lr in combos) + " |", "",
             f"d*: the lowest density still within {cfg['tolerance']:.0%} of the baseline "
             "(ladder " + ", ".join(f"{d:g}" for d in cfg["fractions"]) + " for top-k and "
             "random; every " + ", ".join(str(k) for k in cfg["every"]) + " steps):", "",
             head, rule]
    for kind, unsent in filters(cfg):
        lines.append(f"| {kind}, {unsent} | " + " | ".join(
            _fmt_d(kind, ds[(a, lr, kind, unsent)]) for a, lr in combos) + " |")
    lo = cfg["fractions"][-1]
    k_lo = cfg["every"][-1]
    lines += ["", f"Validation bits/char at the sparsest level (d = {lo:g}; every {k_lo}):",
              "", head, rule]
    for kind, unsent in filters(cfg):
        d = 1.0 / k_lo if kind == "every" else lo
        lines.append(f"| {kind}, {unsent} | " + " | ".join(
            bpc((a, lr, kind, unsent, d)) for a, lr in combos) + " |")
    return "\n".join(lines)


def plot(results: dict, out_dir: str) -> str:
    """``rnn_density.png`` (W = 8), and ``rnn_density_w32.png`` for the W = 32 study
    (the long sigmoid study has one level a filter: its table says it all)."""
    big = study(results, "scale")
    if big is not None:
        _plot(big, out_dir, f"rnn_density_w{big['config']['workers']}.png")
    return _plot(results, out_dir, "rnn_density.png")


def _plot(results, out_dir, name):
    plt = _common.pyplot()
    cfg, c = results["config"], cells(results)
    acts, lrs = cfg["activations"], cfg["lrs"]
    fig, axes = plt.subplots(len(lrs), len(acts), figsize=(4.6 * len(acts), 3.6 * len(lrs)),
                             squeeze=False, sharey=True)
    # sharey with log y: one range for all panels, the bits/char floor visible in each
    for i, lr in enumerate(lrs):
        for j, act in enumerate(acts):
            ax = axes[i][j]
            base = c[(act, lr, "full", None, 1.0)]
            if base[0] is not None:
                ax.axhline(base[0], color="black", lw=1, label="full update")
                ax.axhspan(base[0], base[0] * (1 + cfg["tolerance"]), color="gray",
                           alpha=0.2)
            for kind, unsent in filters(cfg):
                colour = f"C{FILTERS.index((kind, unsent)) // 2}"   # one per kind
                pts = [(d, c.get((act, lr, kind, unsent, d))) for _, d in ladder(cfg, kind)]
                pts = [(d, m) for d, m in pts if m is not None and m[0] is not None]
                if not pts:
                    continue
                xs, ms = zip(*pts)
                ax.errorbar(xs, [m[0] for m in ms], yerr=[m[1] for m in ms], marker="o",
                            ms=3, capsize=2, color=colour,
                            ls="-" if unsent == "residual" else "--",
                            label=f"{kind}, {unsent}")
            ax.set_xscale("log")
            ax.set_yscale("log")             # a blown-up every-k residual is 100× the rest
            ticks = sorted({d for kind, _ in filters(cfg) for _, d in ladder(cfg, kind)})
            ax.set_xticks(ticks, [f"{d:.2g}" for d in ticks])
            ax.minorticks_off()
            ax.invert_xaxis()
            ax.set_title(f"{act}, lr {lr:g}", fontsize=9)
            ax.set_xlabel("density (fraction sent)")
            if j == 0:
                ax.set_ylabel("validation bits/char")
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"rnn, W={cfg['workers']} simulated, {cfg['steps']:,} updates, mean ± std "
                 f"over {len(cfg['seeds'])} seeds (band: within {cfg['tolerance']:.0%})",
                 fontsize=10)
    return _common.save(fig, out_dir, name)


def main(argv=None):
    return _common.main(__doc__, run, plot, CONFIG, QUICK, "docs/experiments/rnn_density",
                        argv)


if __name__ == "__main__":
    main()
