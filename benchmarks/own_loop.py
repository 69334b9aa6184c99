"""Scenario ``own_loop``: ``hogkit.spawn`` + ``hogkit.optim.SGD`` against torch's own
Hogwild! recipe, running the same user loop on the same model and data.

The model is the digits MLP (``nn.Sequential(Linear(64, h), ReLU(), Linear(h, 10))``,
hogkit's ``mlp`` workload: scikit-learn's digits, 1437 training rows, standardised) at
two sizes, ``small`` (h = 64) and ``medium`` (h = 512), from the same initial weights
(seed 0). Every worker runs the identical loop, :func:`_loop`: ``steps`` iterations of
``randint`` minibatch of 32, ``zero_grad``, forward, cross-entropy, ``backward``,
``step``, lr 0.05, no momentum, one torch thread a process, ``spawn`` start method.
The two sides differ only in how the processes share the model and which optimizer
steps it:

- **torch**: ``model.share_memory()``, ``torch.multiprocessing.get_context("spawn")``
  processes, ``torch.optim.SGD`` (the recipe of pytorch/examples ``mnist_hogwild``, as
  ``benchmarks/peers.py`` runs it);
- **hogkit**: ``hogkit.spawn(fn, model, nprocs=...)`` with ``hogkit.optim.SGD``: each
  ``step()`` also ticks the shared clocks and records the update gap (staleness
  recording is always on in hogkit).

Timing, the same definition on both sides. Both sides' processes are started
together (the torch processes, then ``hogkit.spawn``) from the same initial weights,
and take turns: the run is a sequence of **segments**, each one side's workers
running ``steps`` iterations of the loop while the other side's sleep (polling a file
every 2 ms), in ABBA order (hogkit, torch, torch, hogkit, hogkit, ...; :func:`plan`);
a **round** is one hogkit and one torch segment back to back, so both see the same
machine within about a second of each other (process start-up is paid once and is
outside every figure; this 2-core box's run-to-run noise, ±15-30 % between separate
spawns, mostly cancels in a round's ratio). Before its first segment each worker does
three warm-up steps on a private copy of the model with its side's optimizer class
(torch's lazy initialisation, hogkit's kernel loading), and once all are up every
worker waits 1 s for the parents' start-up work to settle. In each segment, every
worker of the side waits for its peers at a file barrier, then times its own loop
with ``time.monotonic`` from just before its first step to just after its last. A
segment's **steps/s** is the sum over its workers of ``steps / loop seconds``
(``span_steps_per_s``, all steps over first start to last end, is reported too).
hogkit's parent supervises throughout (it polls every 50 ms, during both sides'
segments); no process exits before the last segment ends. The **ratio** is the
median over rounds of hogkit's steps/s over torch's in the same round;
``cpu_ratio`` is the same with steps per CPU second of the workers
(``time.process_time``), blind to time a worker spent descheduled by anything else
on the machine. Both sides' full-train-set cross-entropy at the end (after the same
number of steps) shows that both trained.

``step_cost``: in this process, no spawning, one torch thread, the same loop on each
size with each optimizer (interleaved blocks), timing ``optimizer.step()`` alone and
the whole iteration: the per-step overhead of ``hogkit.optim.SGD.step()`` over
``torch.optim.SGD.step()`` in microseconds (medians over all steps), and the 1-process
ratio that overhead alone predicts (torch's iteration over torch's iteration plus the
overhead).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import hogkit

SIZES = {"small": 64, "medium": 512}
LR = 0.05
BATCH = 32
SIDES = ("hogkit", "torch")
#: loop steps per worker and segment (full run): ~1 s of loop on the reference box
STEPS = {"small": 2000, "medium": 1200}
#: rounds: each one hogkit segment and one torch segment, order alternating (ABBA)
ROUNDS = 10
PROCESSES = (2, 1)
#: step_cost: blocks per optimizer (interleaved) and steps per block
COST_BLOCKS, COST_STEPS = 20, 200
QUICK = {"steps": 100, "rounds": 2, "sizes": ("small",), "cost_blocks": 4,
         "cost_steps": 50}
SEED = 0
#: seconds a worker may wait for its turn (the other side's segment, start-up)
WAIT_TIMEOUT = 300.0
POLL_S = 0.002
#: seconds every worker waits after all are up, before the first segment
SETTLE_S = 1.0


def plan(rounds):
    """The segments' order: round ``r`` is (hogkit, torch) for even ``r``, else
    (torch, hogkit): hogkit, torch, torch, hogkit, hogkit, torch, ..."""
    out = []
    for r in range(rounds):
        out += list(SIDES if r % 2 == 0 else SIDES[::-1])
    return out


# --- the user's loop, identical on both sides ---------------------------------------------

def _loop(model, opt, X, y, steps, batch, g):
    """The loop every worker times: ``(t0, t1, cpu_s)``, ``time.monotonic`` seconds
    (one clock for all processes) around its ``steps`` iterations and the CPU seconds
    this process spent in them (``time.process_time``)."""
    import torch
    from torch.nn.functional import cross_entropy
    n = X.shape[0]
    c0 = time.process_time()
    t0 = time.monotonic()
    for _ in range(steps):
        idx = torch.randint(0, n, (batch,), generator=g)
        opt.zero_grad()
        cross_entropy(model(X[idx]), y[idx]).backward()
        opt.step()
    t1 = time.monotonic()
    return t0, t1, time.process_time() - c0


def _warm(model, make_opt, X, y, batch):
    """Three steps on a private copy of ``model`` (lazy initialisation, kernel
    loading) before the first segment, so no side pays them in a timed loop."""
    from torch.nn.functional import cross_entropy
    warm = copy.deepcopy(model)
    opt = make_opt(warm.parameters())
    for _ in range(3):
        opt.zero_grad()
        cross_entropy(warm(X[:batch]), y[:batch]).backward()
        opt.step()


def _touch(folder, name):
    open(os.path.join(folder, name), "w").close()


def _wait_for(folder, names, who):
    """Until every file in ``names`` exists (polled every ``POLL_S``: the waiting
    side sleeps while the other side runs)."""
    paths = [os.path.join(folder, n) for n in names]
    deadline = time.monotonic() + WAIT_TIMEOUT
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{who}: waited {WAIT_TIMEOUT:.0f} s for {names}")
        time.sleep(POLL_S)


def _segments(side, rank, nprocs, model, opt, X, y, steps, batch, g, order, folder):
    """Run this side's segments of ``order``: wait until the previous segment's
    workers are done, meet this side's peers, time :func:`_loop`, record."""
    who = f"{side} worker {rank}"
    _touch(folder, f"up.{side}.{rank}")
    _wait_for(folder, [f"up.{s}.{r}" for s in SIDES for r in range(nprocs)], who)
    time.sleep(SETTLE_S)                 # start-up work elsewhere (parents) settles
    for i, turn in enumerate(order):
        if turn != side:
            continue
        if i > 0:
            _wait_for(folder, [f"done.{i - 1}.{r}" for r in range(nprocs)], who)
        _touch(folder, f"ready.{i}.{rank}")
        _wait_for(folder, [f"ready.{i}.{r}" for r in range(nprocs)], who)
        t0, t1, cpu = _loop(model, opt, X, y, steps, batch, g)
        with open(os.path.join(folder, f"loop.{i}.{rank}.json"), "w") as f:
            json.dump({"rank": rank, "t0": t0, "t1": t1, "cpu_s": cpu, "steps": steps}, f)
        _touch(folder, f"done.{i}.{rank}")
    # nobody exits (process teardown costs CPU) while the other side still runs
    _wait_for(folder, [f"done.{len(order) - 1}.{r}" for r in range(nprocs)], who)


