"""``hogkit`` command line: a thin layer over the Python API.

    hogkit run     train with real worker processes (default: matrix factorisation, 2 workers)
    hogkit sim     the same run in virtual time, with any number of virtual workers
    hogkit bench   benchmark scenarios (kernels, scaling, instrumentation)
    hogkit report  re-draw plots and print the summary of a results folder
    hogkit predict predict with a `run --data` model
    hogkit doctor / sweep   check this machine / run a grid of runs

Exit codes: :data:`EXIT_CODES` (also in ``hogkit --help`` and the README).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import textwrap
import time
import warnings

from hogkit import workloads
from hogkit.engine.plan import make_plan
from hogkit.engine.runtime import train
from hogkit.engine.settings import Engine, Outputs, Workers
from hogkit.errors import EngineNotice, InvalidArgument
from hogkit.parse import (parse_batch, parse_density, parse_policy, parse_rule,
                          parse_stragglers, rule_names)
from hogkit.policy import spellings
from hogkit.state.resume import CHECKPOINT
from hogkit.state.worker_state import FILE as WORKER_STATE_FILE

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
#: SIGTERM's exit status (128 + 15, the shell's convention, as SIGINT's 130 is 128 + 2)
EXIT_TERMINATED = 143
#: every exit status and what it means: the one table (``hogkit --help``, the README's)
EXIT_CODES = (
    (EXIT_OK, "done"),
    (EXIT_FAILED, "the run failed (a worker died or raised, a non-finite gradient, a "
                  "results file could not be written, a damaged checkpoint, a cluster "
                  "node died; a final checkpoint and the summary say how it ended) or "
                  "this machine cannot run it (limits, /dev/shm too small for the "
                  "planned stores: checked before anything is built where the workload "
                  "knows its size, and before the kernels compile)"),
    (EXIT_USAGE, "bad usage: a flag, a value, a data file's line, an out folder that "
                 "holds a run; nothing was trained"),
    (EXIT_INTERRUPTED, "interrupted by SIGINT (Ctrl-C); a final checkpoint is written"),
    (EXIT_TERMINATED, "terminated by SIGTERM (128 + 15); a final checkpoint is written"),
)


def _exit_for(signum) -> int:
    """128 + the signal that interrupted the command: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(signum) if signum else EXIT_INTERRUPTED


BENCH_SCENARIOS = ("kernels", "peers", "lane", "scaling", "dense", "instrumentation",
                   "policies", "simulate", "rules", "own_loop", "p3", "soak", "ray",
                   "coldstart", "explore", "rowvec")


def _positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be >= 1")
    return v


def _positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{v} must be > 0")
    return v


def _add_training_options(p):
    p.add_argument("--workload", default="mf", choices=_workload_names(),
                   help="training problem (default: mf, generated matrix factorisation)")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a workload setting, e.g. -o activation=relu -o hidden=256 for "
                        "rnn (repeatable; see hogkit.workloads)")
    p.add_argument("--workers", type=_positive_int, default=2, help="worker processes")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--steps", type=_positive_int, default=None,
                   help="total iterations over all workers (default: the workload's)")
    g.add_argument("--seconds", type=_positive_float, default=None,
                   help="wall-time budget in seconds (default: none; without --steps "
                        "either, the workload's steps)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the data, the initial model and the sampling")
    p.add_argument("--policy", default="async",
                   help=f"consistency policy: {spellings()} (default async)")
    p.add_argument("--rule", default=None, choices=rule_names(),
                   help="update rule (default: the workload's own: mf's is adagrad-rowwise, "
                        "logreg's sgd)")
    p.add_argument("--lr", type=_positive_float, default=None,
                   help="learning rate of the rule (default: the workload's; with no "
                        "--rule, the workload's rule at this lr)")
    p.add_argument("--momentum", type=float, default=0.0,
                   help="momentum of sgd, staleness-aware or gap-aware")
    p.add_argument("--density", default=None, metavar="DENSITY",
                   help="apply a part of each update, keep the rest as residual: a "
                        "fraction F (top-k), topk:F, random:F or every:K (every K-th "
                        "step), with :dropped appended for no residual (default: whole updates)")
    p.add_argument("--batch", default=None,
                   help="samples per worker per step (an int), or shares of a global batch "
                        "B: fixed[:B] (even) | adaptive[:B[:last|ema|narx]] (LB-BSP) | "
                        "epoch[:B] (DBS) (default: the workload's)")
    p.add_argument("--straggler", action="append", default=[], metavar="RANK:FACTOR",
                   help="slow worker RANK down by FACTOR; RANK:load:AMP:PERIOD for a "
                        "time-varying slowdown, RANK:pauses:PROB:SECONDS for random "
                        "pauses (repeatable; default: none)")
    p.add_argument("--nonfinite", default="raise", choices=("raise", "skip"))
    p.add_argument("--replication", default="shared", metavar="MODE",
                   help="where the workers write: shared (one copy: Hogwild!), worker or "
                        "worker:K (a replica per worker, its change added to the shared "
                        "copy every K steps, 16 by default; async only), auto (replicas "
                        "where two workers' steps both write 15%% or more of the model's "
                        "cache lines)")
    p.add_argument("--shards", type=_positive_int, default=1,
                   help="per-shard staleness: count a sparse update's gap only over "
                        "others' updates to the same row ranges (default 1: global)")
    p.add_argument("--data", default=None, metavar="FILE",
                   help="train on your data: mf reads `user item rating` lines (LIBMF's "
                        "format, 0-based ids; or a CSV with a header), logreg an "
                        "svmlight/libsvm file (default: generated data)")
    p.add_argument("--test-fraction", type=float, default=None, metavar="F",
                   help="hold out this share of --data for test metrics in the summary "
                        "(default: none)")
    p.add_argument("--out", default=None,
                   help="results folder (default: a fresh runs/<timestamp>)")
    p.add_argument("--no-progress", action="store_true",
                   help="no stage lines and no progress bar")


