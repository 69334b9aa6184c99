"""The step core: one Hogwild! step, written once, compiled, run n at a time.

A step is ``admit → sample → read clocks → gradient → guard → [pace] → density → gap →
rule → tick → record``. It is split at the seam of *compute, then apply*:

- :func:`begin` samples a minibatch, reads the clock vector (others' updates) and
  computes the gradient from the live parameters into the worker's buffers, then runs
  the non-finite guard. Nothing shared is written.
- :func:`end` thins the gradient (update density), measures the update gap (updates by
  others since the read), applies the rule, ticks the update clock and records the
  event in the staleness log.

:func:`run_steps` (the live worker) runs ``begin`` then ``end`` back to back, n steps
per call, and returns to Python only to wait on a policy, to merge a local-SGD phase,
to sleep a long straggler pause, to raise, or when the chunk is done. The simulator's
fused engine (``sim.py``) calls the same ``begin`` at a virtual START and ``end`` at the
FINISH, with other workers' steps in between: one step, two engines.

**The workload protocol.** A workload's compiled part is a ``NamedTuple`` of arrays
whose class is registered here with two njit kernels (:func:`register`):

- ``sample(wl, rng, cursor, nb, idx)``: write ``nb`` sample ids into ``idx``, drawing
  from ``rng`` (a ``numpy.random.Generator``) and/or the int64 array ``cursor``;
- ``gradient(wl, params, idx, nb, keep_read, G, R, RD, cnt)``: from the live
  ``params`` (a tuple of 2-D views, one per parameter, in the workload's order) write,
  for each parameter ``p``, ``cnt[p]`` gradient rows into ``G[p]``, their row indices
  into ``R[p]`` and, when ``keep_read``, the parameter rows they were computed from
  into ``RD[p]`` (DC-ASGD's ``w_bak``, Gap-Aware's ``w_read``). Rows may repeat; the
  rule adds them up in order;
- optionally ``sgd(wl, params, idx, nb, lr, G, R, RD, cnt, scratch) -> bool``: the
  same gradient fused with plain SGD's apply, for the most common step (SGD without
  momentum, no density). It must give exactly what ``gradient`` then ``W[rows] -=
  lr·G`` gives (errors from the step's start values; a row repeated in the batch uses
  its saved start value), may use the buffers and its own ``scratch`` (the tuple the
  workload's ``CompiledParts.scratch(batch)`` makes), and returns False having written
  nothing when it cannot guarantee a finite update, so the general path (and its
  guard) runs instead. It skips the gradient's round trip through memory.

The stubs :func:`sample` and :func:`gradient` dispatch on the arrays' class through
numba's ``overload`` (one per registered class, with the kernel's own fastmath flags),
so a workload's kernels are compiled *into* the core's module, where LLVM inlines them
into the step loop, and the core is cached per workload type like any kernel. Caveat, as for every numba cache: the cache of this module does not see
edits to a registered workload's kernel files; a user workload is therefore compiled
with the uncached twin :data:`run_steps_uncached` unless it is registered with
``cache=True``.

**Arithmetic.** Every per-step piece is inlined into the loop at numba-IR level (a call
that unpacks tuples of arrays costs ~100 ns of reference counting, as much as a whole
small step) and compiled under one flag set, :data:`FASTMATH` = ``{"reassoc"}``: sums
such as a gradient's dot products may be reassociated, so they vectorise; element-wise
rule arithmetic is unchanged by it (no contraction, no NaN/inf assumptions: the guard
still sees them). The kernels the Python path calls carry the same flags, so both
paths compute the same numbers.

Everything the core reads or writes is an array or a scalar; nothing here imports
hogkit. Races: the gradient reads and the rule writes shared parameters with no lock
(Hogwild!); clocks and log rows have one writer each.
"""

import numpy as np
from numba import njit
from numba.extending import overload

from ._intrinsics import monotonic_ns, sched_yield
from .clock import (GRANT_BINS, ITER, STEP, UPD, admit, blocked, clock_lag,
                    finish_iteration, others_updates, proceed_released, unbounded)