def _tensors(X, y):
    import torch
    return torch.from_numpy(X), torch.from_numpy(y)


def _torch_worker(rank, nprocs, model, X, y, lr, steps, batch, seed, order, folder):
    """One process of torch's recipe: ``torch.optim.SGD`` on the shared model."""
    import torch
    torch.set_num_threads(1)
    X, y = _tensors(X, y)
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    _warm(model, lambda ps: torch.optim.SGD(ps, lr=lr), X, y, batch)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    _segments("torch", rank, nprocs, model, opt, X, y, steps, batch, g, order, folder)


def _hogkit_worker(worker, model, X, y, lr, steps, batch, seed, order, folder):
    """One worker of ``hogkit.spawn``: ``hogkit.optim.SGD`` on the shared model."""
    import torch

    import hogkit.optim
    from hogkit.spawning import Worker
    torch.set_num_threads(1)                 # spawn(threads=1) did it already
    X, y = _tensors(X, y)
    g = torch.Generator().manual_seed(seed * 1000 + worker.rank)
    _warm(model, lambda ps: hogkit.optim.SGD(ps, lr=lr, worker=Worker.solo()), X, y,
          batch)
    opt = hogkit.optim.SGD(model.parameters(), lr=lr)
    _segments("hogkit", worker.rank, worker.world_size, model, opt, X, y, steps, batch,
              g, order, folder)


