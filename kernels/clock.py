"""Per-worker clock slots, and the definitions read from them: clock lag, others'
updates, the SSP/DSSP admission test and DSSP's grant.

Layout: one int64 row of ``SLOT`` (8) columns per worker, so each worker's row is one
64-byte cache line and a worker writing its own counters never invalidates the line
another worker writes (no false sharing; with one line per worker, a reader of a peer's
counters fetches exactly one line). Columns:

=================  ===================================================================
``UPD``            updates applied by the worker (the staleness clock)
``ITER``           iterations finished (the SSP clock ``c_p``)
``BEAT``           ``monotonic_ns`` of the worker's last heartbeat (its last finish)
``STATE``          IDLE 0 / RUNNING 1 / DONE 2 / FAILED 3
``INTERVAL``       ns its latest iteration took, finish to finish (DSSP's timing)
``STEP``           the step being run now (blame on failure)
=================  ===================================================================

Every definition here exists once; the live runtime (through ``hogkit.clocks``,
``hogkit.reader``, ``hogkit.policy``), the compiled step core and both simulator engines
call these functions on their own slots (shared memory live, private arrays simulated).

- **clock lag** of worker p: ``c_p - min_q c_q`` over the workers that are not DONE (p
  always counts), so a worker that finished its steps never holds the others back.
- **others' updates**: ``sum_q u_q - u_p``; the update gap of an apply is its value now
  minus its value at the read.
- **SSP(s) admission**: a worker may start an iteration while its lag is ``<= s``
  (``s < 0`` means unbounded: Async).

Nothing here imports hogkit; the caller checks ranks.
"""

import numpy as np
from numba import njit

SLOT = 8
UPD, ITER, BEAT, STATE, INTERVAL, STEP = 0, 1, 2, 3, 4, 5
IDLE, RUNNING, DONE, FAILED = 0, 1, 2, 3


@njit(cache=True, nogil=True, inline="always")
def clock_lag(slots, me):
    """``c_me - min`` over workers that are not DONE (``me`` always counts)."""
    c = slots[me, ITER]
    m = c
    for q in range(slots.shape[0]):
        if q != me and slots[q, STATE] != DONE:
            cq = slots[q, ITER]
            if cq < m:
                m = cq
    return c - m


@njit(cache=True, nogil=True, inline="always")
def others_updates(slots, me):
    """Updates applied by every worker but ``me`` (a racy sum over single-writer slots:
    each only grows, so the sum lies between its values at the start and end of the
    read)."""
    s = 0
    for q in range(slots.shape[0]):
        s += slots[q, UPD]
    return s - slots[me, UPD]


@njit(cache=True, nogil=True, inline="always")
def admitted(lag, bound):
    """SSP's rule: proceed while ``lag <= bound``; a negative bound is unbounded."""
    return bound < 0 or lag <= bound


@njit(cache=True, nogil=True)
def dssp_extra(last_f, interval_f, last_s, interval_s, r_max):
    """DSSP's synchronization controller (Zhao et al., ICDCS 2019).

    The fastest worker would finish its next iterations at ``last_f + r·interval_f``
    (r = 0..r_max), the slowest at ``last_s + k·interval_s`` (k >= 1). Returns the r
    whose time is closest to one of the slowest's (ties: the smaller r); 0 means "wait
    now". Any non-positive or non-finite interval makes the prediction impossible: 0.
    """
    if r_max <= 0 or not (interval_f > 0.0 and interval_s > 0.0):
        return 0
    if not (np.isfinite(interval_f) and np.isfinite(interval_s)):
        return 0
    best = 0
    best_d = np.inf
    for r in range(r_max + 1):
        t_f = last_f + r * interval_f
        k = max(np.rint((t_f - last_s) / interval_s), 1.0)
        d = abs(t_f - (last_s + k * interval_s))
        if d < best_d:
            best_d = d
            best = r
    return best


@njit(cache=True, nogil=True)
def dssp_decide(slots, me, now, s_lo, s_hi):
    """The grant r* in ``[0, s_hi - s_lo]`` for worker ``me`` past ``s_lo``, from each
    worker's last finish (``BEAT``) and latest iteration time (``INTERVAL``): 0 unless
    ``me`` is the fastest running worker and every tied slowest worker has a timing.
    Among several tied slowest workers the one predicted to finish last counts (the
    minimum moves when the last of them finishes). ``now`` is me's own finish time."""
    W = slots.shape[0]
    c = slots[me, ITER]
    lo = c
    for q in range(W):
        if q == me or slots[q, STATE] != DONE:
            cq = slots[q, ITER]
            if cq > c:
                return 0                       # not the fastest
            if cq < lo:
                lo = cq
    best_next = -np.inf
    last_s = 0.0
    interval_s = 0.0
    found = False
    for q in range(W):
        if q == me or slots[q, STATE] == DONE or slots[q, ITER] != lo:
            continue
        iv = float(slots[q, INTERVAL])
        hb = float(slots[q, BEAT])
        if iv <= 0.0 or hb <= 0.0:
            return 0                           # no timing yet: behave as SSP(s_lo)
        if hb + iv > best_next:
            best_next = hb + iv
            last_s = hb
            interval_s = iv
            found = True
    if not found:
        return 0
    return dssp_extra(float(now), float(slots[me, INTERVAL]), last_s, interval_s,
                      s_hi - s_lo)


@njit(cache=True, nogil=True, inline="always")
def finish_iteration(slots, me, now):
    """Tick ``me``'s iteration clock; with a time ``now > 0`` also record its latest
    iteration time and heartbeat (DSSP's timing)."""
    if now > 0:
        last = slots[me, BEAT]
        if last > 0:
            slots[me, INTERVAL] = now - last
        slots[me, BEAT] = now
    slots[me, ITER] += 1
