"""The simulator's event loop in virtual time, around the step's two halves.

``hogkit.engine.simulator`` owns the semantics (its module docstring). One loop serves both
engines: given a compiled workload's step (``layout.FusedStep``) it runs the step core's
:func:`step.begin` / :func:`step.end` itself (the *fused* engine); given ``None``
numba prunes those calls and the loop hands each step half back to Python
(``R_BEGIN`` / ``R_END``), which runs the reference step (the *Python* engine, for any
workload and for local SGD). Scheduling, admission, DSSP grants, wake-ups, step times
and evaluation points are therefore the same code in both, and the engines give
bit-identical results for the same seed:

- one pending event per worker: ``START`` (the policy's admission test, then
  :func:`step.begin`: sample, read the clock vector, gradient, guard) or ``FINISH``
  (:func:`step.end`: density, gap, rule, tick; then the record); the next event is the
  smallest ``(time, kind, seq)`` with ``FINISH = 0 < START = 1`` (updates that finish at
  time t are visible to reads at t) and ``seq`` a global counter (FIFO among equal
  times), found by a scan of every worker or, from ``layout.QUEUE_MIN_WORKERS``
  workers on, kept by a tournament tree over them (``layout.G_QUEUE``: O(log W) an
  event); the wake-up after a finish scans only while a worker is blocked;
- the clocks are a private slot matrix (``clock.py`` layout), so clock lag, others'
  updates, SSP admission and DSSP's grant are the live definitions; virtual times are
  kept in ns + 1 in the ``BEAT`` slot (0 means "never");
- admission is ``clock.admit`` on the policy's encoded row (SSP, BSP, Async, DSSP,
  bounded delay: the live state machine): a worker that may not start blocks until a
  finish event changes the clocks; after every finish (and every retirement) the
  blocked workers are re-checked in rank order (``clock.blocked``) and released at
  that time; a released worker proceeds once without a new check, as after a live
  wait (for the SSP family the check would pass anyway: at the same instant clocks
  only grow and DONE workers only leave the minimum); DONE workers leave the
  minimum.

State lives in arrays so the loop can return to Python (to evaluate the loss, to
refill a worker's pre-drawn step times, to raise on a non-finite gradient) and
resume. Per-worker buffers and rule and density state come as stacks (every array
with a leading worker axis, :func:`pick`), generators in a typed list.
Deterministic: one thread, no races. Nothing here imports hogkit.
"""

import numpy as np
from numba import njit, types
from numba.extending import overload
from numba.typed import List

from .clock import (A_RELEASED, DONE, ITER, NADM, STATE, admit, blocked, clock_lag,
                    finish_iteration)
from .layout import (ADM_WIDTH, C_BATCH, C_EVAL_T, C_EVAL_U, C_KEEP, C_SKIP, C_T_STOP,
                     EV_NONE, F_LAST, F_T, F_WAIT, F_WAIT_SINCE, FINISH, G_BLOCKED,
                     G_QUEUE, G_SEQ, G_TOTAL, G_WHO, I_ADM, I_BAD, I_BLOCKED, I_FILLED,
                     I_HELD, I_KIND, I_LAG, I_OREAD, I_PHASE, I_QUOTA, I_SEQ, I_SKIPPED,
                     I_STARTED, R_BEGIN, R_DONE, R_END, R_EVAL_T, R_EVAL_U, R_NONFINITE,
                     R_REFILL, R_RETIRE, START)
from .pacer import load_factor
from .rule import FASTMATH
from .staleness import record_event
from .step import begin, end

if ADM_WIDTH != NADM:         # pragma: no cover - a layout edit that missed the clock's
    raise ImportError(f"layout.ADM_WIDTH={ADM_WIDTH} but clock.NADM={NADM}: the "
                      f"simulator's ist columns would overlap; make them equal")

# a START's admission, inside the loop: go on with the step / blocked
_GO, _BLOCK = -1, -2


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def step_time(base, speed, amp, period, t, pause):
    """``base · speed · load(t) + pause`` with Load's factor ``load(t) =
    pacer.load_factor(amp, period, t)`` (``amp = 0`` gives 1 exactly); used by both
    simulator engines."""
    f = 1.0
    if amp != 0.0:
        f = load_factor(amp, period, t)
    return base * speed * f + pause


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def vt_ns(t):
    """Virtual seconds as the int ns the log and the clock slots keep."""
    return np.int64(t * 1e9)


