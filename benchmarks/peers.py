"""Scenario ``peers``: hogkit against what a user would pick instead, on the same data.

Matrix factorisation (hogkit's ``mf`` data, a preset, seed 0):

- **plain loop**: a numba per-rating SGD loop (fastmath, float32, in place), one
  thread, reading the ratings in their stored (shuffled) order: the practical ceiling
  of a compiled Hogwild! loop on this machine;
- **LIBMF** 0.9.2 (FPSG: block-scheduled per-rating SGD with adaptive learning rates),
  1 and 2 threads: the ``libmf`` package's build (``pip install -e ".[bench]"``) and,
  when a C++ compiler is present, an AVX build of its sdist
  (``-O3 -DUSEAVX -mavx -mfma``), compiled once into ``~/.cache/hogkit``; the faster of
  the two is the one compared;
- **hogkit** ``train`` with the compiled step core, 1 and 2 workers: its **defaults**
  (what ``train("mf")`` and ``hogkit run`` take: the sample lane in FPSG's **block
  order**, ``order="blocks"``, workers holding blocks of the matrix no other worker
  holds, with LIBMF's **row-wise AdaGrad** from 1), and with plain SGD the **sample
  lane** (per-sample Hogwild!, each rating applied at once, ``lane="sample"``) in the
  shuffled sweep and the **batch lane** (the exact minibatch step, ``lane="batch"``);
  and the Python step (``engine="python"``), 1 worker.

Sparse logistic regression (``logreg``): a plain numba per-sample logistic SGD loop
against hogkit compiled on each lane, 1 and 2 workers.

The digits MLP (``mlp``, torch): **torch's own Hogwild! recipe** (``model.share_memory()``,
spawned ``torch.multiprocessing`` processes, each a standard ``torch.optim.SGD`` loop of
``zero_grad / forward / backward / step`` on random minibatches, one torch thread each,
as in pytorch/examples ``mnist_hogwild`` minus its DataLoader) against hogkit (the
Python engine: torch computes the gradient, hogkit's kernels apply it), 1 and 2
processes, same model, same initial weights, same data, same batch.

Every contender runs at its own learning rate, the best of a small grid by time to the
target (the grids are in ``LR``). Two figures per contender: **throughput** (samples a
second over a fixed budget) and **time to a training-loss target**. Time to target is
measured the same way for everyone who cannot be paused: runs of increasing length
(epochs for the loops and LIBMF, total steps for hogkit), each timed and evaluated on
its final parameters; the first that reaches the target gives its time (a hogkit
curve stops after a run longer than ``CAP_OVER_LIBMF`` x LIBMF's best time to
target). hogkit's time is training time (from the start barrier; spawning and imports
excluded), LIBMF's is
the whole ``fit`` call (its setup, ~20 ms for the default preset, included: it cannot
be separated). The JSON holds every run; ``plot`` draws loss against seconds for all
contenders.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from numba import njit

import hogkit
from hogkit import workloads
from hogkit.workloads.mf import MatrixFactorization

#: learning-rate grids, per contender family (each picks its best by time to target)
#: (mf: the step of one rating; LIBMF's eta is the base of its adaptive step; logreg:
#: the plain loop's lr is per sample, hogkit's gradient is the batch mean, so its lr is
#: per batch: 2.0 at batch 64 is ~0.03 a sample)
#: (LIBMF's and the defaults' best was 0.3, the top of (0.1, 0.2, 0.3), in the run at
#: 79d7e7d: 0.4 is now in both grids, so a worse lr is tried on both sides)
LR = {"plain_mf": (0.05, 0.1, 0.15), "libmf": (0.1, 0.2, 0.3, 0.4),
      "hogkit_mf": (0.05, 0.1, 0.15), "hogkit_mf_default": (0.1, 0.2, 0.3, 0.4),
      "plain_logreg": (0.03, 0.06, 0.12), "hogkit_logreg": (2.0, 4.0, 8.0)}
TARGETS = {"default": 0.012, "large": 0.012, "hot": 0.05}
LOGREG_TARGET = 0.45
#: the MLP: per-sample-averaged gradients, lr per batch; training cross-entropy target
#: (0.2, the top of (0.05, 0.1, 0.2), was every contender's best at c866b38, and 0.4,
#: the top of (.., 0.4), five of six's at 7d95510: 0.8 is in)
MLP_LR = (0.05, 0.1, 0.2, 0.4, 0.8)
#: the rate rounds (``_mlp_rates``): steps in all per contender and round (~2 s), the
#: rounds, and the lr (torch's example's SGD setting on this batch)
MLP_RATE_STEPS, MLP_RATE_ROUNDS, MLP_RATE_LR = 8000, 6, 0.1
MLP_TARGET = 0.05
#: mf's rate rounds (``_mf_rates``): seconds per contender and round, and the rounds.
#: The plain loop and one hogkit worker (SGD, per-sample lane, the sweep) alternate, so
#: the machine's drift (the plain loop ranged 83-114 M ratings/s across invocations of
#: one day) falls on both sides of each round's ratio
MF_RATE_SECONDS, MF_RATE_ROUNDS = 3.0, 6
#: mf's SGD contenders in the sweep: ratings a step on the per-sample lane (the
#: defaults' step) and the batch lane's minibatch (the compiled step core's best for
#: SGD: a larger minibatch's summed gradient needs a smaller lr)
MF_SAMPLE_BATCH, MF_MINIBATCH = 4096, 64
MLP_EPOCHS = (2, 4, 8, 12, 16, 24, 32, 48)
EPOCHS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24)
#: a hogkit lr's curve stops after a run longer than this many times LIBMF's best time
#: to the target (it is then "not reached" within that: the race is lost already)
CAP_OVER_LIBMF = 4.0
#: throughput runs per hogkit contender (the median is reported)
ROUNDS = 3
#: --quick: the same contenders on the small "hot" mf preset, each at the middle lr of
#: its grid only, at most QUICK_EPOCHS epochs, a hogkit contender's throughput from its
#: curve's last run (no runs of their own), torch's recipe with shared data and its rate
#: rounds at 2 processes only (a smoke run of the whole comparison, not a measurement)
QUICK_EPOCHS = 2


def _lrs(grid, quick):
    return grid[len(grid) // 2:len(grid) // 2 + 1] if quick else grid


# --- the plain loops (the ceiling) ------------------------------------------------------

@njit(fastmath=True, nogil=True)
def plain_mf_epoch(P, Q, u, i, r, lr):
    """One pass of per-rating SGD over the ratings in stored order, in place."""
    K = P.shape[1]
    a = np.float32(lr)
    for t in range(r.shape[0]):
        uu = u[t]
        ii = i[t]
        pred = np.float32(0.0)
        for k in range(K):
            pred += P[uu, k] * Q[ii, k]
        e = r[t] - pred
        for k in range(K):
            pk = P[uu, k]
            qk = Q[ii, k]
            P[uu, k] = pk + a * e * qk
            Q[ii, k] = qk + a * e * pk


@njit(fastmath=True, nogil=True)
def plain_logreg_epoch(w, indptr, indices, values, y, lr):
    """One pass of per-sample logistic SGD in stored order, in place."""
    a = lr
    for s in range(y.shape[0]):
        m = 0.0
        for j in range(indptr[s], indptr[s + 1]):
            m += w[indices[j]] * values[j]
        p = 1.0 / (1.0 + math.exp(-m)) if m >= 0 else math.exp(m) / (1.0 + math.exp(m))
        d = p - y[s]
        for j in range(indptr[s], indptr[s + 1]):
            w[indices[j]] -= a * d * values[j]


def _plain_curve(epoch, params, args, loss, target, max_epochs):
    """Cumulative training time and loss after each epoch (evaluation not timed)."""
    curve, t = [], 0.0
    for e in range(1, max_epochs + 1):
        t0 = time.perf_counter()
        epoch(*params, *args)
        t += time.perf_counter() - t0
        curve.append({"epochs": e, "t": t, "loss": loss()})
        if curve[-1]["loss"] <= target:
            break
    return curve


# --- LIBMF through ctypes ------------------------------------------------------------------

class _MFParam(ctypes.Structure):
    _fields_ = [("fun", ctypes.c_int), ("k", ctypes.c_int), ("nr_threads", ctypes.c_int),
                ("nr_bins", ctypes.c_int), ("nr_iters", ctypes.c_int),
                ("lambda_p1", ctypes.c_float), ("lambda_p2", ctypes.c_float),
                ("lambda_q1", ctypes.c_float), ("lambda_q2", ctypes.c_float),
                ("eta", ctypes.c_float), ("do_nmf", ctypes.c_bool),
                ("quiet", ctypes.c_bool), ("copy_data", ctypes.c_bool)]


class _MFModel(ctypes.Structure):
    _fields_ = [("fun", ctypes.c_int), ("m", ctypes.c_int), ("n", ctypes.c_int),
                ("k", ctypes.c_int), ("b", ctypes.c_float),
                ("P", ctypes.POINTER(ctypes.c_float)), ("Q", ctypes.POINTER(ctypes.c_float))]


class LibMF:
    """LIBMF 0.9.2's C interface (``fit_interface``, ``get_P``/``get_Q``) on a shared
    library: the same entry points the ``libmf`` package's binding uses."""

    def __init__(self, path, label):
        self.path, self.label = path, label
        self.lib = ctypes.CDLL(path)
        f = self.lib.fit_interface
        f.restype = ctypes.POINTER(_MFModel)
        f.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(_MFParam))
        d = self.lib.mf_destroy_model
        d.restype = None
        d.argtypes = (ctypes.POINTER(ctypes.POINTER(_MFModel)),)

    def fit(self, X, *, k, threads, iters, eta):
        """``(seconds, P, Q)`` of one ``fit`` of the (n, 3) float32 ratings ``X`` (no
        regularisation, like hogkit's default), run in a child process that is watched.

        LIBMF 0.9.2's scheduler can deadlock as a fit ends (cjlin1/libmf#12): after the
        last ``resume()`` its threads go on taking blocks until they see ``terminate()``,
        and if they finish a whole round first (the caller's thread descheduled, on a
        small data set) each waits in ``put_job`` for a resume that never comes, while
        ``fit`` joins them. It hung a CI run here (session 52). A child whose CPU time
        stops moving for :data:`STALL_S` before the fit returns is killed and the fit run
        again (the seconds are measured inside the child, around ``fit_interface``
        alone, as before)."""
        import multiprocessing as mp

        from hogkit.procfs import cpu_ticks
        # fork, not spawn: the child runs LIBMF's C++ alone (no numba, no torch), and a
        # spawned interpreter per fit cost the quick scenario ~100 s; a child stuck on a
        # lock taken across the fork stalls too, and the watchdog takes it the same way
        ctx = mp.get_context("fork")
        for _ in range(FIT_TRIES):
            got, send = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_fit_child, daemon=True,
                                args=(self.path, X, k, threads, iters, eta, send))
            child.start()
            send.close()
            last, still = None, 0.0
            while not got.poll(0.25):
                if not child.is_alive():
                    raise RuntimeError(f"{self.label}: the fit's child process died "
                                       f"(exit code {child.exitcode})")
                ticks = cpu_ticks(child.pid)
                still = still + 0.25 if ticks == last else 0.0
                last = ticks
                if still >= STALL_S:
                    break
            else:
                out = got.recv()
                child.join()
                return out
            child.kill()
            child.join()
        raise RuntimeError(f"{self.label}: the fit deadlocked {FIT_TRIES} times in a row "
                           f"(cjlin1/libmf#12)")

    def fit_here(self, X, *, k, threads, iters, eta):
        """:meth:`fit` in this process, unwatched."""
        p = _MFParam(0, k, threads, max(26, 2 * threads), iters, 0.0, 0.0, 0.0, 0.0, eta,
                     False, True, True)
        ptr = X.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        t0 = time.perf_counter()
        model = self.lib.fit_interface(X.shape[0], ptr, ctypes.byref(p))
        dt = time.perf_counter() - t0
        m = model.contents
        P = np.ctypeslib.as_array(m.P, shape=(m.m * m.k,)).reshape(m.m, m.k).copy()
        Q = np.ctypeslib.as_array(m.Q, shape=(m.n * m.k,)).reshape(m.n, m.k).copy()
        self.lib.mf_destroy_model(ctypes.byref(model))     # LIBMF's model is ours to free
        return dt, P, Q