# --- both sides, interleaved ----------------------------------------------------------------

def _model(wl, params):
    import torch
    model = wl.make_module()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(params[name]))
    return model


def _final(model):
    return {name: p.detach().numpy().copy() for name, p in model.named_parameters()}


def _segment(folder, i, nprocs):
    """Segment ``i``'s figures from its workers' files."""
    loops = []
    for r in range(nprocs):
        with open(os.path.join(folder, f"loop.{i}.{r}.json")) as f:
            loops.append(json.load(f))
    per = [w["steps"] / (w["t1"] - w["t0"]) for w in loops]
    span = max(w["t1"] for w in loops) - min(w["t0"] for w in loops)
    return {"steps_per_s": sum(per), "per_worker_steps_per_s": per,
            "loop_s": [w["t1"] - w["t0"] for w in loops],
            # steps per CPU second: blind to time the worker was descheduled
            "cpu_steps_per_s": sum(w["steps"] / w["cpu_s"] for w in loops),
            "cpu_fraction": [w["cpu_s"] / (w["t1"] - w["t0"]) for w in loops],
            "span_steps_per_s": sum(w["steps"] for w in loops) / span,
            "start_skew_s": max(w["t0"] for w in loops) - min(w["t0"] for w in loops)}


def compare(wl, params, data, nprocs, steps, rounds, lr=LR, batch=BATCH, seed=SEED):
    """torch's recipe and ``hogkit.spawn``, both started from the same weights, their
    segments interleaved (:func:`plan`); returns the rounds, each side's final train
    loss and hogkit's run figures."""
    import torch.multiprocessing as tmp

    order = plan(rounds)
    folder = tempfile.mkdtemp(prefix="hogkit_bench_own_loop_")
    tmodel = _model(wl, params)
    tmodel.share_memory()
    hmodel = _model(wl, params)
    ctx = tmp.get_context("spawn")
    procs = [ctx.Process(target=_torch_worker, daemon=True,
                         args=(r, nprocs, tmodel, data["X"], data["y"], lr, steps, batch,
                               seed, order, folder))
             for r in range(nprocs)]
    try:
        for p in procs:
            p.start()
        run = hogkit.spawn(_hogkit_worker, hmodel,
                           nprocs=hogkit.Workers(nprocs, wait_timeout=WAIT_TIMEOUT),
                           args=(data["X"], data["y"], lr, steps, batch, seed, order,
                                 folder), threads=1,
                           outputs=hogkit.Outputs(progress=False, eval_every=None))
        for p in procs:
            p.join(timeout=WAIT_TIMEOUT)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"a torch Hogwild! process failed: "
                               f"{[p.exitcode for p in procs]}")
        segs = [_segment(folder, i, nprocs) for i in range(len(order))]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(folder, ignore_errors=True)
    out_rounds = []
    for r in range(rounds):
        a, b = order[2 * r], order[2 * r + 1]
        got = {"order": [a, b], a: segs[2 * r], b: segs[2 * r + 1]}
        got["ratio"] = got["hogkit"]["steps_per_s"] / got["torch"]["steps_per_s"]
        got["cpu_ratio"] = (got["hogkit"]["cpu_steps_per_s"]
                            / got["torch"]["cpu_steps_per_s"])
        out_rounds.append(got)
    gap = run.staleness["update_gap"]
    return {"rounds": out_rounds,
            "final_loss": {"hogkit": wl.loss(_final(hmodel), data),
                           "torch": wl.loss(_final(tmodel), data)},
            "hogkit_run": {"updates": int(run.updates), "wall_s": run.wall_s,
                           "update_gap_mean": gap.get("mean"),
                           "update_gap_max": gap.get("max")}}


# --- per-step cost in one process -----------------------------------------------------------

#: the parts of one iteration step_cost times, per side (µs medians in its result)
PARTS = {"torch": ("sample", "zero_grad", "forward", "backward", "step"),
         "hogkit": ("sample", "zero_grad", "forward", "backward", "step"),
         "train": ("read", "sample", "forward", "backward", "grads", "apply", "tick")}