from .density import NONE, filter_rows, hold_rows
from .guard import all_finite, finite_prefix
from .rule import FASTMATH, LR, MU, SGD, apply_flat, apply_rows
from .sparse import sgd_rows
from .staleness import record_ring, record_stats

# --- the workload protocol -----------------------------------------------------------

_SAMPLERS = {}
_GRADIENTS = {}
_SGDS = {}
_CACHEABLE = set()


def sample(wl, rng, cursor, nb, idx):  # pragma: no cover - dispatched by overload
    """Draw ``nb`` sample ids of workload ``wl`` into ``idx`` (see the docstring)."""
    return _SAMPLERS[type(wl)](wl, rng, cursor, nb, idx)


def gradient(wl, params, idx, nb, keep_read, G, R, RD, cnt):  # pragma: no cover
    """The workload's gradient rows for the samples ``idx[:nb]`` (see the docstring)."""
    return _GRADIENTS[type(wl)](wl, params, idx, nb, keep_read, G, R, RD, cnt)


def sgd(wl, params, idx, nb, lr, G, R, RD, cnt, scratch):  # pragma: no cover
    """The workload's fused plain-SGD step, or False (see the docstring)."""
    fn = _SGDS.get(type(wl))
    return False if fn is None else fn(wl, params, idx, nb, lr, G, R, RD, cnt, scratch)


def _no_sgd(wl, params, idx, nb, lr, G, R, RD, cnt, scratch):
    return False


def register(arrays_cls, *, sample_kernel, gradient_kernel, sgd_kernel=None, cache=False):
    """Register the compiled parts of a workload whose arrays are ``arrays_cls`` (a
    NamedTuple class): njit ``sample_kernel`` and ``gradient_kernel`` with the
    signatures of the module docstring. Each is inlined into the step loop (an overload
    per class, ``inline="always"``) and compiled there under the core's arithmetic flags
    :data:`FASTMATH`; compile the kernels themselves with the same flags so that the
    Python path (which calls them directly) computes the same numbers. ``cache=True``
    lets the core cache its code for this type on disk: only for kernels whose source
    changes only together with hogkit's (hogkit's own workloads)."""
    if arrays_cls in _SAMPLERS:
        if (_SAMPLERS[arrays_cls], _GRADIENTS[arrays_cls]) != (sample_kernel,
                                                                gradient_kernel):
            raise ValueError(f"{arrays_cls.__name__} is already registered with other "
                             f"kernels; give each workload its own arrays class")
        return
    _SAMPLERS[arrays_cls] = sample_kernel
    _GRADIENTS[arrays_cls] = gradient_kernel
    if sgd_kernel is not None:
        _SGDS[arrays_cls] = sgd_kernel
    if cache:
        _CACHEABLE.add(arrays_cls)
    s_py = getattr(sample_kernel, "py_func", sample_kernel)
    g_py = getattr(gradient_kernel, "py_func", gradient_kernel)
    f_py = getattr(sgd_kernel, "py_func", sgd_kernel) if sgd_kernel is not None else _no_sgd

    def sample_typer(wl, rng, cursor, nb, idx):
        return s_py if getattr(wl, "instance_class", None) is arrays_cls else None

    def gradient_typer(wl, params, idx, nb, keep_read, G, R, RD, cnt):
        return g_py if getattr(wl, "instance_class", None) is arrays_cls else None

    def sgd_typer(wl, params, idx, nb, lr, G, R, RD, cnt, scratch):
        return f_py if getattr(wl, "instance_class", None) is arrays_cls else None

    overload(sample, inline="always")(sample_typer)
    overload(gradient, inline="always")(gradient_typer)
    overload(sgd, inline="always")(sgd_typer)


def registered(arrays_cls):
    """``(sample_kernel, gradient_kernel, sgd_kernel or None)`` registered for
    ``arrays_cls``, or None."""
    if arrays_cls not in _SAMPLERS:
        return None
    return _SAMPLERS[arrays_cls], _GRADIENTS[arrays_cls], _SGDS.get(arrays_cls)