def _workload_names():
    from hogkit.workloads import NAMES
    return NAMES


def parse_options(items) -> dict:
    """``["KEY=VALUE", ...]`` -> ``{key: value}``: ints, floats, true/false and none
    are converted, anything else stays a string."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise InvalidArgument(f"workload option {item!r} is not KEY=VALUE (e.g. "
                                  f"-o hidden=256)")
        out[key] = _option_value(value)
    return out


def _option_value(text):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class _Help(argparse.RawDescriptionHelpFormatter):
    """argparse's help with each option's default appended, where its help does not
    say it already and the default is a value (not None or off)."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if (not action.option_strings or "default" in text or d is None or d is False
                or d is argparse.SUPPRESS or d == []):
            return text
        return text + " (default: %(default)s)"


def build_parser():
    from importlib.metadata import version
    parser = argparse.ArgumentParser(
        prog="hogkit", description="Lock-free, staleness-aware training on one machine.",
        formatter_class=_Help, epilog="exit codes:\n" + "\n".join(
            textwrap.fill(text, 79, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7)
            for code, text in EXIT_CODES))
    parser.add_argument("--version", action="version", version=f"hogkit {version('hogkit')}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_run, _add_sim, _add_bench, _add_doctor, _add_sweep, _add_report,
                _add_predict):
        add(sub)
    for p in sub.choices.values():
        p.formatter_class = _Help
    return parser


def _add_run(sub):
    run = sub.add_parser("run", help="train with real worker processes")
    _add_training_options(run)
    run.add_argument("--events", default="sampled", choices=("sampled", "all", "none"),
                     help="which update events events.jsonl keeps: sampled (default, at "
                          "most 400/s), all, none; the histograms count every update")
    run.add_argument("--checkpoint-every", type=_positive_float, default=None,
                     metavar="SECONDS", help="fuzzy checkpoint of the parameters and the "
                                             "run's state every SECONDS (default 60)")
    run.add_argument("--on-failure", default="stop", choices=("stop", "restart"),
                     help="a worker that dies: stop the run (default) or restart it")
    run.add_argument("--max-restarts", type=int, default=3,
                     help="restarts allowed in the run with --on-failure restart (default 3)")
    run.add_argument("--resume", default=None, metavar="DIR",
                     help="go on with the run in DIR from its checkpoint (its command "
                          "line is reused; --steps/--seconds, if given, set the whole "
                          "run's budget)")
    run.add_argument("--overwrite", action="store_true",
                     help="replace the run already in --out (default: refuse it)")
    run.add_argument("--engine", default="auto", choices=("auto", "compiled", "python"),
                     help="step engine: auto (compiled where the knobs allow, else Python "
                          "with a notice), compiled (an error where it cannot run), python")
    run.add_argument("--lane", default="auto", choices=("auto", "batch", "sample"),
                     help="step lane: sample (per-sample Hogwild!: each sample's update "
                          "applied at once, compiled engine), batch (the exact minibatch "
                          "step) or auto (the workload's default where the knobs allow; "
                          "default)")
    _add_cluster_options(run)


def _add_cluster_options(run):
    ray = run.add_argument_group("cluster (--backend ray; pip install -e '.[ray]')")
    ray.add_argument("--backend", default="local", choices=("local", "ray"),
                     help="local (this machine's shared memory, default) or ray: --nodes "
                          "nodes of --workers workers each")
    ray.add_argument("--nodes", type=_positive_int, default=1, help="nodes (Ray actors)")
    ray.add_argument("--address", default=None,
                     help='Ray cluster to join: "auto" (after `ray start --head`) or '
                          '"ray://HOST:PORT"; default: start a local instance for the run')
    ray.add_argument("--servers", type=_positive_int, default=1,
                     help="parameter-shard actors (default 1)")
    ray.add_argument("--sync-every", type=_positive_int, default=1, metavar="ITERATIONS",
                     help="node-clock iterations between exchanges (default 1: as often "
                          "as a round trip allows)")
    ray.add_argument("--push-fraction", type=_positive_float, default=1.0, metavar="F",
                     help="send the largest F of each delta's entries, the rest later")
    ray.add_argument("--backlog", type=int, default=None, metavar="ITERATIONS",
                     help="Async only: a node runs at most this far ahead of its last "
                          "exchange")
    ray.add_argument("--schedule", default=None, metavar="SCHEDULE",
                     help="cut each exchange into messages: fifo, slicing:N, priority, "
                          "p3:N (N parameters a slice; priority and p3 send the input "
                          "side first); default: one message per shard")