#: a LIBMF fit whose child uses no CPU for this long is taken as deadlocked; tries
STALL_S, FIT_TRIES = 5.0, 3


def _fit_child(path, X, k, threads, iters, eta, send):
    """:meth:`LibMF.fit`'s child: one fit, its result sent back."""
    send.send(LibMF(path, "").fit_here(X, k=k, threads=threads, iters=iters, eta=eta))
    send.close()


def libmf_builds():
    """The LIBMF shared libraries available: the ``libmf`` package's, and an AVX build
    of its sdist when ``g++`` is here (built once into ``~/.cache/hogkit/libmf``)."""
    out = []
    spec = importlib.util.find_spec("libmf")
    if spec is not None and spec.origin:
        site = os.path.dirname(os.path.dirname(spec.origin))
        found = sorted(glob.glob(os.path.join(site, "libmf*.so")))
        if found:
            out.append(LibMF(found[0], "LIBMF (package build)"))
    avx = _avx_build()
    if avx:
        out.append(LibMF(avx, "LIBMF (AVX build)"))
    return out


def _avx_build():
    cache = os.path.join(os.path.expanduser("~"), ".cache", "hogkit", "libmf")
    so = os.path.join(cache, "libmf_avx.so")
    if os.path.exists(so):
        return so
    if shutil.which("g++") is None:
        return None
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            subprocess.run([sys.executable, "-m", "pip", "download", "libmf==0.9.2",
                            "--no-deps", "--no-binary", ":all:", "-d", tmp, "-q"],
                           check=True, timeout=300, capture_output=True)
            import tarfile
            with tarfile.open(glob.glob(os.path.join(tmp, "libmf-*.tar.gz"))[0]) as t:
                t.extractall(tmp)
            src = glob.glob(os.path.join(tmp, "libmf-*", "src_cpp"))[0]
            subprocess.run(["g++", "-O3", "-std=c++11", "-DUSEAVX", "-mavx", "-mfma",
                            "-fPIC", "-shared", "-pthread",
                            os.path.join(src, "libmf_interface.cpp"),
                            os.path.join(src, "mf.cpp"), "-o", so + ".tmp"],
                           check=True, timeout=600, capture_output=True)
            os.replace(so + ".tmp", so)
        except (subprocess.SubprocessError, OSError, IndexError):
            return None
    return so