def _optim_parts(model, opt, X, y, n, batch, g, steps, pc):
    """``steps`` iterations of the user's loop, each part timed: rows of
    ``PARTS["torch"]`` durations plus the whole iteration."""
    import torch
    from torch.nn.functional import cross_entropy
    rows = []
    for _ in range(steps):
        t0 = pc()
        idx = torch.randint(0, n, (batch,), generator=g)
        t1 = pc()
        opt.zero_grad()
        t2 = pc()
        loss = cross_entropy(model(X[idx]), y[idx])
        t3 = pc()
        loss.backward()
        t4 = pc()
        opt.step()
        t5 = pc()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0))
    return rows


def _train_side(wl, params, data, lr, seed):
    """hogkit ``train``'s Python step for this workload, in this process: the same
    ``PythonStep`` (its torch lane) a worker builds, on private control arrays."""
    from hogkit.engine.step import PythonStep
    from hogkit.engine.worker_loop import private_control
    from hogkit.rules.core import SGD
    from hogkit.state.reader import Reader
    views, clocks, log = private_control()
    ps = {k: v.copy() for k, v in params.items()}
    ctx = wl.setup(ps, data, rank=0, seed=seed)
    rule = SGD(lr)
    step = PythonStep(wl, ctx, rank=0, rule=rule, rule_state=rule.init(ps),
                      density=None, density_state=None, reader=Reader(clocks, log, 0),
                      clocks=clocks, params=ps)
    assert step._lane is not None, "the torch lane is off: the profile would be wrong"
    return {"step": step, "ctx": ctx, "clocks": clocks, "params": ps,
            "rng": np.random.default_rng(seed), "k": 0}


def _train_parts(wl, side, batch, steps, pc, whole):
    """``steps`` iterations of ``train``'s Python step (what ``PythonStep.compute`` and
    ``apply`` do on the torch lane, and the loop's tick), each part timed, or with
    ``whole`` the real ``compute``/``apply`` calls timed as one."""
    import torch
    step, ctx, clocks, rng = side["step"], side["ctx"], side["clocks"], side["rng"]
    lane, reader = step._lane, step.reader
    rows = []
    for _ in range(steps):
        k = side["k"]
        side["k"] = k + 1
        if whole:
            t0 = pc()
            grads, finite = step.compute(rng, batch)
            step.apply(grads, k)
            clocks.tick_iteration(0, beat=True)
            rows.append((pc() - t0,))
            continue
        t0 = pc()
        reader.read()
        t1 = pc()
        idx = torch.from_numpy(rng.integers(0, ctx.n, size=batch))
        for p in ctx.params:
            p.grad = None
        b = wl.make_batch(ctx.tensors, idx)
        t2 = pc()
        loss = wl.step_loss(ctx.module, b)
        t3 = pc()
        loss.backward()
        t4 = pc()
        lane.take(ctx.params)
        lane.finite()
        t5 = pc()
        step.apply(None, k)
        t6 = pc()
        clocks.tick_iteration(0, beat=True)
        t7 = pc()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6,
                     t7 - t0))
    return rows