def cacheable(arrays_cls) -> bool:
    """True when the core may cache its code for ``arrays_cls`` (see :func:`register`)."""
    return arrays_cls in _CACHEABLE


# --- per-call settings and results ---------------------------------------------------

#: cfg (int64) fields, written by the Python driver between calls (STEP0: added to the
#: step index that density's random masks and every-k phase use, so a resumed segment
#: goes on with the whole run's sequence). The policy is not here: its encoded row and
#: the worker's admission state (``clock.P_*``, ``clock.A_*``) travel in ``ctl``.
(ME, BATCH, KEEP_READ, SKIP, STRIDE, LOCAL_H, QUOTA, TIMING, RECORD, FUSED,
 STEP0) = range(11)
NCFG = 11
#: rt (int64, one row of RT columns per worker) counters, written by the worker only:
#: ns waiting on the policy and busy in the loop, gradients skipped as non-finite,
#: samples processed, monotonic ns it left the start barrier / finished, ns of
#: compute and of straggler pauses (realised slowdown), steps held back by temporal
#: density, the largest event-ring stride used
(RT_WAIT, RT_BUSY, RT_NONFINITE, RT_SAMPLES, RT_T0, RT_T1, RT_COMPUTE, RT_PAUSED,
 RT_HELD, RT_STRIDE) = range(10)
RT = 16
#: return codes of run_steps
CHUNK, STOPPED, QUOTA_DONE, BLOCKED, MERGE, PAUSE, NONFINITE = range(7)
#: io (int64) results of run_steps
IO_DONE, IO_PAUSE_NS = 0, 1
NIO = 4
#: pacer kinds (a straggler's extra time per step; see hogkit.engine.delays)
PACE_NONE, PACE_SLOWDOWN, PACE_PAUSES, PACE_LOAD = 0, 1, 2, 3
#: above this a pause returns to Python to sleep; below it the core spins (sleep
#: overshoots by ~60 µs, so short pauses would miss their factor)
SPIN_MAX_NS = 200_000
#: a policy wait re-checks in compiled code this long before handing back to Python's
#: backoff (sleeps, liveness, timeout), yielding the core after SPIN_YIELD_NS
SPIN_WAIT_NS = 2_000_000
SPIN_YIELD_NS = 20_000


@njit(cache=True, nogil=True, inline="always")
def _all_finite(G, GF, cnt):
    for p in range(len(G)):
        if not finite_prefix(GF[p], cnt[p] * G[p].shape[1]):
            return False
    return True


@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def begin(wl, rng, cursor, params, G, R, RD, cnt, idx, GF, keep_read, nb, slots, me):
    """Compute one step's update into the buffers ``G, R, RD, cnt`` (``idx`` the
    samples, ``GF`` ``G``'s memory seen flat, for the guard); returns ``(others,
    finite)``: others' updates at the read (the clock vector, summed) and whether
    every gradient value is finite. Nothing shared is written."""
    sample(wl, rng, cursor, nb, idx)
    others = others_updates(slots, me)
    return others, compute(wl, params, G, R, RD, cnt, idx, GF, keep_read, nb)


@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def compute(wl, params, G, R, RD, cnt, idx, GF, keep_read, nb):
    """The gradient of the drawn samples into the buffers, then the guard."""
    gradient(wl, params, idx, nb, keep_read, G, R, RD, cnt)
    return _all_finite(G, GF, cnt)