# --- measurement -----------------------------------------------------------------------

def _best(curves):
    """The run (lr) with the earliest time to target, else the lowest final loss (a
    diverged or non-finite run last)."""
    def key(c):
        hit = c["time_to_target"]
        last = c["curve"][-1]["loss"]
        if hit is not None:
            return (0, hit)
        return (1, last) if np.isfinite(last) and not c.get("diverged") else (2, 0.0)
    return min(curves, key=key)


def _hit(curve, target):
    return next((p["t"] for p in curve if p["loss"] <= target), None)


def _mf_plain(wl, params, data, target, max_epochs, quick=False):
    u, i, r = data["u"], data["i"], data["r"]
    runs = []
    for lr in _lrs(LR["plain_mf"], quick):
        P, Q = params["P"].copy(), params["Q"].copy()
        plain_mf_epoch(P[:2].copy(), Q[:2].copy(), u[:0], i[:0], r[:0], lr)   # compile
        curve = _plain_curve(plain_mf_epoch, (P, Q), (u, i, r, lr),
                             lambda: wl.loss({"P": P, "Q": Q}, data), target, max_epochs)
        runs.append({"lr": lr, "curve": curve, "time_to_target": _hit(curve, target)})
    best = _best(runs)
    pts = best["curve"]
    rate = len(r) * pts[-1]["epochs"] / pts[-1]["t"]
    return {"label": "plain numba loop, 1 thread", "samples_per_s": rate, **best,
            "all_lr": runs}


def _plain_rate(params, data, lr, seconds):
    """Ratings a second of the plain loop, whole epochs back to back for ``seconds``
    (from a fresh copy of the initial factors)."""
    u, i, r = data["u"], data["i"], data["r"]
    P, Q = params["P"].copy(), params["Q"].copy()
    done, t0 = 0, time.perf_counter()
    while True:
        plain_mf_epoch(P, Q, u, i, r, lr)
        done += len(r)
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return done / dt


def _mf_rates(wl, params, data, c, seconds, rounds):
    """Ratings a second of the plain loop and of one hogkit worker (``train``, SGD on
    the per-sample lane in the sweep, record on, from its start barrier) over
    ``seconds`` each, in ``rounds`` rounds whose order alternates (plain first in even
    rounds); each at its best lr of the curves in ``c``. Returns the rounds and the
    medians, with each round's hogkit / plain."""
    from hogkit.engine.runtime import train
    from hogkit.rules.core import SGD
    h, plain_lr = c["hogkit_sample_1"], c["plain"]["lr"]
    out = []
    for k in range(rounds):
        got = {"order": ["plain", "hogkit"] if k % 2 == 0 else ["hogkit", "plain"]}
        for name in got["order"]:
            if name == "plain":
                got["plain"] = _plain_rate(params, data, plain_lr, seconds)
            else:
                run = train(wl, workers=1, engine=hogkit.Engine("compiled", lane="sample"),
                            outputs=hogkit.Outputs(eval_every=None, progress=False,
                                                   keep_params=False),
                            seconds=seconds, rule=SGD(h["lr"]), batch=h["batch"])
                got["hogkit"] = run.extra["samples"] / run.wall_s
        got["ratio"] = got["hogkit"] / got["plain"]
        out.append(got)
    med = {k: statistics.median(g[k] for g in out) for k in ("plain", "hogkit", "ratio")}
    return {"seconds": seconds, "plain_lr": plain_lr, "hogkit_lr": h["lr"],
            "batch": h["batch"], "rounds": out, "median": med,
            "ratio_range": [min(g["ratio"] for g in out), max(g["ratio"] for g in out)]}