def _add_sim(sub):
    sim = sub.add_parser("sim", aliases=["simulate"],
                         help="simulate the run in virtual time (deterministic; "
                              "workers may far exceed the cores)")
    _add_training_options(sim)
    sim.add_argument(
        "--delays", default="constant:1e-3",
        help="virtual compute time per step: constant:S | lognormal:MEDIAN:SIGMA, plus "
             "straggler:RANK:FACTOR, pauses:PROB:SECONDS, load:AMPLITUDE:PERIOD, joined "
             "by commas (default constant:1e-3); --seconds is then virtual time")
    sim.add_argument("--engine", default="auto",
                     choices=("auto", "compiled", "fused", "python"),
                     help="event loop: the compiled step core in it where supported "
                          "(auto), compiled (fused, its old name: the same), python")


def _add_bench(sub):
    bench = sub.add_parser("bench", help="run benchmark scenarios",
                           epilog="scenarios:\n" + "\n".join(
                               f"  {n:<16}{t}" for n, t in _scenario_lines().items())
                           + "\nResults and their commands: benchmarks/RESULTS.md")
    bench.add_argument("scenario", nargs="?", default="kernels", choices=BENCH_SCENARIOS,
                       help="which scenario (listed below)")
    bench.add_argument("--quick", action="store_true", help="small sizes, a few rounds")
    bench.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                       help="scaling, dense: measure 1, 2, 4, ... N workers (default: "
                            "the cores, at most 2)")
    bench.add_argument("--json", default=None, metavar="FILE",
                       help="write raw figures here (default: not written)")
    bench.add_argument("--workload", default=None, choices=_workload_names(),
                       help="the workload, for scenarios that take one (ray)")
    bench.add_argument("--only", default=None, metavar="SECTIONS",
                       help="a comma-separated part of a scenario, for those that have "
                            "parts (peers: mf,logreg,mlp; dense: target, the time to a "
                            "loss target at bracketed lrs, or replication, shared against "
                            "per-worker replicas on five workloads)")
    bench.add_argument("--presets", default=None, metavar="NAMES",
                       help="comma-separated mf presets, for scenarios that take them "
                            "(peers, lane; default: default,large)")


def _scenario_lines() -> dict:
    """Each bench scenario's one-line description: its module docstring's first
    sentence, read from the source (importing a scenario may import torch)."""
    from importlib.util import find_spec
    spec = find_spec("hogkit.benchmarks")
    where = list(spec.submodule_search_locations or ()) if spec else []
    out = {}
    for name in BENCH_SCENARIOS:
        text = ""
        for d in where:
            path = os.path.join(d, f"{name}.py")
            if os.path.exists(path):
                with open(path) as f:
                    m = re.search(r'"""(.*?)(?:\.\s|""")', f.read(), re.S)
                text = " ".join(m.group(1).split()) if m else ""
                break
        out[name] = re.sub(rf"^Scenario ``{name}``: ", "", text).replace("``", "")
    return out


def _add_doctor(sub):
    doc = sub.add_parser("doctor", help="check this machine: shared memory, limits, cores, "
                                        "start method, torch build, numba cache, a smoke run")
    doc.add_argument("--workers", type=_positive_int, default=2,
                     help="the worker count to check limits and cores for (default 2)")
    doc.add_argument("--no-smoke", action="store_true", help="skip the 1-second smoke run")
    doc.add_argument("--workload", default=None, choices=_workload_names(),
                     help="check /dev/shm against this workload's planned stores (built "
                          "as a run builds them)")
    doc.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                     help="a setting of --workload, as for run (repeatable)")


def _add_sweep(sub):
    sw = sub.add_parser("sweep", help="run a grid of runs (live or simulated) into one "
                                      "results table; resumable")
    sw.add_argument("--grid", action="append", default=[], metavar="KNOB=V1,V2,...",
                    help="a knob and its values (repeatable: every combination), e.g. "
                         "--grid workers=1,2,4 --grid rule=sgd,dc-asgd --grid seed=0,1,2")
    sw.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                    help="a knob every cell shares, e.g. --set workload=logreg --set "
                         "steps=20000 --set o.preset=hot (see hogkit.sweep for the knobs)")
    sw.add_argument("--mode", default="sim", choices=("sim", "live"),
                    help="simulated (default, virtual time) or live runs")
    sw.add_argument("--out", required=True, metavar="FILE",
                    help="results table (.jsonl, one row per run), appended: cells "
                         "already in it are skipped")
    sw.add_argument("--plot", default=None, metavar="X:Y[:LINE]",
                    help="also draw Y against knob X, one line per LINE (mean and std "
                         "over the rest) into FILE's .png")
    sw.add_argument("--tune", action="store_true",
                    help="tune lr: for every group of cells that differ only in lr and "
                         "seed, add lrs past an edge while the best sits there, until it "
                         "is bracketed (or --tune-extend lrs were added at that edge)")
    sw.add_argument("--tune-factor", type=float, default=2.0, metavar="F",
                    help="with --tune: each added lr is F times past the edge (2)")
    sw.add_argument("--tune-extend", type=int, default=3, metavar="N",
                    help="with --tune: at most N lrs added past each edge (3)")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_report(sub):
    rep = sub.add_parser("report", help="print a results folder's summary and re-draw plots")
    rep.add_argument("folder")