@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def end(params, G, R, RD, cnt, kind, rcfg, S1, S2, K, how, fraction, threshold, residual,
        every, seed, D, mask, step, slots, me, others, local):
    """Apply one step's update (see the module docstring): rule ``kind``/``rcfg`` with
    state ``S1, S2, K``; density ``how, fraction, threshold, residual, every, seed``
    with residuals ``D``. Returns the update gap, or -1 when temporal density held the
    step back (nothing written: not an update). ``local``: a local-SGD replica step
    (staleness 0, no update counted)."""
    if every > 1 and step % every != 0:
        if residual:
            for p in range(len(G)):
                hold_rows(D[p], R[p], G[p], cnt[p])
        return -1
    if how != NONE:
        for p in range(len(G)):
            filter_rows(how, fraction, threshold, residual, seed, step, p, D[p], R[p],
                        G[p], cnt[p], mask)
    gap = 0 if local else others_updates(slots, me) - others
    if kind == SGD and rcfg[MU] == 0.0:         # the common case, inlined
        lr = rcfg[LR]
        for p in range(len(G)):
            sgd_rows(params[p], R[p], G[p], lr, cnt[p])
    else:
        for p in range(len(G)):
            apply_rows(kind, rcfg, params[p], S1[p], S2[p], K, p, R[p], G[p], RD[p],
                       cnt[p], gap)
    if not local:
        slots[me, UPD] += 1
    return gap


@njit(cache=True, nogil=True, inline="always")
def record(gh, lh, stats, ring, me, step, gap, lag, stride, t_ns):
    """The event into the log: stats always, the ring every ``stride``-th event (with
    ``t_ns``, or the monotonic clock when ``t_ns < 0``)."""
    n = record_stats(gh, lh, stats, me, gap, lag)
    if stride <= 1 or n % stride == 0:
        record_ring(ring, stats, me, step, gap, lag, monotonic_ns() if t_ns < 0 else t_ns)


@njit(cache=True, nogil=True)
def pace_ns(pacer, prng, busy_ns, now):
    """A straggler's extra time for a step that took ``busy_ns`` (``pacer``: float64
    ``[kind, a, b, t0_ns]``): Slowdown(a) ``(a-1)·busy``; Pauses(a, b) ``b`` s with
    probability a (drawn from ``prng``); Load(a, b) ``(f(t) - 1)·busy`` with
    ``f(t) = 1 + a·(1 + sin(2πt/b))/2``, t seconds since ``t0_ns``."""
    kind = int(pacer[0])
    if kind == PACE_SLOWDOWN:
        return int((pacer[1] - 1.0) * busy_ns)
    if kind == PACE_PAUSES:
        return int(pacer[2] * 1e9) if prng.random() < pacer[1] else 0
    if kind == PACE_LOAD:
        t = (now - pacer[3]) * 1e-9
        f = 1.0 + pacer[1] * 0.5 * (1.0 + np.sin(2.0 * np.pi * t / pacer[2]))
        return int((f - 1.0) * busy_ns)
    return 0


@njit(cache=True, nogil=True, inline="always")
def _spin_admit(slots, me, pol, adm, stop, budget_ns):
    """Re-check admission (``clock.blocked``: me's lead down to ``adm[A_WAIT]``)
    without leaving compiled code, for up to ``budget_ns``: the peer being waited for
    finishes a step within a few step times, so most waits never reach Python (whose
    backoff sleeps, and a sleeping waiter is slow to notice: two workers under a tight
    bound would convoy). Past the first ``SPIN_YIELD_NS`` every re-check yields the
    core (``sched_yield``), so with more workers than cores the peer gets to run.
    Returns ``(admitted, lag, ns waited)``, ``lag`` the clock lag once admitted; gives
    up early when the stop flag is raised."""
    t0 = monotonic_ns()
    now = t0
    while now - t0 < budget_ns and stop[0] == 0:
        if not blocked(slots, me, pol, adm):
            return True, clock_lag(slots, me), monotonic_ns() - t0
        if now - t0 > SPIN_YIELD_NS:
            sched_yield()
        now = monotonic_ns()
    return False, clock_lag(slots, me), now - t0


@njit(cache=True, nogil=True, inline="always")
def _spin_until(t):
    now = monotonic_ns()
    while now < t:
        now = monotonic_ns()
    return now