def _mf_libmf(lib, wl, data, target, threads, max_epochs, quick=False):
    X = np.stack([data["u"].astype(np.float32), data["i"].astype(np.float32), data["r"]],
                 axis=1)
    n = len(X)
    runs = []
    for eta in _lrs(LR["libmf"], quick):
        curve = []
        for iters in EPOCHS:
            if iters > max_epochs:
                break
            dt, P, Q = lib.fit(X, k=wl.rank, threads=threads, iters=iters, eta=eta)
            curve.append({"epochs": iters, "t": dt, "loss": wl.loss({"P": P, "Q": Q}, data)})
            if curve[-1]["loss"] <= target:
                break
        runs.append({"lr": eta, "curve": curve, "time_to_target": _hit(curve, target)})
    best = _best(runs)
    # throughput from the longest fit: ratings over its time (its setup included)
    pts = best["curve"]
    return {"label": f"{lib.label}, {threads} thread{'s' * (threads > 1)}",
            "samples_per_s": n * pts[-1]["epochs"] / pts[-1]["t"], **best, "all_lr": runs}


def _hogkit(wl, target, workers, engine, lrs, max_epochs, n_samples, rate_seconds,
            grid=EPOCHS, lane="auto", batch=None, rule=None, cap=None):
    """hogkit ``train`` at each lr of ``lrs`` (``rule(lr)``: the update rule, SGD when
    None), then its throughput at the best (``rate_seconds`` None, in --quick: the best
    curve's last run's); an lr's curve stops after a run longer than ``cap`` seconds
    (None: no cap). ``lane="auto"`` and ``batch=None`` leave them to the workload's
    defaults, as a user's ``train(wl)`` does."""
    from hogkit.errors import WorkerFailed
    from hogkit.rules.core import SGD
    from hogkit.engine.runtime import train
    rule = rule or SGD
    knobs = dict(engine=hogkit.Engine(engine, lane=lane),
                 outputs=hogkit.Outputs(eval_every=None, progress=False, keep_params=False))
    if batch is not None:
        knobs["batch"] = batch
    batch = batch or wl.defaults().batch
    runs = []
    for lr in lrs:
        curve, diverged = [], False
        for epochs in grid:
            if epochs > max_epochs:
                break
            steps = max(workers, int(epochs * n_samples / batch))
            try:
                run = train(wl, workers=workers, steps=steps, rule=rule(lr), **knobs)
            except WorkerFailed as e:          # a non-finite gradient: this lr diverges
                if "non-finite" not in str(e):
                    raise
                diverged = True
                break
            curve.append({"epochs": epochs, "t": run.wall_s, "loss": run.final_loss,
                          "staleness_mean": run.staleness["update_gap"]["mean"],
                          "samples_per_s": run.extra["samples"] / run.wall_s})
            if run.final_loss <= target or (cap is not None and run.wall_s > cap):
                break
        if curve:
            runs.append({"lr": lr, "curve": curve, "time_to_target": _hit(curve, target),
                         "diverged": diverged})
    best = _best(runs)
    rates, budget = [], {"seconds": rate_seconds}
    if rate_seconds is None:
        rates, budget = [best["curve"][-1]["samples_per_s"]], {"curve": True}
    for _ in range(0 if rate_seconds is None else 1 if rate_seconds < 1 else ROUNDS):
        try:
            run = train(wl, workers=workers, rule=rule(best["lr"]), **budget, **knobs)
        except WorkerFailed as e:
            # the lr held over the curve's epochs but not over rate_seconds (plain SGD
            # at the top of its grid, long past the target): time the curve's horizon
            if "non-finite" not in str(e) or "steps" in budget:
                raise
            budget = {"steps": max(workers, int(max_epochs * n_samples / batch))}
            run = train(wl, workers=workers, rule=rule(best["lr"]), **budget, **knobs)
        rates.append(run.extra["samples"] / run.wall_s)
    where = f"{engine}, {lane} lane" if engine == "compiled" else engine
    if getattr(wl, "order", "sweep") == "blocks":
        where += ", block order"
    name = type(rule(1.0)).__name__
    if name != "SGD":
        where += f", {name}" + (" row-wise" if getattr(rule(1.0), "rowwise", False) else "")
    return {"label": f"hogkit {where}, {workers} worker{'s' * (workers > 1)}",
            "samples_per_s": statistics.median(rates), "rates": rates, "engine": engine,
            "lane": lane, "workers": workers, "batch": batch, "rate_budget": budget, **best,
            "all_lr": runs}