def _add_predict(sub):
    pr = sub.add_parser("predict", help="predict with a trained model: a `run --data` "
                                        "results folder and a file in its data's format")
    pr.add_argument("folder", help="results folder of `hogkit run --data ...`")
    pr.add_argument("file", help="mf: `user item [rating]` lines; logreg: svmlight")
    pr.add_argument("--out", default=None, metavar="FILE",
                    help="write the predictions here, one per line (default: stdout)")


def _default_out():
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join("runs", stamp)
    n = 1
    while os.path.exists(path):
        n += 1
        path = os.path.join("runs", f"{stamp}-{n}")
    return path


def _fmt_stats(s):
    """A staleness part in one line; a percentile that is only a lower bound (it fell
    into the histogram's overflow bin) is shown with ">=" (never as if exact)."""
    low = set(s.get("lower_bounds", ()))
    ps = "  ".join(f"{k} {'>=' if k in low else ''}{s[k]}" for k in ("p50", "p99", "p999")
                   if k in s)
    return f"mean {s['mean']:.2f}  {ps}  max {s['max']}  (n={s['count']})"


def _fmt_per_worker(values, most=8):
    """A per-worker list in one line: every value up to ``most`` workers, past that the
    mean and the extremes with their ranks."""
    if not values:
        return "-"
    if len(values) <= most:
        return ", ".join(f"{v:.3f}" for v in values)
    lo = min(range(len(values)), key=values.__getitem__)
    hi = max(range(len(values)), key=values.__getitem__)
    mean = sum(values) / len(values)
    return (f"mean {mean:.3f}, min {values[lo]:.3f} (worker {lo}), max {values[hi]:.3f} "
            f"(worker {hi}) over {len(values)} workers")


def _fmt_rule(rule):
    """``AdaGrad lr 0.2 (rowwise, initial_accumulator_value 1)``: the name, the lr, and
    the settings that are on (a rule not stored as a dict: its text)."""
    if not isinstance(rule, dict):
        return str(rule)
    rest = [k if v is True else f"{k} {v:g}" for k, v in rule.items()
            if k not in ("name", "lr", "eps") and v not in (None, False, 0, 0.0)
            and isinstance(v, (bool, int, float))]
    lr = rule.get("lr")
    return (f"{rule.get('name')}" + (f" lr {lr:g}" if isinstance(lr, (int, float)) else "")
            + (f" ({', '.join(rest)})" if rest else ""))


def print_summary(summary, out=None):
    out = sys.stdout if out is None else out
    cfg = summary["config"]
    sim = " (simulated)" if summary.get("simulated") else ""
    engine = f", {summary['engine']} engine" if summary.get("engine") else ""
    if cfg.get("lane") == "sample" and not sim:
        engine += f", per-sample lane ({cfg.get('batch')} samples a step)"
    rep = cfg.get("replication") or {}
    if rep.get("mode") == "worker":
        engine += f", a replica per worker merged every {rep.get('merge_every')} steps"
    if rep.get("chosen_by") == "auto":
        engine += (f" (auto: two workers' steps both write {rep['write_overlap']:.0%} of "
                   f"the model's cache lines)" if rep.get("write_overlap") is not None
                   else " (auto)")
    print(f"workload {cfg['workload']}, {summary['workers']} workers, policy "
          f"{(cfg.get('policy') or {}).get('name', cfg.get('policy'))}{sim}{engine}",
          file=out)
    print(f"  rule         {_fmt_rule(cfg.get('rule'))}"
          + (f", order {order}" if (order := (cfg.get("workload_config") or {}).get("order"))
             else ""), file=out)
    _print_chosen(cfg.get("chosen") or {}, out)
    print(f"  updates      {summary['updates']}  ({summary['updates_per_s']:.0f}/s over "
          f"{summary['wall_s']:.2f} s)", file=out)
    print(f"  loss         {summary['initial_loss']:.5g} -> {summary['final_loss']:.5g}",
          file=out)
    st = summary["staleness"]
    print(f"  update gap   {_fmt_stats(st['update_gap'])}", file=out)
    print("               (updates other workers merged between a replica's pull and its "
          "merge)" if rep.get("mode") == "worker" else
          "               (updates by other workers between a step's read and its write)",
          file=out)
    print(f"  clock lag    {_fmt_stats(st['clock_lag'])}", file=out)
    print("               (iterations the reading worker was ahead of the slowest one)",
          file=out)
    print(f"  wait frac.   {_fmt_per_worker(summary.get('wait_fraction', []))}  (share of "
          f"its time a worker waited on the policy)", file=out)
    cross = summary.get("cross_node")
    if cross:
        print(f"  across nodes update gap {_fmt_stats(cross['update_gap'])}; "
              f"{cross['exchanges']} exchanges, {cross['bytes_per_update']} bytes/update",
              file=out)
    metrics = {k: v for k, v in (summary.get("metrics") or {}).items() if k != "loss"}
    if metrics:
        shown = "  ".join(f"{k} {v:.4g}" if v is not None else f"{k} -"
                          for k, v in metrics.items())
        print(f"  metrics      {shown}", file=out)


