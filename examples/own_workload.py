"""A workload of your own on hogkit's compiled step core: sparse ridge regression.

hogkit runs a workload in compiled code when the workload describes its *compiled
parts* (``hogkit.workloads.base``): a NamedTuple of its arrays whose class is
registered with two numba kernels,

- ``sample(wl, rng, cursor, nb, idx)``: write ``nb`` sample ids into ``idx``;
- ``gradient(wl, params, idx, nb, keep_read, G, R, RD, cnt)``: for each parameter
  ``p`` (a 2-D view), write ``cnt[p]`` gradient rows into ``G[p]``, their row indices
  into ``R[p]`` and, when ``keep_read``, the rows as read into ``RD[p]``.

Everything else (clocks, staleness record, policies, every rule, density, stragglers,
the simulator) is hogkit's. The same kernels give the workload its Python
``gradient`` (through ``KernelCtx``), so ``engine="python"`` computes the same numbers.

Run it (2 workers, then the same problem on 32 simulated workers):

    python examples/own_workload.py
    python examples/own_workload.py --steps 20000 --workers 2

A workload registered with ``cache=False`` (the default) has its step core compiled
in each worker process (a few seconds, once per run): numba's cache of the core could
not see edits to this file. Register with ``cache=True`` once the kernels are stable.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import numpy as np
from numba import njit

import hogkit
from hogkit.kernels import step
from hogkit.kernels.rule import FASTMATH
from hogkit.validation import check_int
from hogkit.workloads.base import CompiledParts, KernelCtx, Workload


# --- the compiled part: arrays and two kernels ------------------------------------------

class RidgeArrays(NamedTuple):
    indptr: np.ndarray      # CSR rows: sample s has nonzeros indptr[s]:indptr[s+1]
    indices: np.ndarray     # feature ids
    values: np.ndarray      # feature values
    y: np.ndarray           # targets
    reg: float              # L2 coefficient


@njit(nogil=True)
def ridge_sample(wl, rng, cursor, nb, idx):
    """``nb`` samples drawn uniformly with replacement (from ``rng``, a numpy Generator)."""
    n = wl.y.shape[0]
    for b in range(nb):
        idx[b] = min(int(rng.random() * n), n - 1)


@njit(nogil=True, fastmath=FASTMATH)
def ridge_gradient(wl, params, idx, nb, keep_read, G, R, RD, cnt):
    """Mean squared-error gradient of the samples ``idx[:nb]``: one row per (sample,
    nonzero) of ``w`` (viewed as ``(n_features, 1)``); repeated features are left for
    the rule to add up."""
    w = params[0]
    t = 0
    for b in range(nb):
        s = idx[b]
        lo, hi = wl.indptr[s], wl.indptr[s + 1]
        pred = 0.0
        for j in range(lo, hi):
            pred += float(w[wl.indices[j], 0]) * float(wl.values[j])
        err = pred - float(wl.y[s])
        for j in range(lo, hi):
            f = wl.indices[j]
            wf = w[f, 0]
            R[0][t] = f
            G[0][t, 0] = (err * float(wl.values[j]) + wl.reg * float(wf)) / nb
            if keep_read:
                RD[0][t, 0] = wf
            t += 1
    cnt[0] = t


step.register(RidgeArrays, sample_kernel=ridge_sample, gradient_kernel=ridge_gradient)


# --- the workload: data, setup, loss ------------------------------------------------------

class SparseRidge(Workload):
    """y = w·x + noise on sparse x (``nnz`` nonzeros a sample); loss: mean squared error."""

    name = "sparse-ridge"
    default_lr = 0.1
    default_batch = 32
    default_steps = 20_000
    _fields = ("n_samples", "n_features", "nnz", "reg")

    def __init__(self, n_samples=20_000, n_features=2_000, nnz=8, reg=1e-4):
        self.n_samples = check_int("n_samples", n_samples, min_value=1)
        self.n_features = check_int("n_features", n_features, min_value=1)
        self.nnz = check_int("nnz", nnz, min_value=1, max_value=self.n_features)
        self.reg = float(reg)

    def build(self, seed):
        rng = np.random.default_rng(seed)
        n, d, k = self.n_samples, self.n_features, self.nnz
        indices = np.concatenate([rng.choice(d, k, replace=False) for _ in range(n)])
        values = rng.standard_normal(n * k).astype(np.float32)
        w_true = rng.standard_normal(d).astype(np.float32)
        y = (w_true[indices] * values).reshape(n, k).sum(axis=1)
        y = (y + 0.1 * rng.standard_normal(n)).astype(np.float32)
        data = {"indptr": np.arange(0, n * k + 1, k, dtype=np.int64),
                "indices": indices.astype(np.int64), "values": values, "y": y}
        return {"w": np.zeros(d, np.float32)}, data

    def compiled(self, params, data):
        arrays = RidgeArrays(data["indptr"], data["indices"], data["values"], data["y"],
                             self.reg)
        return CompiledParts(arrays, names=("w",), rows_per_sample=(self.nnz,))

    def setup(self, params, data, *, rank=0, seed=0):
        return KernelCtx(self.compiled(params, data), params, batch=self.default_batch,
                         rank=rank, seed=seed, n_samples=len(data["y"]))

    def gradient(self, ctx, rng, batch, *, keep_read=False):
        return ctx.gradient(rng, batch, keep_read)

    def loss(self, params, data):
        w = params["w"].astype(np.float64)
        pred = (w[data["indices"]] * data["values"]).reshape(-1, self.nnz).sum(axis=1)
        return float(np.mean((pred - data["y"]) ** 2))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=SparseRidge.default_steps)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    wl = SparseRidge()
    run = hogkit.train(wl, workers=args.workers,
                       outputs=hogkit.Outputs(progress=False, eval_every=None, keep_params=False),
                       steps=args.steps)
    s = run.summary()
    print(f"engine: {s['engine']}; loss {run.initial_loss:.4f} -> {run.final_loss:.4f} "
          f"in {run.wall_s:.2f} s; update gap mean "
          f"{run.staleness['update_gap']['mean']:.2f}")
    sim = hogkit.simulate(wl, workers=32, outputs=hogkit.Outputs(keep_params=False),
                          steps=args.steps, seed=0, rule=hogkit.GapAware(wl.default_lr))
    print(f"simulated, 32 workers, Gap-Aware ({sim.extra['engine']} engine): loss "
          f"{sim.final_loss:.4f}, update gap mean {sim.staleness['update_gap']['mean']:.1f}")


if __name__ == "__main__":
    main()