def _mf(preset, quick):
    wl = workloads.get("mf", preset=preset, order="sweep")   # the stored, shuffled order
    params, data = wl.build(0)
    target = TARGETS[preset]
    max_epochs = QUICK_EPOCHS if quick else 16
    n = len(data["r"])
    rate_s = None if quick else 3.0
    out = {"preset": preset, "target_mse": target, "n_ratings": n,
           "initial_mse": wl.loss(params, data), "contenders": {}}
    c = out["contenders"]
    c["plain"] = _mf_plain(wl, params, data, target, max_epochs, quick)
    libs = libmf_builds()
    for threads in (1, 2):
        got = [_mf_libmf(lib, wl, data, target, threads, max_epochs, quick) for lib in libs]
        if got:
            best = max(got, key=lambda g: g["samples_per_s"])
            best["builds"] = {g["label"]: g["samples_per_s"] for g in got}
            c[f"libmf_{threads}"] = best
    # a hogkit curve stops past CAP_OVER_LIBMF x LIBMF's best time to target
    hits = [x["time_to_target"] for k, x in c.items() if k.startswith("libmf")
            and x["time_to_target"]]
    cap = CAP_OVER_LIBMF * min(hits) if hits and not quick else None
    out["cap_s"] = cap
    # hogkit's defaults, reached as a Python user builds the workload (the same as
    # train("mf") and hogkit run take: one set of defaults), the rule's lr tuned
    defaults = MatrixFactorization(preset)
    default_rule = defaults.defaults().rule
    for workers in (1, 2):
        c[f"hogkit_default_{workers}"] = _hogkit(
            defaults, target, workers, "auto", _lrs(LR["hogkit_mf_default"], quick),
            max_epochs, n, rate_s, rule=default_rule.with_lr, cap=cap)
        c[f"hogkit_sample_{workers}"] = _hogkit(wl, target, workers, "compiled",
                                                _lrs(LR["hogkit_mf"], quick), max_epochs,
                                                n, rate_s, lane="sample",
                                                batch=MF_SAMPLE_BATCH, cap=cap)
        c[f"hogkit_compiled_{workers}"] = _hogkit(wl, target, workers, "compiled",
                                                  _lrs(LR["hogkit_mf"], quick), max_epochs,
                                                  n, rate_s, lane="batch",
                                                  batch=MF_MINIBATCH, cap=cap)
    c["hogkit_python_1"] = _hogkit(wl, target, 1, "python", LR["hogkit_mf"][:1],
                                   min(max_epochs, 4), n, rate_s, batch=MF_MINIBATCH)
    out["rates"] = _mf_rates(wl, params, data, c, 0.5 if quick else MF_RATE_SECONDS,
                             1 if quick else MF_RATE_ROUNDS)
    return out


def _logreg(quick):
    wl = workloads.get("logreg")
    params, data = wl.build(0)
    n = len(data["y"])
    max_epochs = QUICK_EPOCHS if quick else 16
    out = {"target_logloss": LOGREG_TARGET, "n_samples": n,
           "initial_logloss": wl.loss(params, data), "contenders": {}}
    runs = []
    args = (data["indptr"], data["indices"], data["values"], data["y"])
    for lr in _lrs(LR["plain_logreg"], quick):
        w = params["w"].copy()
        plain_logreg_epoch(w, *args[:3], data["y"][:0], lr)       # compile (0 samples)
        curve = _plain_curve(plain_logreg_epoch, (w,), (*args, lr),
                             lambda: wl.loss({"w": w}, data), LOGREG_TARGET, max_epochs)
        runs.append({"lr": lr, "curve": curve,
                     "time_to_target": _hit(curve, LOGREG_TARGET)})
    best = _best(runs)
    out["contenders"]["plain"] = {"label": "plain numba loop, 1 thread",
                                  "samples_per_s": n * best["curve"][-1]["epochs"]
                                  / best["curve"][-1]["t"], **best, "all_lr": runs}
    for workers in (1, 2):
        for lane in ("sample", "batch"):
            key = f"hogkit_{'sample' if lane == 'sample' else 'compiled'}_{workers}"
            out["contenders"][key] = _hogkit(
                wl, LOGREG_TARGET, workers, "compiled", _lrs(LR["hogkit_logreg"], quick),
                max_epochs, n, None if quick else 3.0, lane=lane)
    return out


# --- torch's share_memory() Hogwild! recipe ------------------------------------------------

def _torch_worker(rank, model, X, y, lr, steps, batch, seed, barrier, out):
    """One process of the recipe: a plain torch.optim loop on the shared model.
    ``X``, ``y``: shared-memory tensors (the ``shared`` variant), or numpy arrays
    this process received pickled, its own copy (``private``: as torch's example
    and its users write it)."""
    import torch
    from torch.nn.functional import cross_entropy
    torch.set_num_threads(1)
    if isinstance(X, np.ndarray):
        X, y = torch.from_numpy(X), torch.from_numpy(y)
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    n = X.shape[0]
    # torch's first backward and step initialise lazily (~ms): do them on a private
    # copy before the barrier, as hogkit's workers load their kernels before theirs
    import copy
    warm = copy.deepcopy(model)
    warm_opt = torch.optim.SGD(warm.parameters(), lr=lr)
    warm_opt.zero_grad()
    cross_entropy(warm(X[:batch]), y[:batch]).backward()
    warm_opt.step()
    barrier.wait()
    t0 = time.perf_counter()
    for _ in range(steps):
        idx = torch.randint(0, n, (batch,), generator=g)
        opt.zero_grad()
        cross_entropy(model(X[idx]), y[idx]).backward()
        opt.step()
    out[rank] = time.perf_counter() - t0


def _torch_hogwild(wl, params, data, lr, processes, steps_each, batch, seed=0,
                   data_in="shared"):
    """Train with the recipe; returns (training seconds: from the start barrier to the
    last process's last step, as hogkit's wall_s; final params as numpy).
    ``data_in``: "shared" (the data tensors in shared memory, indexed by every
    process) or "private" (each process its own copy, as torch's mnist_hogwild
    example and its users have it)."""
    import torch
    import torch.multiprocessing as tmp
    from hogkit.workloads.mlp import _module
    torch.set_num_threads(1)
    model = _module(wl.hidden, wl.dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(params[name]))
    model.share_memory()
    if data_in == "shared":
        X = torch.from_numpy(data["X"]).share_memory_()
        y = torch.from_numpy(data["y"]).share_memory_()
    elif data_in == "private":
        X, y = data["X"], data["y"]
    else:
        raise ValueError(f"data_in={data_in!r}: 'shared' or 'private'")
    ctx = tmp.get_context("spawn")
    barrier = ctx.Barrier(processes + 1)
    out = ctx.Array("d", processes)
    procs = [ctx.Process(target=_torch_worker, daemon=True,
                         args=(r, model, X, y, lr, steps_each, batch, seed, barrier, out))
             for r in range(processes)]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=120)
        for p in procs:
            p.join(timeout=600)
        dt = max(out[:])
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"a torch Hogwild! process failed: "
                               f"{[p.exitcode for p in procs]}")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    final = {name: p.detach().numpy().copy() for name, p in model.named_parameters()}
    return dt, final