def _print_chosen(chosen, out):
    """What the workload's defaults chose for the run, and why (``config["chosen"]``):
    the knobs taken, then each note on what differs from them."""
    taken = [k for k in ("rule", "batch", "steps") if chosen.get(k) == "default"]
    lines = []
    if taken:
        lines.append(f"{', '.join(taken)} by default"
                     + (f" ({chosen['why']})" if chosen.get("why") else ""))
    lines += [f"{k} {v}" for k, v in chosen.items() if k in ("lane", "workload")]
    for i, line in enumerate(lines):
        print(f"  {'defaults' if i == 0 else '':<13}{line}", file=out)


def _knobs(args):
    """The workload and the knobs ``run`` and ``sim`` share, from parsed options (each
    string form read by its one parser in :mod:`hogkit.parse`); what a flag leaves out
    is the workload's default, as for a Python caller."""
    wl = workloads.get(args.workload, **_workload_options(args))
    batch = (None if args.batch is None else
             parse_batch(args.batch, per_worker=wl.default_batch, workers=args.workers))
    return wl, {"policy": parse_policy(args.policy),
                "rule": parse_rule(args.rule, lr=args.lr, momentum=args.momentum,
                                   workload=wl),
                "density": None if args.density is None else parse_density(args.density),
                "steps": args.steps, "seconds": args.seconds, "seed": args.seed,
                "batch": batch}


def _workers(args, **more):
    """``--workers`` and ``--straggler`` as :class:`~hogkit.engine.settings.Workers`."""
    return Workers(args.workers, stragglers=parse_stragglers(args.straggler) or None, **more)


def _engine(args, **more):
    """``--engine`` (``fused``, the simulator's old word, is ``compiled``), ``--nonfinite``,
    ``--replication``, ``--shards`` as :class:`~hogkit.engine.settings.Engine`."""
    kind = "compiled" if args.engine == "fused" else args.engine
    return Engine(kind, nonfinite=args.nonfinite, replication=args.replication,
                  shards=args.shards, **more)


COMMAND_FILE = "command.json"
#: where a --data run's trained parameters go in its results folder (Workload.export)
PARAMS_DIR = "params"


def _workload_options(args) -> dict:
    """``-o`` settings, with ``--data``/``--test-fraction`` (the workload's ``data`` and
    ``test_fraction``)."""
    options = parse_options(args.option)
    for flag, key in (("data", "data"), ("test_fraction", "test_fraction")):
        value = getattr(args, flag, None)
        if value is None:
            continue
        if key in options:
            raise InvalidArgument(f"--{flag.replace('_', '-')} and -o {key}= both given; "
                                  f"keep one")
        if args.workload not in ("mf", "logreg"):
            raise InvalidArgument(f"--{flag.replace('_', '-')} is read by --workload mf "
                                  f"(a ratings file) or logreg (svmlight), not "
                                  f"{args.workload}")
        options[key] = value
    return options


def _resumed_args(args):
    """The arguments of the run in ``args.resume`` (its ``command.json``), with this
    command's budget and progress flags laid over them."""
    path = os.path.join(args.resume, COMMAND_FILE)
    try:
        with open(path) as f:
            argv = json.load(f)["argv"]
    except FileNotFoundError:
        raise InvalidArgument(f"--resume {args.resume}: no {COMMAND_FILE} there; give the "
                              f"results folder of a `hogkit run` (runs/<timestamp>), or "
                              f"resume from Python with train(resume=...)") from None
    old = build_parser().parse_args(argv)
    if args.steps is not None or args.seconds is not None:
        old.steps, old.seconds = args.steps, args.seconds
    old.out, old.no_progress, old.resume = args.resume, args.no_progress, args.resume
    old.argv = argv
    return old


def _cmd_run(args):
    from hogkit.engine.preflight import preflight

    if args.resume is not None:
        args = _resumed_args(args)
    wl, knobs = _knobs(args)
    out = args.out or _default_out()
    if args.resume is None:
        _check_out_free(out, args.overwrite)
    if args.backend == "ray":
        start = _cluster_run(args, wl, out, knobs)
        where = f"{args.nodes} nodes x {args.workers} workers on Ray"
    else:
        start = _local_run(args, wl, out, knobs)
        where = f"{args.workers} workers"
    preflight(args.workers)                 # a machine that cannot: exit 1, the same way
    print(f"hogkit run: {wl.name} with {where}, results in {out}"
          + (" (resumed)" if args.resume else ""), file=sys.stderr)
    if args.resume is None:                 # what --resume reads back
        from hogkit.report import write_json
        os.makedirs(out, exist_ok=True)
        write_json(os.path.join(out, COMMAND_FILE), {"argv": args.argv})
    run = start()
    print_summary(run.summary())
    if run.params is not None and args.data is not None:       # a model to use
        paths = wl.export(run.params, os.path.join(out, PARAMS_DIR))
        print(f"model: {', '.join(os.path.relpath(p, out) for p in paths)} (`hogkit "
              f"predict {out} FILE` uses it)")
    print(f"results: {out}")
    return EXIT_OK