@njit(cache=True, nogil=True, inline="always")
def _pace(pacer, prng, rt, me, t0):
    """A straggler's extra time after a step begun at ``t0`` (counted in ``rt``): spun
    here when short; a long one is returned (ns) for Python to sleep, else 0."""
    t1 = monotonic_ns()
    extra = pace_ns(pacer, prng, t1 - t0, t1)
    rt[me, RT_COMPUTE] += t1 - t0
    rt[me, RT_PAUSED] += extra
    if extra > SPIN_MAX_NS:
        return extra
    _spin_until(t1 + extra)
    return 0


def _run_steps(n, wl, rng, cursor, params, bufs, rule, dens, ctl, log, cfg, io, pacer,
               prng):
    """Run up to ``n`` steps of worker ``cfg[ME]``; returns a code (``CHUNK`` when all
    ``n`` ran; ``io[IO_DONE]`` counts the steps run). ``ctl`` = ``(slots, rt, stop,
    pol, adm, grants)``: the clock slots, the runtime counters, the stop flag, the
    policy's encoded row, this worker's admission state and its histogram of DSSP
    grants (``clock.admit``, the one admission state machine). A wait first spins here
    for ``SPIN_WAIT_NS`` (counted in ``RT_WAIT``), then returns ``BLOCKED`` with the
    bound in ``adm[A_WAIT]``; Python's backoff waits (the policy's ``wait_bound``, the
    same kernel) and sets ``adm[A_RELEASED]``: the next step proceeds without a check."""
    # Every tuple is unpacked once, here: inside the loop the inlined step works on
    # plain array variables, so no reference counting runs per step.
    slots, rt, stop, pol, adm, grants = ctl
    G, R, RD, cnt, idx, GF, scratch = bufs
    kind, rcfg, S1, S2, K = rule
    fused = cfg[FUSED] != 0
    lr = rcfg[LR]
    how, fraction, threshold, residual, every, seed, D, mask = dens
    gh, lh, stats, ring = log
    me, nb, local_h = cfg[ME], cfg[BATCH], cfg[LOCAL_H]
    keep, timing = cfg[KEEP_READ] != 0, cfg[TIMING] != 0
    pacing = int(pacer[0]) != PACE_NONE
    free = unbounded(pol)                     # Async, LocalSGD: one compare per step
    done = 0
    io[IO_PAUSE_NS] = 0
    while done < n:
        io[IO_DONE] = done
        if stop[0] != 0:
            return STOPPED
        k = slots[me, ITER]
        if cfg[QUOTA] >= 0 and k >= cfg[QUOTA]:
            return QUOTA_DONE
        lag = clock_lag(slots, me)
        if not free and not admit(slots, me, pol, adm, grants, lag):
            ok, lag, waited = _spin_admit(slots, me, pol, adm, stop, SPIN_WAIT_NS)
            rt[me, RT_WAIT] += waited
            if not ok:
                return BLOCKED
            proceed_released(adm)
        slots[me, STEP] = k
        t0 = monotonic_ns() if pacing else 0
        sample(wl, rng, cursor, nb, idx)
        others = others_updates(slots, me)
        if fused and sgd(wl, params, idx, nb, lr, G, R, RD, cnt, scratch):
            gap = others_updates(slots, me) - others      # the fast path: SGD, fused
            slots[me, UPD] += 1
            if cfg[RECORD] != 0:
                record(gh, lh, stats, ring, me, k, gap, lag, cfg[STRIDE], -1)
        elif not compute(wl, params, G, R, RD, cnt, idx, GF, keep, nb):
            if cfg[SKIP] == 0:
                return NONFINITE
            rt[me, RT_NONFINITE] += 1
        else:
            gap = end(params, G, R, RD, cnt, kind, rcfg, S1, S2, K, how, fraction,
                      threshold, residual, every, seed, D, mask, k + cfg[STEP0], slots, me,
                      others, local_h > 0)
            if gap < 0:
                rt[me, RT_HELD] += 1
            elif local_h == 0 and cfg[RECORD] != 0:
                record(gh, lh, stats, ring, me, k, gap, lag, cfg[STRIDE], -1)
        rt[me, RT_SAMPLES] += nb
        long_pause = _pace(pacer, prng, rt, me, t0) if pacing else 0
        done += 1
        if local_h > 0 and (k + 1) % local_h == 0:
            io[IO_DONE] = done
            io[IO_PAUSE_NS] = long_pause          # Python merges, ticks, then pauses
            return MERGE
        finish_iteration(slots, me, monotonic_ns() if timing else 0)
        if long_pause > 0:
            io[IO_PAUSE_NS] = long_pause
            io[IO_DONE] = done
            return PAUSE
    io[IO_DONE] = done
    return CHUNK


