"""One parameter's update through a rule chosen by an integer kind: sparse rows
(:func:`apply_rows`) or a dense flat buffer (:func:`apply_flat`).

The encoding a rule object compiles to (``hogkit.rules.core``: ``rule.kind``,
``rule.params()``) and the one dispatch both the Python rules and the compiled step core
call, so a rule's arithmetic exists once:

=====================  =============================================================
``SGD``                ``w -= lr·g``; with momentum ``mu``: ``m = mu·m + g; w -= lr·m``
``STALENESS_AWARE``    the same at ``g / max(tau, 1)`` (Zhang et al., IJCAI 2016)
``DC``                 DC-ASGD, constant ``lam`` (Zheng et al., ICML 2017)
``DC_ADAPTIVE``        DC-ASGD, adaptive ``lam0 / sqrt(MS + eps)``
``GAP_AWARE``          Gap-Aware damping (Barkai et al., ICLR 2020), optional momentum
``ADAGRAD``            AdaGrad (Duchi et al., JMLR 2011), per coordinate or row-wise
``RMSPROP``            RMSProp (Tieleman & Hinton 2012), per coordinate or row-wise
=====================  =============================================================

``cfg`` (float64) holds the hyper-parameters at the indices ``LR, MU, LAM, LAM0, M, EPS,
GAMMA, LR_MAX, STALE, CLOCK``: ``EPS`` is also AdaGrad's and RMSProp's ``eps``,
``ALPHA`` (= ``GAMMA``, both the decay of a mean of squares) RMSProp's ``alpha``, and
``STALE`` (1.0 or 0.0) makes the adaptive rules divide the gradient by ``max(tau, 1)``
before it enters the accumulator and the step (``compose``: ``scale_by_staleness()``
before ``adagrad()``). ``CLOCK`` (1.0 or 0.0) is not a hyper-parameter: an engine whose
update clock counts every writer of the parameters sets it
(``encode_rule(clock_fresh=True)``) and the step core then calls a step no other update
landed on since its read (gap 0) *fresh* (:func:`apply_rows`); ``rule.cfg()`` leaves it
0. State: ``S1`` is the momentum buffer (SGD, staleness-aware), MS (adaptive DC),
Gap-Aware's second moment ``V`` or the adaptive rules' accumulator (the parameter's
shape per coordinate, ``(n, 1)`` row-wise: ``adaptive.py``); ``S2`` Gap-Aware's momentum
buffer; ``k[ki]`` Gap-Aware's per-parameter step count. Unused state can be any array of
the right type (a ``(0, d)`` one). Nothing is checked here (``hogkit.rules.core``
checks).
"""

from numba import njit

from .adaptive import FASTMATH, adagrad_flat, adagrad_rows, rmsprop_flat, rmsprop_rows
from .delayed import (dc_adaptive_flat, dc_adaptive_gap_rows, dc_flat, dc_gap_rows,
                      gap_aware_flat, gap_aware_gap_rows, gaps_into, staleness_aware_flat,
                      staleness_aware_momentum_flat, staleness_aware_momentum_rows,
                      staleness_aware_rows, undamped_rows)
from .dense import momentum_flat, sgd_flat
from .sparse import momentum_rows, sgd_rows

SGD, STALENESS_AWARE, DC, DC_ADAPTIVE, GAP_AWARE, ADAGRAD, RMSPROP = 0, 1, 2, 3, 4, 5, 6
LR, MU, LAM, LAM0, M, EPS, GAMMA, LR_MAX, STALE, CLOCK = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
ALPHA = GAMMA            # RMSProp's decay, in Gap-Aware's slot (both decay a mean of squares)
NCFG = 10


@njit(cache=True, nogil=True, inline="always")
def _gscale(cfg, tau):
    """The adaptive rules' gradient scale: ``1 / max(tau, 1)`` when ``cfg[STALE]`` is
    set, else 1.0 (exact)."""
    return 1.0 / max(tau, 1) if cfg[STALE] != 0.0 else 1.0


@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def apply_rows(kind, cfg, W, S1, S2, k, ki, rows, G, R, n, tau, fresh):
    """Apply the first ``n`` rows of gradient ``G`` (rows ``rows``, read copies ``R``
    where the rule needs them) to the 2-D parameter ``W`` under rule ``kind`` at
    staleness ``tau`` (updates by others since the read); ``n < 0``: every row. The
    read copies ``R`` are consumed: DC-ASGD and Gap-Aware turn them into the gaps in
    place (``delayed.gaps_into``), so the step core's buffers need no scratch of their
    own; a caller whose ``R`` must survive passes a copy (``hogkit.rules.core`` does).
    (After a fresh step ``R`` holds either its copies or zeros: nothing reads it.)

    ``fresh``: the caller's update clock says no other update landed since the read
    (the step core: gap 0 under ``cfg[CLOCK]``), so every gap is zero and is not
    measured: DC-ASGD and Gap-Aware take their undamped form at once. Constant DC-ASGD
    takes SGD's row kernel; adaptive DC-ASGD and Gap-Aware without momentum take
    ``delayed.undamped_rows``; neither writes, reads or checks a gap row (zeroing the
    copies and reading them back cost mf's adaptive DC-ASGD ~9 ns a rating in a scratch
    A/B, one thread, session 56). Gap-Aware with momentum takes its update pass on
    zeroed copies. Where no other write can land between the read and the apply (the
    simulator, one worker, a local-SGD replica) the parameters' rows are then
    exactly their read values, and for finite parameters the result is the same bits as
    measuring; live with several workers, it leaves out what another worker's update
    has written (in part or whole) but not yet counted (a parameter server, whose
    version moves per whole update, shows no such write). Measuring those cost
    logreg's two-worker rules a second pass over the hot shared lines
    (benchmarks/RESULTS.md, session 55).

    Inlined where the step core calls it, and kept small there: plain SGD (the common
    step) calls its row kernel at once; every other rule goes through one call to
    :func:`_apply_rows`, so the step loop does not carry every rule's body (inlining
    them all cost the general SGD step ~100 ns at batch 1)."""
    if kind == SGD and cfg[MU] == 0.0:
        sgd_rows(W, rows, G, cfg[LR], n)
    else:
        _apply_rows(kind, cfg, W, S1, S2, k, ki, rows, G, R, n, tau, fresh)


