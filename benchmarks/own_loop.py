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

Timing, the same definition on both sides: before timing, each worker does three
warm-up steps on a private copy of the model with its side's optimizer class (torch's
lazy initialisation, hogkit's kernel loading), then waits at a file barrier with its
peers; it then times its own loop with ``time.monotonic`` from just before its first
step to just after its last. A run's **steps/s** is the sum over its workers of
``steps / loop seconds``; ``span_steps_per_s`` (all steps over first start to last
end) is reported too. Process start-up, imports and the parent's supervision before
and after are outside both measurements (hogkit's parent still supervises during the
loop: it polls every 50 ms).

Rounds alternate the order (hogkit then torch, torch then hogkit, ...), each pair run
back to back for the same size and process count; the **ratio** is the median over
rounds of hogkit's steps/s over torch's in the same round. Both sides' full-train-set
cross-entropy at the end of each run shows that both trained.

``step_cost``: in this process, no spawning, one torch thread, the same loop on each
size with each optimizer (interleaved blocks), timing ``optimizer.step()`` alone and
the whole iteration: the per-step overhead of ``hogkit.optim.SGD.step()`` over
``torch.optim.SGD.step()`` in microseconds (medians over all steps), and the 1-process
ratio it predicts (torch's iteration over hogkit's).
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

SIZES = {"small": 64, "medium": 512}
LR = 0.05
BATCH = 32
#: loop steps per worker (full run): ~1 s of loop per worker and run on the reference box
STEPS = {"small": 2500, "medium": 1500}
ROUNDS = 5
PROCESSES = (2, 1)
#: step_cost: blocks per optimizer (interleaved) and steps per block
COST_BLOCKS, COST_STEPS = 6, 500
QUICK = {"steps": 150, "rounds": 1, "sizes": ("small",), "cost_blocks": 2,
         "cost_steps": 100}
SEED = 0
BARRIER_TIMEOUT = 120.0


# --- the user's loop, identical on both sides ---------------------------------------------

def _loop(model, opt, X, y, steps, batch, g):
    """The loop every worker times: ``(t0, t1)`` in ``time.monotonic`` seconds (one
    clock for all processes) around its ``steps`` iterations."""
    import torch
    from torch.nn.functional import cross_entropy
    n = X.shape[0]
    t0 = time.monotonic()
    for _ in range(steps):
        idx = torch.randint(0, n, (batch,), generator=g)
        opt.zero_grad()
        cross_entropy(model(X[idx]), y[idx]).backward()
        opt.step()
    return t0, time.monotonic()


def _warm(model, make_opt, X, y, batch):
    """Three steps on a private copy of ``model`` (lazy initialisation, kernel
    loading) before the barrier, so no side pays them in its timed loop."""
    from torch.nn.functional import cross_entropy
    warm = copy.deepcopy(model)
    opt = make_opt(warm.parameters())
    for _ in range(3):
        opt.zero_grad()
        cross_entropy(warm(X[:batch]), y[:batch]).backward()
        opt.step()


def _barrier(folder, rank, nprocs):
    """Every worker of the run has arrived (one file each, polled every 0.5 ms)."""
    open(os.path.join(folder, f"ready.{rank}"), "w").close()
    deadline = time.monotonic() + BARRIER_TIMEOUT
    names = [os.path.join(folder, f"ready.{r}") for r in range(nprocs)]
    while not all(os.path.exists(p) for p in names):
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker {rank}: peers did not reach the start barrier")
        time.sleep(0.0005)


def _record(folder, rank, t0, t1, steps):
    path = os.path.join(folder, f"loop.{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": rank, "t0": t0, "t1": t1, "steps": steps}, f)
    os.replace(path + ".tmp", path)


def _tensors(X, y):
    import torch
    return torch.from_numpy(X), torch.from_numpy(y)


def _torch_worker(rank, nprocs, model, X, y, lr, steps, batch, seed, folder):
    """One process of torch's recipe: ``torch.optim.SGD`` on the shared model."""
    import torch
    torch.set_num_threads(1)
    X, y = _tensors(X, y)
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    _warm(model, lambda ps: torch.optim.SGD(ps, lr=lr), X, y, batch)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    _barrier(folder, rank, nprocs)
    t0, t1 = _loop(model, opt, X, y, steps, batch, g)
    _record(folder, rank, t0, t1, steps)


def _hogkit_worker(worker, model, X, y, lr, steps, batch, seed, folder):
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
    _barrier(folder, worker.rank, worker.world_size)
    t0, t1 = _loop(model, opt, X, y, steps, batch, g)
    _record(folder, worker.rank, t0, t1, steps)