def _mlp_torch(wl, params, data, processes, max_epochs, batch, lrs=MLP_LR,
               data_in="shared"):
    n = len(data["y"])
    runs = []
    for lr in lrs:
        curve = []
        for epochs in MLP_EPOCHS:
            if epochs > max_epochs:
                break
            steps_each = max(1, int(epochs * n / batch / processes))
            dt, final = _torch_hogwild(wl, params, data, lr, processes, steps_each, batch,
                                       data_in=data_in)
            loss = wl.loss(final, data)
            curve.append({"epochs": epochs, "t": dt, "loss": loss,
                          "samples": steps_each * processes * batch})
            if not np.isfinite(loss) or loss <= MLP_TARGET:
                break
        runs.append({"lr": lr, "curve": curve, "time_to_target": _hit(curve, MLP_TARGET),
                     "diverged": not np.isfinite(curve[-1]["loss"])})
    best = _best(runs)
    last = best["curve"][-1]
    return {"label": f"torch share_memory Hogwild!, {data_in} data, {processes} proc"
                     f"{'s' * (processes > 1)}",
            "samples_per_s": last["samples"] / last["t"], "workers": processes,
            "batch": batch, "data_in": data_in, **best, "all_lr": runs}


def _mlp_rates(wl, params, data, processes, steps, rounds, lr=MLP_RATE_LR):
    """Steps a second of hogkit ``train`` (the Python engine, record on) and of the
    recipe with private and with shared data, ``steps`` in all each, in ``rounds``
    rounds whose order rotates (round r starts with contender r mod 3): every figure
    from its start barrier to its last process's last step. Returns the rounds and,
    per round, hogkit's steps/s over each recipe's."""
    from hogkit.engine.runtime import train
    from hogkit.rules.core import SGD
    batch = wl.default_batch
    names = ("hogkit", "torch_private", "torch_shared")
    out = []
    for r in range(rounds):
        got = {"order": list(names[r % 3:] + names[:r % 3])}
        for name in got["order"]:
            if name == "hogkit":
                run = train(wl, workers=processes, engine="python",
                            outputs=hogkit.Outputs(eval_every=None, progress=False,
                                                   keep_params=False),
                            steps=steps, rule=SGD(lr), batch=batch)
                got[name] = {"steps_per_s": run.updates / run.wall_s,
                             "loss": run.final_loss}
            else:
                each = steps // processes
                dt, final = _torch_hogwild(wl, params, data, lr, processes, each, batch,
                                           seed=r, data_in=name.split("_")[1])
                got[name] = {"steps_per_s": each * processes / dt,
                             "loss": wl.loss(final, data)}
        got["ratio_private"] = (got["hogkit"]["steps_per_s"]
                                / got["torch_private"]["steps_per_s"])
        got["ratio_shared"] = (got["hogkit"]["steps_per_s"]
                               / got["torch_shared"]["steps_per_s"])
        out.append(got)
    med = {k: statistics.median(g[k] for g in out) for k in ("ratio_private",
                                                              "ratio_shared")}
    for name in names:
        med[f"{name}_steps_per_s"] = statistics.median(g[name]["steps_per_s"] for g in out)
    return {"processes": processes, "steps": steps, "lr": lr, "rounds": out,
            "median": med}


def _mlp(quick):
    wl = workloads.get("mlp")
    params, data = wl.build(0)
    n = len(data["y"])
    max_epochs = QUICK_EPOCHS if quick else 48
    batch = wl.default_batch
    out = {"target_loss": MLP_TARGET, "n_samples": n, "batch": batch,
           "initial_loss": wl.loss(params, data), "contenders": {}, "rates": {}}
    c = out["contenders"]
    for workers in (1, 2):
        for data_in in ("private",) if quick and workers == 1 else ("private", "shared"):
            key = f"torch_hogwild_{workers}" + ("_private" if data_in == "private" else "")
            c[key] = _mlp_torch(wl, params, data, workers, max_epochs, batch,
                                _lrs(MLP_LR, quick), data_in=data_in)
        c[f"hogkit_python_{workers}"] = _hogkit(wl, MLP_TARGET, workers, "python",
                                                _lrs(MLP_LR, quick), max_epochs, n,
                                                None if quick else 3.0, grid=MLP_EPOCHS)
        if not quick or workers == 2:
            out["rates"][str(workers)] = _mlp_rates(
                wl, params, data, workers, 200 if quick else MLP_RATE_STEPS,
                1 if quick else MLP_RATE_ROUNDS)
    return out


#: the problems ``run(only=...)`` (``hogkit bench peers --only``) may pick
SECTIONS = ("mf", "logreg", "mlp")


def run(quick=False, presets=None, only=None) -> dict:
    """Every section (``only``: a comma-separated subset of :data:`SECTIONS`)."""
    presets = presets or (("hot",) if quick else ("default", "large"))
    pick = SECTIONS if only is None else tuple(x.strip() for x in only.split(","))
    unknown = [x for x in pick if x not in SECTIONS]
    if unknown:
        raise ValueError(f"peers: unknown section(s) {unknown}; pick from {SECTIONS}")
    result = {"scenario": "peers", "quick": quick, "cpus": os.cpu_count(), "only": only}
    if "mf" in pick:
        result["mf"] = {p: _mf(p, quick) for p in presets}
    if "logreg" in pick:
        result["logreg"] = _logreg(quick)
    if "mlp" in pick:
        result["mlp"] = _mlp(quick)
    result["ratios"] = _ratios(result)
    return result


