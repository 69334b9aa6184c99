"""Scenario ``rowvec``: mf's per-sample spans in one process, numba's loops against
kernels/rowvec.py's straight-line vector code and the plain compiled loop (issue 25).

One thread, no worker process, no clocks: each contender runs :data:`EPOCHS` passes over
mf's ratings in stored order, in spans of :data:`SPAN` ratings called from a compiled
driver (as the step core calls them), from a fresh copy of the initial factors. Per
table shape (rank, dtype) the contenders take turns, the order reversed every other
round, :data:`ROUNDS` rounds; figures are medians of ratings a second, and each ratio
the median of its per-round ratio to the plain loop (SGD) or to numba's row-wise span
(AdaGrad).

- ``plain``: the plain per-rating SGD loop of :mod:`benchmarks.peers` (whole epochs);
- ``sgd_numba``: ``kernels.mf._sgd_span_plain``, the numba loops (the lane before);
- ``sgd_vector``: ``kernels.rowvec.sgd_span_plain``;
- ``rowwise_numba`` / ``rowwise_vector``: row-wise AdaGrad (mf's lane default), numba's
  ``_adaptive_span`` and ``rowvec.rowwise_span``.

``hogkit bench rowvec --json FILE`` (~2 minutes; ``--quick``: rank 8 only, one pass, one
round); :func:`format_markdown` renders RESULTS.md's table from the JSON. ``ratios``:
per shape, the vector SGD span and numba's over the plain loop, and the vector row-wise
span over numba's.
"""

from __future__ import annotations

import statistics
import time

#: (rank, dtype) of the factor tables timed, on mf's default preset's ratings
SHAPES = ((8, "float32"), (32, "float32"), (64, "float32"), (32, "float64"))
EPOCHS, ROUNDS, SPAN = 6, 7, 4096
LR, ADA_LR = 0.01, 0.2
NAMES = ("plain", "sgd_numba", "sgd_vector", "rowwise_numba", "rowwise_vector")


def _drivers():
    """Compiled drivers, one per contender: ``d(P, Q, SP, SQ, u, i, r, epochs)``; the
    span contenders run their span on every :data:`SPAN` ratings in turn."""
    from numba import njit

    from hogkit.kernels import mf, rowvec

    from .peers import plain_mf_epoch

    @njit(nogil=True)
    def plain(P, Q, SP, SQ, u, i, r, epochs):
        for _ in range(epochs):
            plain_mf_epoch(P, Q, u, i, r, LR)

    @njit(nogil=True, inline="always")
    def sgd_numba(P, Q, SP, SQ, u, i, r, t0, m, T):
        mf._sgd_span_plain(P, Q, u, i, r, t0, m, 0, 0, T(LR), T(0.0), T(1e18), True)

    @njit(nogil=True, inline="always")
    def sgd_vector(P, Q, SP, SQ, u, i, r, t0, m, T):
        rowvec.sgd_span_plain(P, Q, u, i, r, t0, m, 0, 0, T(LR), T(1.0), T(1e18), True)

    @njit(nogil=True, inline="always")
    def rowwise_numba(P, Q, SP, SQ, u, i, r, t0, m, T):
        mf._adaptive_span(P, Q, SP, SQ, u, i, r, t0, m, 0, 0, T(ADA_LR), T(0.0), T(1.0),
                          T(1.0), T(1e-10), T(1e18), True)

    @njit(nogil=True, inline="always")
    def rowwise_vector(P, Q, SP, SQ, u, i, r, t0, m, T):
        rowvec.rowwise_span(P, Q, u, i, r, t0, m, 0, 0, T(ADA_LR), T(0.0), T(1e18), True,
                            SP, SQ, T(1.0), T(1.0), T(1e-10))

    def spans(span):
        @njit(nogil=True)
        def driver(P, Q, SP, SQ, u, i, r, epochs):
            n = r.shape[0]
            for _ in range(epochs):
                for t0 in range(0, n, SPAN):
                    span(P, Q, SP, SQ, u, i, r, t0, min(SPAN, n - t0), P.dtype.type)
        return driver

    return {"plain": plain, **{f.__name__: spans(f) for f in (
        sgd_numba, sgd_vector, rowwise_numba, rowwise_vector)}}


def _shape(drivers, rank, dtype, epochs, rounds):
    import numpy as np

    from hogkit import workloads
    params, data = workloads.get("mf", rank=rank).build(0)
    P0, Q0 = (params[k].astype(dtype) for k in ("P", "Q"))
    u, i, r = data["u"], data["i"], data["r"].astype(dtype)

    def fresh():
        return (P0.copy(), Q0.copy(), np.ones((len(P0), 1), dtype),
                np.ones((len(Q0), 1), dtype))

    for d in drivers.values():                  # compile and warm
        d(*fresh(), u, i, r, 1)
    out = []
    for k in range(rounds):
        got = {"order": list(NAMES) if k % 2 == 0 else list(NAMES)[::-1]}
        for name in got["order"]:
            args = fresh()
            t = time.perf_counter()
            drivers[name](*args, u, i, r, epochs)
            got[name] = epochs * len(r) / (time.perf_counter() - t)
        out.append(got)
    med = {n: statistics.median(g[n] for g in out) for n in NAMES}
    ratio = {n: statistics.median(g[n] / g["plain"] for g in out)
             for n in ("sgd_numba", "sgd_vector")}
    ratio["rowwise_vector_over_numba"] = statistics.median(
        g["rowwise_vector"] / g["rowwise_numba"] for g in out)
    return {"rank": rank, "dtype": dtype, "ratings": len(r), "rounds": out,
            "ratings_per_s": med, "ratios": ratio}


def run(quick=False, shapes=None, epochs=None, rounds=None) -> dict:
    shapes = shapes or (SHAPES[:1] if quick else SHAPES)
    epochs, rounds = epochs or (1 if quick else EPOCHS), rounds or (1 if quick else ROUNDS)
    drivers = _drivers()
    got = [_shape(drivers, k, dt, epochs, rounds) for k, dt in shapes]
    ratios = {f"r{s['rank']}_{s['dtype']}_{name}": value for s in got
              for name, value in s["ratios"].items()}
    return {"scenario": "rowvec", "quick": quick, "epochs": epochs, "span": SPAN, "lr": LR,
            "adagrad_lr": ADA_LR, "shapes": got, "ratios": ratios}


def format_markdown(result) -> str:
    """RESULTS.md's table: per shape, M ratings/s of each contender and the ratios."""
    out = ["| rank, dtype | plain loop | SGD numba | SGD vector | vector / plain | numba / "
           "plain | AdaGrad row-wise numba | vector | vector / numba |",
           "|---|---|---|---|---|---|---|---|---|"]
    for s in result["shapes"]:
        m, q = s["ratings_per_s"], s["ratios"]
        out.append(f"| {s['rank']}, {s['dtype']} | {m['plain'] / 1e6:.1f} | "
                   f"{m['sgd_numba'] / 1e6:.1f} | {m['sgd_vector'] / 1e6:.1f} | "
                   f"**{q['sgd_vector']:.2f}** | {q['sgd_numba']:.2f} | "
                   f"{m['rowwise_numba'] / 1e6:.1f} | {m['rowwise_vector'] / 1e6:.1f} | "
                   f"**{q['rowwise_vector_over_numba']:.2f}** |")
    return "\n".join(out)


def format_table(result) -> str:
    """The terminal's table: RESULTS.md's, under a line saying what ran."""
    return (f"rowvec: mf's spans in one process, {result['epochs']} pass(es) a round, "
            f"medians (M ratings/s)\n" + format_markdown(result))