def step_cost(wl, params, data, blocks, steps, lr=LR, batch=BATCH, seed=SEED):
    """Each part of one iteration, µs, in this process (no spawn, one torch thread),
    for torch's recipe (``torch.optim.SGD``), the same loop with ``hogkit.optim.SGD``
    (its private one-worker context) and ``hogkit.train``'s Python step
    (``PythonStep`` on the torch lane, private control arrays, record on), in
    interleaved blocks of ``steps`` (the train side also has blocks timed whole, the
    real calls, to check the parts against); medians over every step."""
    import torch

    import hogkit.optim
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        X, y = _tensors(data["X"], data["y"])
        n = X.shape[0]
        sides = {}
        for name, cls in (("torch", torch.optim.SGD), ("hogkit", hogkit.optim.SGD)):
            model = _model(wl, params)
            _warm(model, lambda ps, c=cls: c(ps, lr=lr), X, y, batch)
            sides[name] = {"model": model, "opt": cls(model.parameters(), lr=lr),
                           "g": torch.Generator().manual_seed(seed), "rows": []}
        train = _train_side(wl, params, data, lr, seed)
        _train_parts(wl, train, batch, 3, time.perf_counter, whole=True)     # warm
        train["rows"], train["whole"] = [], []
        sides["train"] = train
        pc = time.perf_counter
        names = list(sides)
        for b in range(blocks):
            for name in names[b % 3:] + names[:b % 3]:
                s = sides[name]
                if name == "train":
                    s["rows"] += _train_parts(wl, s, batch, steps, pc, whole=False)
                    s["whole"] += _train_parts(wl, s, batch, steps, pc, whole=True)
                else:
                    s["rows"] += _optim_parts(s["model"], s["opt"], X, y, n, batch,
                                              s["g"], steps, pc)
    finally:
        torch.set_num_threads(threads)
    out = {"parts_us": {}}
    for name, s in sides.items():
        cols = list(zip(*s["rows"]))
        parts = {p: statistics.median(c) * 1e6 for p, c in zip(PARTS[name], cols)}
        parts["iteration"] = statistics.median(cols[-1]) * 1e6
        out["parts_us"][name] = parts
    out["train_whole_iteration_us"] = statistics.median(
        r[0] for r in sides["train"]["whole"]) * 1e6
    out["torch_final_loss"] = wl.loss(_final(sides["torch"]["model"]), data)
    out["hogkit_final_loss"] = wl.loss(_final(sides["hogkit"]["model"]), data)
    out["train_final_loss"] = wl.loss(sides["train"]["params"], data)
    for name in ("torch", "hogkit"):
        out[f"{name}_step_us"] = out["parts_us"][name]["step"]
        out[f"{name}_iteration_us"] = out["parts_us"][name]["iteration"]
    out["train_iteration_us"] = out["parts_us"]["train"]["iteration"]
    out["overhead_us"] = out["hogkit_step_us"] - out["torch_step_us"]
    # what the step's difference alone does to one process's rate
    out["predicted_ratio_1proc"] = (out["torch_iteration_us"]
                                    / (out["torch_iteration_us"] + out["overhead_us"]))
    out["steps"] = blocks * steps
    return out


# --- the scenario ---------------------------------------------------------------------------

def _median(rounds, side, key):
    return statistics.median(g[side][key] for g in rounds)


def _size(hidden, steps, rounds, cost_blocks, cost_steps):
    from hogkit import workloads
    wl = workloads.get("mlp", hidden=hidden)
    params, data = wl.build(SEED)
    out = {"hidden": hidden, "n_params": int(sum(a.size for a in params.values())),
           "steps_per_segment": steps, "initial_loss": wl.loss(params, data),
           "processes": {}}
    for nprocs in PROCESSES:
        got = compare(wl, params, data, nprocs, steps, rounds)
        rs = got["rounds"]
        got["median"] = {side: {"steps_per_s": _median(rs, side, "steps_per_s"),
                                "span_steps_per_s": _median(rs, side, "span_steps_per_s"),
                                "cpu_steps_per_s": _median(rs, side, "cpu_steps_per_s"),
                                "final_loss": got["final_loss"][side]}
                         for side in SIDES}
        got["ratio"] = statistics.median(g["ratio"] for g in rs)
        got["ratio_range"] = [min(g["ratio"] for g in rs), max(g["ratio"] for g in rs)]
        got["cpu_ratio"] = statistics.median(g["cpu_ratio"] for g in rs)
        got["ratio_of_medians"] = (got["median"]["hogkit"]["steps_per_s"]
                                   / got["median"]["torch"]["steps_per_s"])
        out["processes"][str(nprocs)] = got
    out["step_cost"] = step_cost(wl, params, data, cost_blocks, cost_steps)
    return out


def run(quick=False, sizes=None, steps=None, rounds=None) -> dict:
    """Both sides, every size, 2 and 1 processes, ``rounds`` rounds; see the module
    doc. ``steps``: loop steps per worker and segment (default: ``STEPS`` per size,
    or the quick figure)."""
    q = QUICK if quick else {}
    sizes = sizes or q.get("sizes", tuple(SIZES))
    rounds = rounds or q.get("rounds", ROUNDS)
    result = {"scenario": "own_loop", "quick": quick, "cpus": os.cpu_count(),
              "lr": LR, "batch": BATCH, "rounds": rounds, "seed": SEED, "sizes": {}}
    for name in sizes:
        n = steps or q.get("steps", STEPS[name])
        result["sizes"][name] = _size(SIZES[name], n, rounds,
                                      q.get("cost_blocks", COST_BLOCKS),
                                      q.get("cost_steps", COST_STEPS))
    result["ratios"] = {f"{name}_{p}proc_hogkit_over_torch": s["processes"][p]["ratio"]
                        for name, s in result["sizes"].items() for p in s["processes"]}
    return result