def _time_ratio(r, key, slow, fast):
    """``r[key] = slow's time to target / fast's`` when both reached it."""
    a, b = fast.get("time_to_target"), slow.get("time_to_target")
    if a and b:
        r[key] = b / a


def _ratios(result):
    r = {}
    for p, m in result.get("mf", {}).items():
        c = m["contenders"]
        plain = c["plain"]["samples_per_s"]
        for lane in ("default", "sample", "compiled"):
            one, two = c[f"hogkit_{lane}_1"], c[f"hogkit_{lane}_2"]
            r[f"mf_{p}_{lane}1_over_plain"] = one["samples_per_s"] / plain
            if lane == "sample" and "rates" in m:     # alternating rounds: the bar's figure
                r[f"mf_{p}_rounds_sample1_over_plain"] = m["rates"]["median"]["ratio"]
            r[f"mf_{p}_{lane}2_over_{lane}1"] = two["samples_per_s"] / one["samples_per_s"]
            _time_ratio(r, f"mf_{p}_plain_time_over_{lane}2_time", c["plain"], two)
            for w in (1, 2):
                lib, h = c.get(f"libmf_{w}"), c[f"hogkit_{lane}_{w}"]
                if lib:
                    r[f"mf_{p}_{lane}{w}_over_libmf{w}_rate"] = (h["samples_per_s"]
                                                                 / lib["samples_per_s"])
                    _time_ratio(r, f"mf_{p}_libmf{w}_time_over_{lane}{w}_time", lib, h)
    if "logreg" in result:
        c = result["logreg"]["contenders"]
        for lane in ("sample", "compiled"):
            r[f"logreg_{lane}1_over_plain"] = (c[f"hogkit_{lane}_1"]["samples_per_s"]
                                               / c["plain"]["samples_per_s"])
            _time_ratio(r, f"logreg_plain_time_over_{lane}2_time", c["plain"],
                        c[f"hogkit_{lane}_2"])
    if "mlp" in result:
        _mlp_ratios(r, result["mlp"]["contenders"], result["mlp"].get("rates"))
    return r


def _mlp_ratios(r, c, rates=None):
    for w in (1, 2):
        h = c[f"hogkit_python_{w}"]
        for tail in ("", "_private"):
            t = c.get(f"torch_hogwild_{w}{tail}")
            if t is None:
                continue
            r[f"mlp_hogkit{w}_over_torch{w}{tail}_rate"] = (h["samples_per_s"]
                                                            / t["samples_per_s"])
            if h["time_to_target"] and t["time_to_target"]:
                r[f"mlp_torch{w}{tail}_time_over_hogkit{w}_time"] = (
                    t["time_to_target"] / h["time_to_target"])
    for w, got in (rates or {}).items():
        for v in ("private", "shared"):
            r[f"mlp_rounds_hogkit{w}_over_torch{w}_{v}"] = got["median"][f"ratio_{v}"]
    return r