#: the live worker's step loop, cached per workload type (hogkit's own workloads)
run_steps = njit(cache=True, nogil=True, fastmath=FASTMATH)(_run_steps)
#: the same loop compiled per process, for user workloads whose kernels may change
run_steps_uncached = njit(nogil=True, fastmath=FASTMATH)(_run_steps)


# --- the Python engine's halves --------------------------------------------------------

def _python_begin(wl, rng, cursor, params, G, R, RD, cnt, idx, GF, keep_read, nb,
                  slots, me):
    """The Python engine's compute half in one call: read the clock vector (unless
    ``me < 0``), sample ``nb`` ids, the gradient into the buffers, the guard. Returns
    ``(others, lag, finite)``: others' updates and the clock lag at the read (-1, -1
    when not read) and whether every gradient value is finite. The step core's
    :func:`begin`, plus the lag its admission check measures."""
    others, lag = -1, -1
    if me >= 0:
        others = others_updates(slots, me)
        lag = clock_lag(slots, me)
    sample(wl, rng, cursor, nb, idx)
    return others, lag, compute(wl, params, G, R, RD, cnt, idx, GF, keep_read, nb)


#: per workload type, like run_steps (and an uncached twin for user workloads)
python_begin = njit(cache=True, nogil=True, fastmath=FASTMATH)(_python_begin)
python_begin_uncached = njit(nogil=True, fastmath=FASTMATH)(_python_begin)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def python_end(params, G, R, RD, cnt, kind, rcfg, S1, S2, K, slots, me, others, lag,
               gh, lh, stats, ring, step, t_ns):
    """The Python engine's apply half in one call, for an update that goes to the
    shared parameters whole (no density, no per-shard clocks): the gap (others'
    updates since the read that gave ``others``), the rule on every parameter
    (``kernels.rule.apply_rows``: the same arithmetic as :func:`end`), the update
    tick, the event ``(step, gap, lag)`` into the log at ``t_ns`` (< 0: now).
    Returns the gap. ``others < 0``: a local-SGD replica step (staleness 0, nothing
    ticked or recorded)."""
    gap = 0 if others < 0 else others_updates(slots, me) - others
    for p in range(len(G)):
        apply_rows(kind, rcfg, params[p], S1[p], S2[p], K, p, R[p], G[p], RD[p], cnt[p],
                   gap)
    if others >= 0:
        slots[me, UPD] += 1
        record(gh, lh, stats, ring, me, step, gap, lag, 1, t_ns)
    return gap


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def dense_end(params, G, RD, kinds, cfgs, S1, S2, K, slots, me, others, lag, gh, lh,
              stats, ring, step, t_ns):
    """A torch-style optimizer's step (``hogkit.optim``) in one call, for dense
    gradients: the guard (every value finite, else nothing is written and -1 is
    returned), the gap, parameter ``p``'s rule ``kinds[p]`` with hyper-parameters
    ``cfgs[p]`` (``kernels.rule.apply_flat``, what ``rule.apply`` runs), the update
    tick and the event into the log. Every array is flat; ``RD[p]`` / ``S1[p]`` /
    ``S2[p]`` may be empty where the rule does not use them. Returns the gap."""
    for p in range(len(G)):
        if not all_finite(G[p]):
            return -1
    gap = others_updates(slots, me) - others
    for p in range(len(G)):
        apply_flat(kinds[p], cfgs[p], params[p], S1[p], S2[p], K, p, G[p], RD[p], gap)
    slots[me, UPD] += 1
    record(gh, lh, stats, ring, me, step, gap, lag, 1, t_ns)
    return gap