def format_table(result) -> str:
    lines = [(f"own loop, digits MLP, batch {result['batch']}, lr {result['lr']}, "
              f"{result['rounds']} round(s); steps/s summed over the workers, median over "
              f"rounds; ratio: median of the rounds' hogkit/torch")]
    lines.append(f"  {'size':<8}{'procs':>6}{'torch steps/s':>15}{'hogkit steps/s':>16}"
                 f"{'ratio':>8}{'  (range)':<16}{'cpu ratio':>10}{'loss torch':>11}"
                 f"{'loss hogkit':>12}")
    for name, s in result["sizes"].items():
        for p, f in s["processes"].items():
            m = f["median"]
            lo, hi = f["ratio_range"]
            lines.append(f"  {name:<8}{p:>6}{m['torch']['steps_per_s']:>15,.0f}"
                         f"{m['hogkit']['steps_per_s']:>16,.0f}{f['ratio']:>8.3f}"
                         f"{f'  ({lo:.3f}-{hi:.3f})':<16}{f['cpu_ratio']:>10.3f}"
                         f"{m['torch']['final_loss']:>11.4f}"
                         f"{m['hogkit']['final_loss']:>12.4f}")
    lines.append("  one process, no spawn, µs per part of an iteration (medians; torch: "
                 "the recipe, hogkit: hogkit.optim.SGD, train: hogkit.train's Python "
                 "step):")
    for name, s in result["sizes"].items():
        c = s["step_cost"]
        for side, parts in c["parts_us"].items():
            lines.append(f"  {name:<8} {side:<7}" + ", ".join(
                f"{p} {v:.1f}" for p, v in parts.items()))
        lines.append(f"  {name:<8} step() overhead {c['overhead_us']:+.1f} µs, 1-process "
                     f"ratio it predicts {c['predicted_ratio_1proc']:.3f}; train's real "
                     f"calls timed whole: {c['train_whole_iteration_us']:.1f} µs")
    return "\n".join(lines)


def format_markdown(result) -> str:
    """The tables RESULTS.md shows (a test checks that RESULTS.md holds this rendering
    of the committed JSON: no hand-typed figure)."""
    out = ["| model | processes | torch steps/s | hogkit steps/s | hogkit / torch (range "
           "over rounds) | per CPU s | final CE torch / hogkit |",
           "|---|---|---|---|---|---|---|"]
    for name, s in result["sizes"].items():
        for p, f in s["processes"].items():
            m = f["median"]
            lo, hi = f["ratio_range"]
            out.append(f"| {name} | {p} | {m['torch']['steps_per_s']:,.0f} | "
                       f"{m['hogkit']['steps_per_s']:,.0f} | **{f['ratio']:.3f}** "
                       f"({lo:.2f}–{hi:.2f}) | {f['cpu_ratio']:.3f} | "
                       f"{m['torch']['final_loss']:.4f} / {m['hogkit']['final_loss']:.4f} |")
    names = {"torch": "torch's recipe", "hogkit": "`hogkit.optim.SGD`",
             "train": "`hogkit.train`'s Python step"}
    for name, s in result["sizes"].items():
        c = s["step_cost"]
        out += ["", f"Per part of an iteration, µs (medians of {c['steps']:,} steps each, "
                f"one process, model `{name}`):", "",
                "| side | read | sample | zero_grad | forward | backward | grads | "
                "step / apply | tick | iteration |",
                "|---|" + "---|" * 9]
        for side, parts in c["parts_us"].items():
            cells = [parts.get("read"), parts["sample"], parts.get("zero_grad"),
                     parts["forward"], parts["backward"], parts.get("grads"),
                     parts.get("step", parts.get("apply")), parts.get("tick"),
                     parts["iteration"]]
            out.append(f"| {names[side]} | " + " | ".join(
                "–" if v is None else f"{v:.1f}" for v in cells[:-1])
                + f" | **{cells[-1]:.1f}** |")
        out.append("")
        out.append(f"`hogkit.train`'s real calls timed whole: "
                   f"{c['train_whole_iteration_us']:.1f} µs an iteration.")
    return "\n".join(out)