@njit(cache=True, nogil=True, inline="always")
def _before(ta, ka, sa, tb, kb, sb):
    """Event ``(ta, ka, sa)`` comes before ``(tb, kb, sb)``: the smaller ``(time, kind,
    seq)`` (``seq`` is unique, so the order is total). Scalars only: an inlined helper
    taking arrays pays their reference counts at every call, in a loop too."""
    return ta < tb or (ta == tb and (ka < kb or (ka == kb and sa < sb)))


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def _requeue(ist, fst, gi, w):
    """Worker ``w``'s event changed (scheduled, or gone: ``EV_NONE``): its leaf of the
    queue (``layout.G_QUEUE``), then every slot above it, up to the root: O(log W)
    where a scan of every worker is O(W) an event (at 512 workers the loop ran ~1.5x
    faster with the queue). Called only where there is a queue."""
    P = (gi.shape[0] - G_QUEUE) >> 1
    i = P + w
    gi[G_QUEUE + i] = w if ist[w, I_KIND] != EV_NONE else -1
    i >>= 1
    while i > 0:
        a = gi[G_QUEUE + 2 * i]
        b = gi[G_QUEUE + 2 * i + 1]
        if a < 0 or (b >= 0 and _before(fst[b, F_T], ist[b, I_KIND], ist[b, I_SEQ],
                                        fst[a, F_T], ist[a, I_KIND], ist[a, I_SEQ])):
            a = b
        gi[G_QUEUE + i] = a
        i >>= 1


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def build_queue(ist, fst, gi):
    """Fill the event queue from every worker's pending event (before the loop); no
    queue below ``layout.QUEUE_MIN_WORKERS`` (``gi`` ends at ``G_QUEUE``)."""
    gi[G_QUEUE:] = -1
    if gi.shape[0] > G_QUEUE:
        for w in range(ist.shape[0]):
            _requeue(ist, fst, gi, w)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def _pop(ist, fst):
    """The worker whose event comes next (-1: none), by a scan of every worker (in the
    order of :func:`_before`, its loads as needed): with fewer workers than
    ``layout.QUEUE_MIN_WORKERS`` this costs less than keeping the queue."""
    best = -1
    for q in range(ist.shape[0]):
        k = ist[q, I_KIND]
        if k == EV_NONE:
            continue
        if best < 0:
            best = q
            continue
        tq, tb = fst[q, F_T], fst[best, F_T]
        if tq < tb or (tq == tb and (k < ist[best, I_KIND] or (
                k == ist[best, I_KIND] and ist[q, I_SEQ] < ist[best, I_SEQ]))):
            best = q
    return best


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def _schedule(ist, fst, gi, w, t, kind):
    fst[w, F_T] = t
    ist[w, I_KIND] = kind
    ist[w, I_SEQ] = gi[G_SEQ]
    gi[G_SEQ] += 1
    if gi.shape[0] > G_QUEUE:
        _requeue(ist, fst, gi, w)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def _unschedule(ist, fst, gi, w):
    """Worker ``w`` has no pending event (blocked, retired or done)."""
    ist[w, I_KIND] = EV_NONE
    if gi.shape[0] > G_QUEUE:
        _requeue(ist, fst, gi, w)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def _wake(slots, ist, fst, gi, pol, t):
    """Release, at time ``t``, every blocked worker whose lead is down to its bound (in
    rank order; nothing to scan when none is blocked: ``gi[G_BLOCKED]`` counts them)."""
    if gi[G_BLOCKED] == 0:
        return
    for q in range(ist.shape[0]):
        if ist[q, I_BLOCKED] != 0 and not blocked(slots, q, pol,
                                                  ist[q, I_ADM:I_ADM + NADM]):
            ist[q, I_BLOCKED] = 0
            gi[G_BLOCKED] -= 1
            fst[q, F_WAIT] += t - fst[q, F_WAIT_SINCE]
            ist[q, I_ADM + A_RELEASED] = 1
            _schedule(ist, fst, gi, q, t, START)