def format_table(result) -> str:
    lines = []
    for p, m in result.get("mf", {}).items():
        lines.append(f"mf preset {p}: {m['n_ratings']:,} ratings, target training MSE "
                     f"{m['target_mse']} (from {m['initial_mse']:.3f})")
        lines += _rows(m["contenders"])
        if m.get("rates"):
            lines.append("  " + _mf_rates_line(m["rates"]))
    lg = result.get("logreg")
    if lg:
        lines.append(f"logreg: {lg['n_samples']:,} samples, target log-loss "
                     f"{lg['target_logloss']} (from {lg['initial_logloss']:.3f})")
        lines += _rows(lg["contenders"])
    mlp = result.get("mlp")
    if mlp:
        lines.append(f"mlp (digits, torch): {mlp['n_samples']:,} samples, batch "
                     f"{mlp['batch']}, target cross-entropy {mlp['target_loss']} (from "
                     f"{mlp['initial_loss']:.3f})")
        lines += _rows(mlp["contenders"])
        for w, got in mlp.get("rates", {}).items():
            m = got["median"]
            lines.append(
                f"  rounds, {w} process{'es' * (w != '1')} ({len(got['rounds'])} rounds "
                f"of {got['steps']:,} steps, lr {got['lr']:g}, medians): hogkit "
                f"{m['hogkit_steps_per_s']:,.0f} steps/s, recipe private data "
                f"{m['torch_private_steps_per_s']:,.0f}, shared data "
                f"{m['torch_shared_steps_per_s']:,.0f}; hogkit / private "
                f"{m['ratio_private']:.2f}, / shared {m['ratio_shared']:.2f}")
    lines.append("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in result["ratios"].items()))
    return "\n".join(lines)


#: the README's rows: its label and the contender's key
README_ROWS = (("plain numba per-rating SGD loop, 1 thread", "plain"),
               ("LIBMF 0.9.2 (AVX), 2 threads", "libmf_2"),
               ("hogkit defaults (`hogkit run`), 2 workers", "hogkit_default_2"),
               ("hogkit per-sample SGD, 1 worker", "hogkit_sample_1"),
               ("hogkit per-sample SGD, 2 workers", "hogkit_sample_2"),
               ("hogkit batch lane (exact minibatch step), 2 workers", "hogkit_compiled_2"))


def format_readme(result) -> str:
    """The README's mf table from a run of both presets: each row's time to the target
    and its ratings a second, per preset (the defaults' row in bold)."""
    def cell(c, bold):
        t = c["time_to_target"]
        if t is None:
            return "not reached"
        s = f"{t:.3f} s"
        return (f"**{s}**" if bold else s) + f" ({c['samples_per_s'] / 1e6:.1f} M/s)"
    out = ["| `mf`, time to training MSE 0.012 (ratings/s) | default preset (500k ratings) "
           "| large preset (4M ratings, 102 MB model) |", "|---|---|---|"]
    for label, key in README_ROWS:
        cells = [cell(result["mf"][p]["contenders"][key], key == "hogkit_default_2")
                 for p in ("default", "large")]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def format_markdown(result) -> str:
    """The mf, logreg and mlp tables of ``result`` as RESULTS.md shows them (a test checks that
    RESULTS.md holds this rendering of the committed JSON: no hand-typed figure)."""
    out = []
    for p, m in result.get("mf", {}).items():
        out.append(f"`mf` {p} preset ({m['n_ratings']:,} ratings), target MSE "
                   f"{m['target_mse']}:")
        out.append("")
        out.append("| contender | lr | Mratings/s | time to target |")
        out.append("|---|---|---|---|")
        for c in m["contenders"].values():
            t = c["time_to_target"]
            rates = c.get("rates")
            spread = (f" ({min(rates) / 1e6:.1f}–{max(rates) / 1e6:.1f})"
                      if rates and len(rates) > 1 else "")
            out.append(f"| {c['label']} | {c['lr']:g} | {c['samples_per_s'] / 1e6:.1f}"
                       f"{spread} | {f'{t:.3f} s' if t is not None else 'not reached'} |")
        out.append("")
        if m.get("rates"):
            out += [_mf_rates_line(m["rates"]), ""]
    keys = [k for k in result.get("ratios", {}) if k.startswith("mf_")]
    if keys:
        out.append("| ratio (same invocation) | value |")
        out.append("|---|---|")
        out += [f"| `{k}` | {result['ratios'][k]:.2f} |" for k in keys]
    if "logreg" in result:
        lg = result["logreg"]
        if out:
            out.append("")
        out += [f"`logreg` ({lg['n_samples']:,} samples), target log-loss "
                f"{lg['target_logloss']}:", "", "| contender | lr | M samples/s | "
                "time to target |", "|---|---|---|---|"]
        for c in lg["contenders"].values():
            t = c["time_to_target"]
            out.append(f"| {c['label']} | {c['lr']:g} | {c['samples_per_s'] / 1e6:.2f} | "
                       f"{f'{t:.3f} s' if t is not None else 'not reached'} |")
    if "mlp" in result:
        if out:
            out.append("")
        out += _mlp_markdown(result["mlp"])
    return "\n".join(out)


def _mf_rates_line(g):
    med, (lo, hi) = g["median"], g["ratio_range"]
    return (f"Rate rounds ({len(g['rounds'])} rounds of {g['seconds']:g} s each, order "
            f"alternating, medians): plain loop {med['plain'] / 1e6:.1f} M ratings/s, "
            f"hogkit SGD per-sample lane, 1 worker, {med['hogkit'] / 1e6:.1f} M/s; "
            f"hogkit / plain {med['ratio']:.2f} (rounds {lo:.2f}–{hi:.2f}).")


def _mlp_markdown(m):
    out = [f"`mlp` (digits, torch), batch {m['batch']}, target training cross-entropy "
           f"{m['target_loss']} (from {m['initial_loss']:.3f}):", "",
           "| contender | lr | k samples/s | time to target |", "|---|---|---|---|"]
    for c in m["contenders"].values():
        t = c["time_to_target"]
        out.append(f"| {c['label']} | {c['lr']:g} | {c['samples_per_s'] / 1e3:.1f} | "
                   f"{f'{t:.3f} s' if t is not None else 'not reached'} |")
    if m.get("rates"):
        out += ["", "| processes | rounds x steps | hogkit steps/s | recipe, private data "
                "| recipe, shared data | hogkit / private (range) | hogkit / shared "
                "(range) |", "|---|---|---|---|---|---|---|"]
        for w, g in m["rates"].items():
            md, rs = g["median"], g["rounds"]

            def ratio(v):
                xs = [x[f"ratio_{v}"] for x in rs]
                return f"**{md[f'ratio_{v}']:.2f}** ({min(xs):.2f}–{max(xs):.2f})"
            out.append(f"| {w} | {len(rs)} x {g['steps']:,} | "
                       f"{md['hogkit_steps_per_s']:,.0f} | "
                       f"{md['torch_private_steps_per_s']:,.0f} | "
                       f"{md['torch_shared_steps_per_s']:,.0f} | {ratio('private')} | "
                       f"{ratio('shared')} |")
    return out


def _rows(contenders):
    w = max([len("contender")] + [len(c["label"]) for c in contenders.values()]) + 2
    out = [f"  {'contender':<{w}}{'lr':>7}{'samples/s':>14}{'time to target':>17}"]
    for c in contenders.values():
        t = c["time_to_target"]
        out.append(f"  {c['label']:<{w}}{c['lr']:>7g}{c['samples_per_s'] / 1e6:>12.2f} M"
                   f"{(f'{t:.3f} s' if t is not None else 'not reached'):>17}")
    return out


def plot(result, path):
    """Loss against seconds, every contender at its best lr, one panel per problem."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [(f"mf {p}", m["contenders"], m["target_mse"], "training MSE")
              for p, m in result.get("mf", {}).items()]
    lg, mlp = result.get("logreg"), result.get("mlp")
    if lg:
        panels.append(("logreg", lg["contenders"], lg["target_logloss"],
                       "training log-loss"))
    if mlp:
        panels.append(("mlp (torch)", mlp["contenders"], mlp["target_loss"],
                       "training cross-entropy"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2))
    for ax, (title, cs, target, ylabel) in zip(np.atleast_1d(axes), panels):
        for c in cs.values():
            pts = c["curve"]
            ax.plot([p["t"] for p in pts], [p["loss"] for p in pts], marker="o", ms=3,
                    label=f"{c['label']} (lr {c['lr']:g})")
        ax.axhline(target, color="grey", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("seconds (training)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