#: what a results folder of a run holds (Run outputs, the checkpoint, the command)
RUN_FILES = ("summary.json", "events.jsonl", "loss.csv", CHECKPOINT, WORKER_STATE_FILE,
             "loss.png", "staleness.png", COMMAND_FILE)


def _check_out_free(out, overwrite):
    """``--out`` may not hold a run already (its summary, events and checkpoint would be
    overwritten and a second run appended to its events): refused, unless
    ``--overwrite``, which removes that run's files first."""
    held = [f for f in RUN_FILES if os.path.exists(os.path.join(out, f))]
    if os.path.isdir(os.path.join(out, PARAMS_DIR)):
        held.append(PARAMS_DIR + "/")
    if not held:
        return
    if not overwrite:
        raise InvalidArgument(f"--out {out} already holds a run ({', '.join(held[:3])}"
                              f"{', ...' if len(held) > 3 else ''}); use --resume {out} to "
                              f"go on with it, --overwrite to replace it, or another --out")
    import shutil
    for f in held:
        path = os.path.join(out, f.rstrip("/"))
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def _local_run(args, wl, out, knobs):
    """``hogkit.train`` for ``hogkit run``, its options checked now (exit 2 before
    anything is said or written)."""
    if args.nodes != 1 or args.address is not None or args.schedule is not None:
        raise InvalidArgument("--nodes/--address/--schedule are for a cluster run: add "
                              "--backend ray")
    kw = dict(knobs, workers=_workers(args, on_failure=args.on_failure,
                                      max_restarts=args.max_restarts),
              engine=_engine(args, lane=args.lane),
              outputs=Outputs(out, events=args.events,
                              checkpoint_every=args.checkpoint_every or "auto",
                              resume=args.resume, progress=_progress(args),
                              keep_params=args.data is not None))
    with warnings.catch_warnings():         # the run says which engine runs it
        warnings.simplefilter("ignore", EngineNotice)
        make_plan(wl, **kw)
    return functools.partial(train, wl, **kw)


def _progress(args):
    """A line per stage into a log, stage lines and a bar on a terminal (``hogkit.engine.
    progress``); nothing with ``--no-progress``."""
    if args.no_progress:
        return False
    return None if sys.stderr.isatty() else "lines"


def _cluster_run(args, wl, out, knobs):
    """``hogkit.cluster.train`` for ``hogkit run --backend ray``; what a cluster run
    cannot do yet is refused now."""
    from hogkit.cluster import Cluster
    from hogkit.cluster import train as cluster_train
    if args.replication != "shared":
        raise InvalidArgument("--replication is for a run on one machine (a cluster node's "
                              "workers write its shared copy); drop it with --backend ray")
    for flag, given in (("--resume", args.resume is not None),
                        ("--on-failure restart", args.on_failure != "stop"),
                        ("--checkpoint-every", args.checkpoint_every is not None)):
        if given:
            raise InvalidArgument(f"{flag} is not supported with --backend ray (a cluster "
                                  f"run stops at the first failure and writes no "
                                  f"checkpoints yet); drop it, or run on one machine")
    cluster = Cluster(args.nodes, address=args.address, servers=args.servers,
                      sync_every=args.sync_every, push_fraction=args.push_fraction,
                      backlog=args.backlog, schedule=args.schedule)
    return functools.partial(
        cluster_train, wl, workers=_workers(args), engine=_engine(args),
        outputs=Outputs(out, events=args.events, keep_params=False), cluster=cluster,
        **knobs)


def _cmd_sim(args):
    from hogkit.engine.simulator import simulate

    wl, knobs = _knobs(args)
    out = args.out or _default_out()
    run = simulate(wl, workers=_workers(args, delays=args.delays), engine=_engine(args),
                   outputs=Outputs(out, keep_params=False), **knobs)
    s = run.summary()
    print(f"hogkit sim: {wl.name}, {run.workers} virtual workers, {run.updates} updates in "
          f"{s['virtual_time_s']:.4g} virtual s ({s['wall_s']:.2f} s wall, "
          f"{s['engine']} engine)")
    print_summary(s)
    print(f"results: {out}")
    return EXIT_OK


