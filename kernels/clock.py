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

Every definition here exists once; the live runtime (through ``hogkit.state.clocks``,
``hogkit.state.reader``, ``hogkit.policy``), the compiled step core and both simulator engines
call these functions on their own slots (shared memory live, private arrays simulated).

- **clock lag** of worker p: ``c_p - min_q c_q`` over the workers that are not DONE (p
  always counts), so a worker that finished its steps never holds the others back.
- **others' updates**: ``sum_q u_q - u_p``; the update gap of an apply is its value now
  minus its value at the read.
- **admission** (:func:`admit`): whether a worker may start its next iteration under
  a consistency policy, encoded as a small int64 row (below). One state machine serves
  the compiled step core, both simulator engines and the Python ``policy.wait``.

Nothing here imports hogkit; the caller checks ranks.

**The policy row** (``hogkit.policy``'s ``encode()``; ``NPOL`` int64 columns):

=================  ===================================================================
``P_KIND``         ``K_SSP``, ``K_DSSP`` or ``K_DELAY``
``P_A``            SSP's s (-1: unbounded, Async and LocalSGD); DSSP's s_lo;
                   bounded delay's K
``P_B``            DSSP's s_hi (0 otherwise)
=================  ===================================================================

Each kind bounds a *lead* (:func:`lead`): the clock lag ``c_p - min_q c_q`` for the
SSP family (SSP, BSP, Async, DSSP), and for bounded-delay async (Lian et al., NeurIPS
2015: the delay is bounded by T) a worker's update count above the mean
of the running workers', ``u_p - (sum_q u_q)/n``, rounded up: with integer K,
``ceil(x) <= K`` exactly when ``n·u_p - sum_q u_q <= n·K``, so nothing rounds.

**A worker's admission state** (``NADM`` int64 columns, one row per worker, private to
it): ``A_EXTRA`` DSSP's grant r* in force (-1: none, the episode is over),
``A_RELEASED`` set by whoever ended a wait (the worker's next admission proceeds
without a check, once, and decides afresh after it), ``A_WAIT`` the bound a blocked
worker waits for (its lead must come down to it).
"""

import numpy as np
from numba import njit

from ._intrinsics import FASTMATH

SLOT = 8
UPD, ITER, BEAT, STATE, INTERVAL, STEP = 0, 1, 2, 3, 4, 5
IDLE, RUNNING, DONE, FAILED = 0, 1, 2, 3
#: the policy row's columns and kinds (module docstring)
P_KIND, P_A, P_B = 0, 1, 2
NPOL = 3
K_SSP, K_DSSP, K_DELAY = 0, 1, 2
#: a worker's admission state (module docstring)
A_EXTRA, A_RELEASED, A_WAIT = 0, 1, 2
NADM = 3
#: bins of the histogram of DSSP grants (r* past the last bin counts in the last)
GRANT_BINS = 64


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


@njit(cache=True, nogil=True, fastmath=FASTMATH)
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


@njit(cache=True, nogil=True, fastmath=FASTMATH)
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


# --- admission: one state machine for every engine ----------------------------------

@njit(cache=True, nogil=True, inline="always")
def unbounded(pol):
    """True for a policy that never waits (Async, LocalSGD: SSP with ``s < 0``)."""
    return pol[P_KIND] == K_SSP and pol[P_A] < 0


@njit(cache=True, nogil=True, inline="always")
def counted(pol):
    """The slot column a policy bounds: ``UPD`` for bounded delay, else ``ITER``."""
    return UPD if pol[P_KIND] == K_DELAY else ITER


@njit(cache=True, nogil=True, inline="always")
def update_lead(slots, me):
    """``ceil(u_me - mean_q u_q)`` over the workers that are not DONE (``me`` always
    counts): how many updates ``me`` is ahead of the running workers' mean, rounded up
    (bounded delay's lead; the module docstring)."""
    u = slots[me, UPD]
    n = 0
    total = 0
    for q in range(slots.shape[0]):
        if q == me or slots[q, STATE] != DONE:
            n += 1
            total += slots[q, UPD]
    return -((total - n * u) // n)              # ceil((n·u - total) / n), exactly


@njit(cache=True, nogil=True, inline="always")
def lead(slots, me, pol):
    """The quantity ``pol`` bounds for worker ``me`` now: its clock lag (the SSP
    family), or its update lead (bounded delay)."""
    if pol[P_KIND] == K_DELAY:
        return update_lead(slots, me)
    return clock_lag(slots, me)


@njit(cache=True, nogil=True, inline="always")
def lead_given(slots, me, kind, lag):
    """:func:`lead` for a policy of ``kind``, given me's clock lag ``lag`` measured by
    the caller just now (the SSP family's lead: the clocks are scanned once)."""
    if kind == K_DELAY:
        return update_lead(slots, me)
    return lag


@njit(cache=True, nogil=True, inline="always")
def admitted_as_is(bound, extra, released, x):
    """The common case of :func:`admit`, on scalars: no release pending, no DSSP grant
    in force, and the lead ``x`` within ``bound`` = ``P_A`` (SSP's s, DSSP's s_lo,
    bounded delay's K). Then :func:`admit` proceeds and changes nothing, so a caller
    may skip it: the step core tests this first on values it holds, and binds the
    arrays :func:`admit` takes (whose reference counts numba cannot prune from a loop:
    ~40 ns a step) only when it fails."""
    return released == 0 and extra < 0 and x <= bound


@njit(cache=True, nogil=True, inline="always")
def blocked(slots, me, pol, adm):
    """The re-check while ``me`` waits: its lead is still above ``adm[A_WAIT]``."""
    return lead(slots, me, pol) > adm[A_WAIT]


@njit(cache=True, nogil=True, inline="always")
def proceed_released(adm):
    """A worker released from a wait proceeds now; DSSP decides afresh next time."""
    adm[A_RELEASED] = 0
    adm[A_EXTRA] = -1


@njit(cache=True, nogil=True, inline="always")
def admit(slots, me, pol, adm, grants, lag):
    """May worker ``me`` start its next iteration under policy row ``pol``? True to
    proceed; False with the bound to wait for in ``adm[A_WAIT]`` (then wait until
    :func:`blocked` is False, and set ``adm[A_RELEASED]``).

    ``lag`` is me's clock lag measured by the caller just now (the SSP family's lead:
    the step core records it, so the clocks are scanned once). ``adm`` is me's
    admission state, ``grants`` its histogram of DSSP grants. The states:

    - released from a wait: proceed once without a check (:func:`proceed_released`);
    - SSP(s) (``s < 0``: never wait) and bounded delay(K): proceed while the lead is
      ``<= s`` (``<= K``);
    - DSSP(s_lo, s_hi) (Zhao et al., ICDCS 2019): lag ``<= s_lo`` proceeds and ends the
      episode; past it, the episode's grant r* is decided once (:func:`dssp_decide`,
      counted in ``grants[min(r*, GRANT_BINS - 1)]``) and me proceeds while lag
      ``<= s_lo + r*``.
    """
    if adm[A_RELEASED] != 0:
        proceed_released(adm)
        return True
    kind = pol[P_KIND]
    bound = pol[P_A]
    x = lag
    if kind == K_DSSP:
        if lag <= bound:
            adm[A_EXTRA] = -1
            return True
        if adm[A_EXTRA] < 0:                      # a new episode: DSSP's grant
            r = dssp_decide(slots, me, slots[me, BEAT], bound, pol[P_B])
            adm[A_EXTRA] = r
            grants[min(r, GRANT_BINS - 1)] += 1
        bound += adm[A_EXTRA]
    elif bound < 0:
        return True
    else:
        x = lead_given(slots, me, kind, lag)
    if x <= bound:
        return True
    adm[A_WAIT] = bound
    return False


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def holding_back(slots, me, pol, adm, out):
    """Write into ``out`` the ranks holding back ``me``, which waits for
    ``adm[A_WAIT]``; returns how many. A rank holds ``me`` back when it is not DONE and
    its counter (:func:`counted`) is more than the bound below me's: for the SSP family
    the workers whose clocks keep the minimum too low; for bounded delay, while me is
    blocked, at least one such worker exists (me's lead above K needs a peer more than
    K updates behind it)."""
    col = counted(pol)
    need = slots[me, col] - adm[A_WAIT]
    n = 0
    for q in range(slots.shape[0]):
        if q != me and slots[q, STATE] != DONE and slots[q, col] < need:
            out[n] = q
            n += 1
    return n


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def admit_now(slots, me, pol, adm, grants):
    """:func:`admit` measuring me's clock lag itself (for a caller that records none:
    the Python ``policy.wait``)."""
    return admit(slots, me, pol, adm, grants, clock_lag(slots, me))


def admission_state():
    """A fresh admission state row (no grant in force, not released, no wait)."""
    adm = np.zeros(NADM, np.int64)
    adm[A_EXTRA] = -1
    return adm