@njit(cache=True, nogil=True, inline="always")
def _admit_start(slots, ist, fst, gi, cfg, pol, grants, w, k, t):
    """Worker ``w``'s START at ``t``, before its step: R_RETIRE (DONE by the time
    budget: it leaves the minimum), R_REFILL (out of step times), else the policy's
    admission: ``_BLOCK`` (blocked until a finish wakes it) or ``_GO`` (its clock lag
    kept for the record)."""
    if t >= cfg[C_T_STOP]:
        _unschedule(ist, fst, gi, w)
        slots[w, STATE] = DONE
        _wake(slots, ist, fst, gi, pol, t)
        return R_RETIRE
    if k >= ist[w, I_FILLED]:
        return R_REFILL
    lag = clock_lag(slots, w)
    if not admit(slots, w, pol, ist[w, I_ADM:I_ADM + NADM], grants, lag):
        _unschedule(ist, fst, gi, w)
        ist[w, I_BLOCKED] = 1
        gi[G_BLOCKED] += 1
        fst[w, F_WAIT_SINCE] = t
        return _BLOCK
    ist[w, I_LAG] = lag
    return _GO


@njit(cache=True, nogil=True, inline="always")
def _finished(slots, ist, fst, gi, pol, w, k, t):
    """The end of worker ``w``'s iteration ``k`` at ``t``: tick its clock, then its
    next START at ``t`` (or DONE at its quota), then wake who may go now."""
    finish_iteration(slots, w, vt_ns(t) + 1)
    fst[w, F_LAST] = t
    if k + 1 >= ist[w, I_QUOTA]:
        _unschedule(ist, fst, gi, w)
        slots[w, STATE] = DONE
    else:
        _schedule(ist, fst, gi, w, t, START)
    _wake(slots, ist, fst, gi, pol, t)


def pick(tree, w):
    """Worker ``w``'s part of ``tree``, a (nested) tuple of per-worker stacks: ``a[w]``
    for every array in it, the same nesting: views, built in compiled code, where a
    numba typed list's ``getitem`` of one worker's buffer tuple cost ~110 ns (a C call
    and a copy of the item; measured), two to three a simulated update. The overload
    is not ``inline="always"``: under numba 0.68 the inlined body clobbered the loop's
    own variables (the updates went uncounted: ``tests/test_simulate.py``)."""
    if isinstance(tree, tuple):
        return tuple(pick(x, w) for x in tree)
    return tree[w]


@overload(pick)
def _pick_jit(tree, w):
    if isinstance(tree, types.Array):
        return lambda tree, w: tree[w]
    if isinstance(tree, types.BaseTuple):
        if len(tree) == 0:
            return lambda tree, w: ()
        body = "".join(f"pick(tree[{i}], w), " for i in range(len(tree)))
        scope = {"pick": pick}
        exec(f"def impl(tree, w):\n    return ({body})\n", scope)
        return scope["impl"]
    return None


@njit(cache=True, nogil=True, inline="always")
def _count(gh, lh, stats, ring, ist, gi, w, k, gap, t):
    """Count worker ``w``'s applied step ``k`` (``gap < 0``: held back, not an update)
    and record it in the log at virtual time ``t``."""
    if gap < 0:
        ist[w, I_HELD] += 1
    else:
        gi[G_TOTAL] += 1
        record_event(gh, lh, stats, ring, w, k, gap, ist[w, I_LAG], vt_ns(t), 1)


def rng_of(rngs, w):
    """Worker ``w``'s generator: ``rngs[w]``, or None when ``rngs`` is None (the
    sampler draws nothing). An overload when compiled (the branch is decided by the
    type); this body interpreted."""
    return None if rngs is None else rngs[w]


@overload(rng_of, inline="always")
def _rng_of_jit(rngs, w):
    if isinstance(rngs, types.NoneType):
        return lambda rngs, w: None
    return lambda rngs, w: rngs[w]