# --- the two ways to run it -------------------------------------------------------------

def _model(wl, params):
    import torch
    model = wl.make_module()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(params[name]))
    return model


def _final(model):
    return {name: p.detach().numpy().copy() for name, p in model.named_parameters()}


def _figures(folder, nprocs):
    """Per-worker loop times from the workers' files, and the run's steps/s."""
    loops = []
    for r in range(nprocs):
        with open(os.path.join(folder, f"loop.{r}.json")) as f:
            loops.append(json.load(f))
    per = [w["steps"] / (w["t1"] - w["t0"]) for w in loops]
    span = max(w["t1"] for w in loops) - min(w["t0"] for w in loops)
    return {"steps_per_s": sum(per), "per_worker_steps_per_s": per,
            "loop_s": [w["t1"] - w["t0"] for w in loops],
            "span_s": span,
            "span_steps_per_s": sum(w["steps"] for w in loops) / span,
            "start_skew_s": max(w["t0"] for w in loops) - min(w["t0"] for w in loops)}


def run_torch(wl, params, data, nprocs, steps, lr=LR, batch=BATCH, seed=SEED):
    """torch's recipe once; returns the run's figures and final train loss."""
    import torch
    import torch.multiprocessing as tmp
    model = _model(wl, params)
    model.share_memory()
    folder = tempfile.mkdtemp(prefix="hogkit_bench_own_loop_")
    ctx = tmp.get_context("spawn")
    procs = [ctx.Process(target=_torch_worker, daemon=True,
                         args=(r, nprocs, model, data["X"], data["y"], lr, steps, batch,
                               seed, folder))
             for r in range(nprocs)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=600)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"a torch Hogwild! process failed: "
                               f"{[p.exitcode for p in procs]}")
        out = _figures(folder, nprocs)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(folder, ignore_errors=True)
    with torch.no_grad():
        out["final_loss"] = wl.loss(_final(model), data)
    return out


def run_hogkit(wl, params, data, nprocs, steps, lr=LR, batch=BATCH, seed=SEED):
    """``hogkit.spawn`` once; returns the run's figures and final train loss."""
    import hogkit
    model = _model(wl, params)
    folder = tempfile.mkdtemp(prefix="hogkit_bench_own_loop_")
    try:
        run = hogkit.spawn(_hogkit_worker, model, nprocs=nprocs, threads=1,
                           args=(data["X"], data["y"], lr, steps, batch, seed, folder),
                           progress=False, eval_every=None)
        out = _figures(folder, nprocs)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    gap = run.staleness["update_gap"]
    out.update(updates=int(run.updates), wall_s=run.wall_s,
               update_gap_mean=gap.get("mean"), update_gap_max=gap.get("max"))
    out["final_loss"] = wl.loss(_final(model), data)
    return out


# --- per-step cost in one process -----------------------------------------------------------

def step_cost(wl, params, data, blocks, steps, lr=LR, batch=BATCH, seed=SEED):
    """``optimizer.step()`` and the whole iteration, µs, each optimizer in this process
    (no spawn; hogkit's optimizer on its private one-worker context), in interleaved
    blocks of ``steps``; medians over every step."""
    import torch
    from torch.nn.functional import cross_entropy

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
                           "g": torch.Generator().manual_seed(seed), "step": [],
                           "iteration": []}
        pc = time.perf_counter
        for b in range(blocks):
            for name in (("torch", "hogkit") if b % 2 == 0 else ("hogkit", "torch")):
                s = sides[name]
                model, opt, g = s["model"], s["opt"], s["g"]
                for _ in range(steps):
                    t0 = pc()
                    idx = torch.randint(0, n, (batch,), generator=g)
                    opt.zero_grad()
                    cross_entropy(model(X[idx]), y[idx]).backward()
                    t1 = pc()
                    opt.step()
                    t2 = pc()
                    s["step"].append(t2 - t1)
                    s["iteration"].append(t2 - t0)
    finally:
        torch.set_num_threads(threads)
    out = {}
    for name, s in sides.items():
        out[f"{name}_step_us"] = statistics.median(s["step"]) * 1e6
        out[f"{name}_iteration_us"] = statistics.median(s["iteration"]) * 1e6
        out[f"{name}_final_loss"] = wl.loss(_final(s["model"]), data)
    out["overhead_us"] = out["hogkit_step_us"] - out["torch_step_us"]
    out["predicted_ratio_1proc"] = out["torch_iteration_us"] / out["hogkit_iteration_us"]
    out["steps"] = blocks * steps
    return out