def _cmd_bench(args):
    import importlib
    import inspect
    mod = importlib.import_module(f"hogkit.benchmarks.{args.scenario}")
    kwargs = {}
    if args.workload is not None:
        if "workload" not in inspect.signature(mod.run).parameters:
            raise InvalidArgument(f"hogkit bench {args.scenario} takes no --workload")
        kwargs["workload"] = args.workload
    if args.only is not None:
        if "only" not in inspect.signature(mod.run).parameters:
            raise InvalidArgument(f"hogkit bench {args.scenario} has no parts for --only")
        kwargs["only"] = args.only
    if args.workers is not None:
        if "workers" not in inspect.signature(mod.run).parameters:
            raise InvalidArgument(f"hogkit bench {args.scenario} takes no --workers")
        kwargs["workers"] = args.workers
    if args.presets is not None:
        if "presets" not in inspect.signature(mod.run).parameters:
            raise InvalidArgument(f"hogkit bench {args.scenario} takes no --presets")
        from hogkit.workloads.mf import PRESETS
        names = tuple(x.strip() for x in args.presets.split(",") if x.strip())
        unknown = [x for x in names if x not in PRESETS]
        if not names or unknown:
            raise InvalidArgument(f"--presets {args.presets!r}: pick from "
                                  f"{', '.join(PRESETS)}")
        kwargs["presets"] = names
    result = mod.run(quick=args.quick, **kwargs)
    print(mod.format_table(result))
    if args.json:
        from hogkit.report import environment, write_json
        write_json(args.json, {**result, "environment": environment()})
        print(f"figures: {args.json}")
        if hasattr(mod, "plot"):
            png = os.path.splitext(args.json)[0] + ".png"
            print(f"plot: {mod.plot(result, png)}")
    return EXIT_OK


def _pairs(items, flag, many):
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"{flag} {item!r} is not KNOB=VALUE"
                                  + (",VALUE..." if many else ""))
        vals = [_option_value(v) for v in value.split(",")] if many else _option_value(value)
        out[key] = vals
    return out


def _cmd_sweep(args):
    from hogkit.sweeps import cells, plot, sweep
    grid, base = _pairs(args.grid, "--grid", True), _pairs(args.set, "--set", False)
    spec = None
    if args.plot is not None:
        spec = args.plot.split(":")
        if len(spec) not in (2, 3):
            raise InvalidArgument(f"--plot {args.plot!r} is not X:Y or X:Y:LINE")
    if not grid:                       # one cell: the --set knobs alone
        grid = {"seed": [base.pop("seed", 0)]}
    n = len(cells(grid, base))
    print(f"hogkit sweep: {n} cells ({args.mode}), results in {args.out}", file=sys.stderr)
    if args.tune:
        return _tune_table(grid, base, args)
    rows = sweep(grid, base=base, out=args.out,
                 mode=args.mode, progress=False if args.no_progress else None)
    knobs = list(grid)
    cols = knobs + ["final_loss", "gap_mean", "updates", "wall_s"]
    print("  ".join(f"{c:>12}" for c in cols))
    for r in rows:
        print("  ".join(f"{_cell_text(r.get(c)):>12}" for c in cols))
    if spec is not None:
        png = os.path.splitext(args.out)[0] + ".png"
        plot(rows, spec[0], spec[1], line=spec[2] if len(spec) == 3 else None, path=png)
        print(f"plot: {png}")
    print(f"results: {args.out}")
    return EXIT_OK


def _tune_table(grid, base, args):
    """``hogkit sweep --tune``: one line per group, its best lr and whether a worse lr
    was tried on both sides (else the bound it hit)."""
    from hogkit.sweeps import tune
    groups = tune(grid, base=base, out=args.out, mode=args.mode, factor=args.tune_factor,
                  extend=args.tune_extend, progress=False if args.no_progress else None)
    knobs = [k for k in grid if k not in ("lr", "seed")]
    cols = knobs + ["lr", "mean", "std", "diverged", "bracketed", "lrs tried"]
    print("  ".join(f"{c:>12}" for c in cols))
    for g in groups:
        vals = [g["cell"].get(k) for k in knobs] + [g["lr"], g["mean"], g["std"],
                                                     f"{g['diverged']}/{g['n']}"]
        mark = "yes" if g["bracketed"] else f"no ({g['bound']})"
        tried = ",".join(f"{lr:g}" for lr in g["tried"])
        print("  ".join(f"{_cell_text(v):>12}" for v in vals) + f"  {mark:>12}  {tried}")
    print(f"results: {args.out}")
    return EXIT_OK