def _run_events(step, loop):
    """Run the event loop until it is done or must return to Python; returns a code.

    ``step``: the fused engine's :class:`~.layout.FusedStep` (None: the Python engine):
    ``pick(step.wbufs, w)`` is worker w's step buffers (:func:`pick`: per-worker
    stacks, not typed lists), ``pick(step.wrule, w)`` its rule state ``(S1, S2, K)``
    (stacks of one: every worker's, ``rule_state="shared"``), ``pick(step.wdens, w)``
    its residuals, ``rng_of(step.rngs, w)`` its generator, ``step.cursors[w]`` its
    cursor. ``loop``: the :class:`~.layout.EventLoop`; its ``times`` = (base (W, C),
    pause (W, C), speed, amp, period (W,)): worker w's step k uses slot k % C, valid
    while ``ist[w, I_STARTED] < ist[w, I_FILLED]``; its ``policy`` = ``(pol, grants)``:
    the encoded row and the DSSP grants (``clock.admit``).

    Codes (``gi[G_WHO]`` names the worker): R_DONE (no events left), R_EVAL_T (the next
    event is at or past ``cfg[C_EVAL_T]``; not consumed), R_EVAL_U (a finish brought
    the update count to ``cfg[C_EVAL_U]``), R_REFILL (the worker needs its next C step
    times; not consumed), R_NONFINITE (a non-finite gradient and ``cfg[C_SKIP] == 0``;
    not consumed); with ``step=None`` also R_BEGIN (compute its step now, set ``ist[w,
    I_BAD]``), R_END (apply it now; count it in ``gi[G_TOTAL]`` and ``ist[w, I_HELD]``)
    and R_RETIRE (DONE by the time budget: merge what is pending). It resumes where it
    returned.
    """
    slots, log, times, ist, fst, gi, cfg, policy = loop
    base, pause, speed, amp, period = times
    gh, lh, stats, ring = log
    pol, grants = policy
    C = base.shape[1]
    keep = cfg[C_KEEP] != 0.0
    nb = int(cfg[C_BATCH])
    while True:
        # the next event: the queue's root, or a scan where there is no queue
        w = gi[G_QUEUE + 1] if gi.shape[0] > G_QUEUE else _pop(ist, fst)
        if w < 0:
            return R_DONE
        t = fst[w, F_T]
        if t >= cfg[C_EVAL_T]:
            return R_EVAL_T
        gi[G_WHO] = w
        k = ist[w, I_STARTED]
        if ist[w, I_KIND] == START:
            if ist[w, I_PHASE] == 0:
                code = _admit_start(slots, ist, fst, gi, cfg, pol, grants, w, k, t)
                if code == R_REFILL or (code == R_RETIRE and step is None):
                    return code
                if code != _GO:
                    continue
                if step is None:
                    ist[w, I_PHASE] = 1
                    return R_BEGIN
                others, ok = begin(step.wl, rng_of(step.rngs, w), step.cursors[w],
                                   step.params, pick(step.wbufs, w), slots, w, nb, keep)
                ist[w, I_OREAD] = others
                ist[w, I_BAD] = 0 if ok else 1
            ist[w, I_PHASE] = 0
            ist[w, I_STARTED] = k + 1
            dt = step_time(base[w, k % C], speed[w], amp[w], period[w], t, pause[w, k % C])
            _schedule(ist, fst, gi, w, t + dt, FINISH)
            continue
        k = slots[w, ITER]                                  # FINISH
        if ist[w, I_PHASE] == 0:
            if ist[w, I_BAD] != 0:
                if cfg[C_SKIP] == 0.0:
                    return R_NONFINITE
                ist[w, I_SKIPPED] += 1
                ist[w, I_BAD] = 0
            elif step is None:
                ist[w, I_PHASE] = 1
                return R_END
            else:
                one = step.wrule[2].shape[0] == 1            # one stack: shared state
                rw = 0 if one else w
                gap = end(step.params, pick(step.wbufs, w),
                          (step.rule,) + pick(step.wrule, rw) + (True, one),
                          (step.dens, pick(step.wdens, w), step.mask), slots,
                          (w, ist[w, I_OREAD], k))
                _count(gh, lh, stats, ring, ist, gi, w, k, gap, t)
        ist[w, I_PHASE] = 0
        _finished(slots, ist, fst, gi, pol, w, k, t)
        if gi[G_TOTAL] >= cfg[C_EVAL_U]:
            return R_EVAL_U


@njit(cache=True, fastmath=FASTMATH)
def list_of(item):
    """A numba typed list holding ``item``: built here, in a cached function, because
    ``numba.typed.List(items)`` compiles its ``_make_list`` and ``_append`` for each
    item type in every process (0.8 s of a fresh ``hogkit sim``'s set-up, measured)."""
    out = List()
    out.append(item)
    return out


@njit(cache=True, fastmath=FASTMATH)
def list_push(items, item):
    """Append ``item`` to a list from :func:`list_of` (cached, as it is)."""
    items.append(item)


def typed_list(items):
    """``numba.typed.List(items)`` (at least one item) from the cached builders."""
    out = list_of(items[0])
    for x in items[1:]:
        list_push(out, x)
    return out


#: cached per workload type (hogkit's own workloads), and the per-process twin
run_events = njit(cache=True, nogil=True, fastmath=FASTMATH)(_run_events)
run_events_uncached = njit(nogil=True, fastmath=FASTMATH)(_run_events)