# --- the scenario ---------------------------------------------------------------------------

def _size(name, hidden, steps, rounds, cost_blocks, cost_steps):
    from hogkit import workloads
    wl = workloads.get("mlp", hidden=hidden)
    params, data = wl.build(SEED)
    out = {"hidden": hidden, "n_params": int(sum(a.size for a in params.values())),
           "steps_per_worker": steps, "initial_loss": wl.loss(params, data),
           "processes": {}}
    for nprocs in PROCESSES:
        rounds_out = []
        for r in range(rounds):
            order = ("hogkit", "torch") if r % 2 == 0 else ("torch", "hogkit")
            got = {"order": list(order)}
            for side in order:
                fn = run_hogkit if side == "hogkit" else run_torch
                got[side] = fn(wl, params, data, nprocs, steps)
            got["ratio"] = got["hogkit"]["steps_per_s"] / got["torch"]["steps_per_s"]
            rounds_out.append(got)
        med = {side: {"steps_per_s": statistics.median(g[side]["steps_per_s"]
                                                        for g in rounds_out),
                      "span_steps_per_s": statistics.median(g[side]["span_steps_per_s"]
                                                             for g in rounds_out),
                      "final_loss": statistics.median(g[side]["final_loss"]
                                                      for g in rounds_out)}
               for side in ("hogkit", "torch")}
        out["processes"][str(nprocs)] = {
            "rounds": rounds_out, "median": med,
            "ratio": statistics.median(g["ratio"] for g in rounds_out),
            "ratio_range": [min(g["ratio"] for g in rounds_out),
                            max(g["ratio"] for g in rounds_out)]}
    out["step_cost"] = step_cost(wl, params, data, cost_blocks, cost_steps)
    return out


def run(quick=False, sizes=None, steps=None, rounds=None) -> dict:
    """Both sides, every size, 2 and 1 processes, ``rounds`` rounds; see the module
    doc. ``steps``: loop steps per worker (default: ``STEPS`` per size, or the quick
    figure)."""
    q = QUICK if quick else {}
    sizes = sizes or q.get("sizes", tuple(SIZES))
    rounds = rounds or q.get("rounds", ROUNDS)
    result = {"scenario": "own_loop", "quick": quick, "cpus": os.cpu_count(),
              "lr": LR, "batch": BATCH, "rounds": rounds, "seed": SEED, "sizes": {}}
    for name in sizes:
        n = steps or q.get("steps", STEPS[name])
        result["sizes"][name] = _size(name, SIZES[name], n, rounds,
                                      q.get("cost_blocks", COST_BLOCKS),
                                      q.get("cost_steps", COST_STEPS))
    result["ratios"] = {f"{name}_{p}proc_hogkit_over_torch": s["processes"][p]["ratio"]
                        for name, s in result["sizes"].items() for p in s["processes"]}
    return result


def format_table(result) -> str:
    lines = [f"own loop, digits MLP, batch {result['batch']}, lr {result['lr']}, "
             f"{result['rounds']} round(s), steps/s summed over workers (median)"]
    head = (f"  {'size':<8}{'procs':>6}{'torch steps/s':>15}{'hogkit steps/s':>16}"
            f"{'ratio':>8}{'  (range)':<16}{'loss torch':>11}{'loss hogkit':>12}")
    lines.append(head)
    for name, s in result["sizes"].items():
        for p, f in s["processes"].items():
            m = f["median"]
            lo, hi = f["ratio_range"]
            lines.append(f"  {name:<8}{p:>6}{m['torch']['steps_per_s']:>15,.0f}"
                         f"{m['hogkit']['steps_per_s']:>16,.0f}{f['ratio']:>8.3f}"
                         f"{f'  ({lo:.3f}-{hi:.3f})':<16}"
                         f"{m['torch']['final_loss']:>11.4f}"
                         f"{m['hogkit']['final_loss']:>12.4f}")
    lines.append("  one process, no spawn, µs per step() / per iteration (median):")
    for name, s in result["sizes"].items():
        c = s["step_cost"]
        lines.append(f"  {name:<8} torch {c['torch_step_us']:.1f} / "
                     f"{c['torch_iteration_us']:.1f}, hogkit {c['hogkit_step_us']:.1f} / "
                     f"{c['hogkit_iteration_us']:.1f}: overhead {c['overhead_us']:+.1f} µs "
                     f"a step, predicted 1-process ratio "
                     f"{c['predicted_ratio_1proc']:.3f}")
    return "\n".join(lines)
