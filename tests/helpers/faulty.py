"""A workload wrapper that misbehaves on purpose, in a real worker process.

``Faulty(inner, rank=R, step=K, fault=...)`` behaves like ``inner`` except that worker
``R``, at its step ``K`` (and after, for "nan"), does one of:

- ``"nan"``: returns a gradient holding NaN (the guard must stop it);
- ``"raise"``: raises RuntimeError (the parent must re-raise it with the traceback);
- ``"sigkill"``: SIGKILLs its own process in the middle of the step;
- ``"exit"``: exits with code 7 without a traceback;
- ``"inspect"``: raises, listing what the worker process has loaded and its thread
  caps, so a test can read them from the traceback (torch present? caps set?).
Importable from spawned workers because tests/ is on sys.path.
"""

from __future__ import annotations

import os
import signal

from hogkit.workloads.mf import MatrixFactorization


class _Wrapper:
    """Delegates the Workload contract to ``inner``; subclasses change one part."""

    def __init__(self, inner, prefix):
        self.inner = inner
        self.name = f"{prefix}-{inner.name}"
        self.needs_torch = inner.needs_torch
        self.default_lr = inner.default_lr
        self.default_batch = inner.default_batch

    def defaults(self):
        return self.inner.defaults()

    def build(self, seed):
        return self.inner.build(seed)

    def loss(self, params, data):
        return self.inner.loss(params, data)


class Faulty(_Wrapper):
    def __init__(self, inner, *, rank=0, step=5, fault="raise", every=False, once=None):
        super().__init__(inner, "faulty")
        self.rank, self.step, self.fault, self.every = rank, step, fault, every
        self.once = once            # a path: fire only if it does not exist (then create)

    def setup(self, params, data, *, rank, seed):
        return {"inner": self.inner.setup(params, data, rank=rank, seed=seed), "rank": rank,
                "k": 0}

    def gradient(self, ctx, rng, batch, *, keep_read=False):
        k = ctx["k"]
        ctx["k"] += 1
        grads = self.inner.gradient(ctx["inner"], rng, batch, keep_read=keep_read)
        hit = ctx["rank"] == self.rank and (k == self.step or (self.every and k > self.step))
        if hit and self.once is not None:
            if os.path.exists(self.once):
                hit = False
            else:
                open(self.once, "w").close()
        if hit:
            if self.fault == "nan":
                grads[0].values.flat[0] = float("nan")
            elif self.fault == "raise":
                raise RuntimeError(f"planted failure at step {k}")
            elif self.fault == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.fault == "exit":
                os._exit(7)
            elif self.fault == "sigstop":
                os.kill(os.getpid(), signal.SIGSTOP)     # hangs: no exit, no heartbeat
            elif self.fault == "inspect":
                import sys
                import numba
                raise RuntimeError(
                    f"INSPECT torch_loaded={'torch' in sys.modules} "
                    f"omp={os.environ.get('OMP_NUM_THREADS')} "
                    f"numba_threads={numba.config.NUMBA_NUM_THREADS}")
        return grads

    def config(self):
        return {"name": self.name, "fault": self.fault, "rank": self.rank, "step": self.step}


class Partitioned(_Wrapper):
    """Worker ``rank`` of ``parts`` only ever writes rows in the rank-th contiguous
    range of every parameter (its gradient rows are folded into that range). The
    values are unchanged, so training is meaningless; it exists to test per-shard
    staleness: with ``shards=parts`` no update ever conflicts with another worker's."""

    def __init__(self, inner, parts=2):
        super().__init__(inner, "partitioned")
        self.parts = parts

    def setup(self, params, data, *, rank, seed):
        return {"inner": self.inner.setup(params, data, rank=rank, seed=seed),
                "rank": max(rank, 0), "n": {k: v.shape[0] for k, v in params.items()}}

    def gradient(self, ctx, rng, batch, *, keep_read=False):
        grads = self.inner.gradient(ctx["inner"], rng, batch, keep_read=keep_read)
        for g in grads:
            n = ctx["n"][g.name]
            size = n // self.parts
            g.rows = g.rows % size + ctx["rank"] * size
        return grads



def poisoned_mf(every=50, **options):
    """``mf`` whose every ``every``-th rating turns NaN in the workers (after the
    parent's up-front check): non-finite gradients that come from the data, on the
    compiled engine (it keeps mf's compiled parts)."""
    return PoisonedRatings(every=every, **options)


class PoisonedRatings(MatrixFactorization):
    name = "poisoned-mf"

    def __init__(self, every=50, **options):
        super().__init__(**options)
        self.every = every

    def setup(self, params, data, **kw):
        # in the worker, on the shared data: the parent refuses non-finite data before
        # anything starts, so NaN that reaches a worker is what the step's guard meets
        data["r"][::self.every] = float("nan")
        return super().setup(params, data, **kw)