@njit(cache=True, nogil=True, inline="always")
def _gaps(W, rows, R, n, fresh):
    """The read copies ``R[:n]`` become the gaps: zeros when ``fresh`` (nothing else
    wrote since the read, by the caller's clock), else ``W[rows] - R`` (measured).
    Only Gap-Aware with momentum zeroes them (its fresh step still takes its update
    pass); the other rules' fresh steps read no gaps at all."""
    if fresh:
        for i in range(n):
            for j in range(R.shape[1]):
                R[i, j] = 0
    else:
        gaps_into(W, rows, R, n)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def _apply_rows(kind, cfg, W, S1, S2, k, ki, rows, G, R, n, tau, fresh):
    """:func:`apply_rows` for every rule (the dispatch on ``kind``)."""
    n = rows.shape[0] if n < 0 else n
    lr = cfg[LR]
    mu = cfg[MU]
    if kind == SGD:
        if mu != 0.0:
            momentum_rows(W, S1, rows, G, lr, mu, 1.0, n)
        else:
            sgd_rows(W, rows, G, lr, n)
    elif kind == STALENESS_AWARE:
        if mu != 0.0:
            staleness_aware_momentum_rows(W, S1, rows, G, lr, mu, tau, n)
        else:
            staleness_aware_rows(W, rows, G, lr, tau, n)
    elif kind == DC:
        if fresh:                              # no correction: a·g, SGD's step
            sgd_rows(W, rows, G, lr, n)
        else:
            gaps_into(W, rows, R, n)
            dc_gap_rows(W, rows, G, R, lr, cfg[LAM], n)
    elif kind == DC_ADAPTIVE:
        if fresh:
            undamped_rows(W, S1, rows, G, lr, cfg[M], n)
        else:
            gaps_into(W, rows, R, n)
            dc_adaptive_gap_rows(W, S1, rows, G, R, lr, cfg[LAM0], cfg[M], cfg[EPS], n)
    elif kind == ADAGRAD:
        adagrad_rows(W, S1, rows, G, lr, cfg[EPS], _gscale(cfg, tau), n)
    elif kind == RMSPROP:
        rmsprop_rows(W, S1, rows, G, lr, cfg[ALPHA], cfg[EPS], _gscale(cfg, tau), n)
    else:
        k[ki] += 1
        if fresh and mu == 0.0:
            undamped_rows(W, S1, rows, G, lr, cfg[GAMMA], n)
        else:
            _gaps(W, rows, R, n, fresh)
            gap_aware_gap_rows(W, S2, S1, rows, G, R, lr, mu, cfg[GAMMA], cfg[LR_MAX],
                               k[ki], n)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def apply_flat(kind, cfg, w, s1, s2, k, ki, g, read, tau):
    """The dense twin of :func:`apply_rows`: every array flat (1-D), same length as
    ``w`` (``s1``/``s2``/``read`` may be empty where the rule does not use them; a
    row-wise adaptive accumulator ``s1`` has one entry per row of ``w``)."""
    lr = cfg[LR]
    mu = cfg[MU]
    if kind == SGD:
        if mu != 0.0:
            momentum_flat(w, s1, g, lr, mu)
        else:
            sgd_flat(w, g, lr)
    elif kind == STALENESS_AWARE:
        if mu != 0.0:
            staleness_aware_momentum_flat(w, s1, g, lr, mu, tau)
        else:
            staleness_aware_flat(w, g, lr, tau)
    elif kind == DC:
        dc_flat(w, g, read, lr, cfg[LAM])
    elif kind == DC_ADAPTIVE:
        dc_adaptive_flat(w, s1, g, read, lr, cfg[LAM0], cfg[M], cfg[EPS])
    elif kind == ADAGRAD:
        adagrad_flat(w, s1, g, lr, cfg[EPS], _gscale(cfg, tau))
    elif kind == RMSPROP:
        rmsprop_flat(w, s1, g, lr, cfg[ALPHA], cfg[EPS], _gscale(cfg, tau))
    else:
        k[ki] += 1
        gap_aware_flat(w, s2, s1, g, read, lr, mu, cfg[GAMMA], cfg[LR_MAX], k[ki])