def _cell_text(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def _cmd_doctor(args):
    from hogkit.doctor import FATAL, format_findings, planned_bytes, run_checks
    needed = None
    if args.workload is not None:
        from hogkit import workloads
        wl = workloads.get(args.workload, **parse_options(args.option))
        needed = planned_bytes(wl, args.workers)
    elif args.option:
        raise InvalidArgument("-o/--option needs --workload (the workload it sets)")
    findings = run_checks(workers=args.workers, needed_bytes=needed,
                          with_smoke=not args.no_smoke)
    print(format_findings(findings))
    bad = [f for f in findings if f.status == FATAL]
    return EXIT_FAILED if bad else EXIT_OK


def _cmd_report(args):
    from hogkit.report import plot_run
    path = os.path.join(args.folder, "summary.json")
    try:
        with open(path) as f:
            summary = json.load(f)
    except FileNotFoundError:
        print(f"hogkit report: {path} not found; give a folder written by "
              f"`hogkit run --out DIR`", file=sys.stderr)
        return EXIT_USAGE
    print_summary(summary)
    for p in plot_run(summary, args.folder):
        print(f"plot: {p}")
    return EXIT_OK


#: a policy's Python spelling in a message, and its --policy form
_POLICY_WORDS = {"Async()": "--policy async", "BSP()": "--policy bsp"}


def cli_words(message: str, flags) -> str:
    """A library message in the command line's words: ``name='value'`` (or a number)
    where ``--name`` is one of ``flags`` becomes ``--name value``, and a policy's
    constructor its ``--policy`` spelling ("use Async()" → "use --policy async")."""
    def flag(m):
        name, value = m.group(1), m.group(2) or m.group(3)
        opt = "--" + name.replace("_", "-")
        return f"{opt} {value}" if opt in flags else m.group(0)
    message = re.sub(r"\b([a-z_]+)=(?:'([^']*)'|(-?[0-9][0-9.e+-]*))", flag, message)
    for py, cli in _POLICY_WORDS.items():
        message = message.replace(py, cli)
    return re.sub(r"\bSSP\((\d+)\)", r"--policy ssp:\1", message)


def _flags(args) -> set:
    """The option strings of ``args.command``'s parser."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    cmd = sub.choices.get(args.command)
    return {o for a in (cmd._actions if cmd else ()) for o in a.option_strings}


def _cmd_predict(args):
    import numpy as np

    from hogkit import workloads
    from hogkit.state.checkpoint import read
    path = os.path.join(args.folder, "summary.json")
    if not os.path.exists(path):
        raise InvalidArgument(f"{path} not found; give a folder written by `hogkit run "
                              f"--data FILE --out DIR`")
    with open(path) as f:
        name = json.load(f)["config"]["workload"]
    cls = type(workloads.get(name)) if name in ("mf", "logreg") else None
    if cls is None:
        raise InvalidArgument(f"hogkit predict reads mf and logreg runs; {args.folder} "
                              f"holds a {name} run")
    pdir = os.path.join(args.folder, PARAMS_DIR)
    if os.path.isdir(pdir):
        params = {f[:-4]: np.load(os.path.join(pdir, f)) for f in sorted(os.listdir(pdir))
                  if f.endswith(".npy")}
    else:
        params = read(os.path.join(args.folder, "checkpoint.npz"))[0]
    pred, metrics = cls.predict_file(params, args.file)
    text = "".join(f"{v:.6g}\n" for v in pred)
    if args.out is None:
        sys.stdout.write(text)
    else:
        with open(args.out, "w") as f:
            f.write(text)
    shown = "  ".join(f"{k} {v:.6g}" for k, v in metrics.items())
    print(f"hogkit predict: {len(pred)} lines" + (f", {shown}" if shown else "")
          + (f" -> {args.out}" if args.out else ""), file=sys.stderr)
    return EXIT_OK


def _raise_interrupted(signum, frame):
    from hogkit.errors import Interrupted
    raise Interrupted.request(signum)


def main(argv=None):
    import signal
    import threading

    from hogkit.errors import Interrupted, message

    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    handler = {"run": _cmd_run, "sim": _cmd_sim, "simulate": _cmd_sim,
               "bench": _cmd_bench, "report": _cmd_report, "doctor": _cmd_doctor,
               "sweep": _cmd_sweep, "predict": _cmd_predict}[args.command]
    # SIGINT and SIGTERM interrupt the whole command (building data, compiling,
    # writing results), not only while workers run: every path unwinds through the
    # context managers that release shared memory. SIGINT too, because a command
    # started in the background inherits it ignored (Python then installs no
    # KeyboardInterrupt), and an explicit `kill -INT` must not be honoured only
    # while workers happen to be running.
    old = {}
    Interrupted.clear()
    if threading.current_thread() is threading.main_thread():
        old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = handler(args)
        Interrupted.check()               # one swallowed where it was raised (numba)
        return rc
    except Exception as e:                # what a swallowed interrupt broke, reported as it
        if Interrupted.pending() is None:
            return _failed(args, e)
        print(f"hogkit {args.command}: {Interrupted(Interrupted.pending())}", file=sys.stderr)
        return _exit_for(Interrupted.pending())
    except (Interrupted, KeyboardInterrupt) as e:
        print(f"hogkit {args.command}: {message(e) or 'interrupted'}", file=sys.stderr)
        return _exit_for(getattr(e, "signum", signal.SIGINT))
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _failed(args, e):
    """The exit code and one line for a command's exception (re-raised when it is not
    hogkit's: a bug's traceback). The run failed or the machine cannot run it: 1; any
    other hogkit error is bad usage: 2."""
    from hogkit.errors import HogkitError, RunFailed, message
    if isinstance(e, RunFailed):
        print(f"hogkit {args.command}: {message(e)}", file=sys.stderr)
        return EXIT_FAILED
    if isinstance(e, HogkitError):
        print(f"hogkit {args.command}: {cli_words(str(e), _flags(args))}", file=sys.stderr)
        return EXIT_USAGE
    raise e


def console(argv=None):
    """The ``hogkit`` command: :func:`main`, and once a run is interrupted (everything
    stopped and released by then), a second Ctrl-C while the interpreter exits does
    not turn exit status 130 (143) into death by signal."""
    import signal
    rc = main(argv)
    if rc in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
    return rc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console())
