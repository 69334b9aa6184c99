"""Consistency policies: when may a worker start its next iteration?

Worker ``p``'s clock is ``c_p = clocks.iterations[p]`` (iterations finished). Before each
iteration the worker calls ``policy.wait(clocks, p)``. The policies (docs/algorithms.md §2):

- **SSP(s)** (Ho et al., NIPS 2013): worker p at clock c may proceed only while
  ``c − min_q c_q ≤ s``. Read-my-writes holds trivially (one shared copy).
- **BSP()** is ``SSP(0)`` and **Async()** (ASP, Hogwild!) is ``SSP(∞)``: subclasses of
  :class:`SSP` that ``SSP`` itself builds for those bounds, so ``SSP(0)`` is a ``BSP``,
  ``BSP() == SSP(0)`` and ``Async() == SSP(math.inf)``.
- **DSSP(s_lo, s_hi)** (Zhao et al., ICDCS 2019): a threshold chosen at run time in
  [s_lo, s_hi] from the workers' recent iteration times (see :class:`DSSP`).
- **LocalSGD(h, overlap)** (local SGD / HLSGD, Zhou et al. 2020): h private steps, then a
  merge of the average change; its wait never blocks (see :class:`LocalSGD`,
  :mod:`hogkit.policy.local_sgd` for the merge arithmetic).

Choices made here (the papers leave them open):

- **DONE workers are excluded from the minimum** (treated as infinitely fast). A worker
  that finished its steps never ticks again; counting its frozen clock would block the
  others forever when workers run different numbers of steps. The waiting worker itself
  always counts, so ``lag = c_p − min`` is never negative. FAILED and IDLE workers count
  with their clocks as they are (an IDLE worker is about to start at 0).
- **Stop**: ``wait`` returns as soon as ``clocks.stopping()`` is true, without proceeding
  rights; the caller must check ``clocks.stopping()`` after ``wait`` (the runtime does).
- **Failure**: if a worker that blocks the waiter (one whose clock keeps ``c_p − min``
  above the bound) is marked FAILED, ``wait`` raises :class:`~hogkit.errors.WorkerFailed`
  naming that rank at once. Otherwise, after ``timeout`` seconds it raises
  :class:`~hogkit.errors.PolicyTimeout` naming each blocking rank, its clock, state and
  heartbeat age, flagging as *suspect* any whose heartbeat is older than ``stale_after``.
  A frozen clock therefore never blocks anyone forever.
- **Waiting** re-checks without sleeping for the first 100 µs (a barrier between
  workers of equal speed usually opens within that), then sleeps from 20 µs doubling
  to a 0.5 ms cap, so a long wait costs no core and wakes at most ~0.5 ms late. With
  a 2 ms cap, LB-BSP's balanced barriers woke late often enough to cut its gain
  from 1.63x to 1.39x (benchmarks/RESULTS.md).
- The check reads the clock vector slot by slot while others write it; it is not a
  snapshot, but every slot only grows, so a stale read can only make the waiter wait
  longer, never let it proceed past the bound.

Every policy is a small picklable object with ``wait``, ``may_proceed``, ``bound`` and
``config()``. The pure predicate :func:`may_proceed` is what the tests (and the
simulator) use; ``wait`` is that predicate in a backoff loop.
"""

from __future__ import annotations

import math
import time

import numpy as np

from hogkit.state.clocks import DONE, FAILED, STATES
from hogkit.errors import InvalidArgument, InvalidType, PolicyTimeout, WorkerFailed
from hogkit.validation import check_float, check_int

__all__ = ["SSP", "BSP", "Async", "DSSP", "LocalSGD", "may_proceed",
           "clock_lag", "dssp_extra"]

#: Backoff: immediate re-checks, then sleeps from _SLEEP_MIN doubling to _SLEEP_MAX (s).
_SPINS = 4
_SLEEP_MIN = 20e-6
_SLEEP_MAX = 5e-4
#: ...and re-check without sleeping for the first _SPIN_S seconds of a wait (s)
_SPIN_S = 1e-4
#: A blocking peer whose heartbeat is older than this (s) is named as suspect.
STALE_AFTER = 10.0


# --------------------------------------------------------------------------- pure core

def clock_lag(iterations, state, rank) -> int:
    """``c_rank − min_q c_q`` over workers that are not DONE (``rank`` always counts):
    the definition of ``hogkit.kernels.clock.clock_lag``, on plain sequences.

    Pure: ``iterations`` and ``state`` are int arrays (or lists) of length W, the
    clocks' views or private copies.
    """
    if isinstance(iterations, np.ndarray):
        iterations = iterations.tolist()
    if isinstance(state, np.ndarray):
        state = state.tolist()
    c = iterations[rank]
    m = c
    for q, (cq, sq) in enumerate(zip(iterations, state)):
        if cq < m and sq != DONE and q != rank:
            m = cq
    return int(c - m)


def may_proceed(iterations, state, rank, bound) -> bool:
    """SSP(bound)'s rule: ``c_rank − min_q c_q ≤ bound`` (DONE workers excluded).

    ``bound`` is a non-negative int or ``math.inf`` (then always True).
    """
    if bound == math.inf:
        return True
    return clock_lag(iterations, state, rank) <= bound


def _blockers(iterations, state, rank, bound):
    """Ranks whose clocks keep ``rank`` from proceeding under ``bound``."""
    need = int(iterations[rank]) - bound  # a peer must have finished >= need
    return [q for q in range(len(iterations))
            if q != rank and state[q] != DONE and int(iterations[q]) < need]


def _check_bound(name, value, what):
    if isinstance(value, float) and value == math.inf:
        return math.inf
    value = check_int(f"{what} {name}", value,
                      fix="pass a non-negative int, or use Async() for unbounded")
    if value < 0:
        raise InvalidArgument(f"{what} {name}={value} must be a non-negative int; "
                              f"use Async() for unbounded")
    return value


def _wait_loop(policy, clocks, rank, timeout, stale_after, bound_fn):
    """Shared backoff loop. ``bound_fn()`` returns the bound to test against now.

    Returns seconds waited. Raises WorkerFailed / PolicyTimeout (see module doc).
    """
    it, st = clocks.iterations, clocks.state
    if may_proceed(it, st, rank, bound_fn()):
        return 0.0
    timeout = check_float("timeout", timeout, min_value=0.0,
                          fix="pass a timeout in seconds, e.g. timeout=60.0")
    t0 = time.monotonic()
    deadline = t0 + timeout
    spins = 0
    sleep = _SLEEP_MIN
    while True:
        bound = bound_fn()
        if may_proceed(it, st, rank, bound):
            return time.monotonic() - t0
        if clocks.stopping():
            return time.monotonic() - t0
        blockers = _blockers(it, st, rank, bound)
        failed = [q for q in blockers if st[q] == FAILED]
        if failed:
            q = failed[0]
            raise WorkerFailed(
                q, step=int(it[q]),
                reason=(f"is marked FAILED; its frozen clock c={int(it[q])} blocks worker "
                        f"{rank} (clock {int(it[rank])}) under {policy!r}"))
        now = time.monotonic()
        if now >= deadline:
            raise _timeout_error(policy, clocks, rank, bound, blockers, now - t0,
                                 timeout, stale_after)
        if spins < _SPINS or now - t0 < _SPIN_S:
            spins += 1
            continue
        time.sleep(min(sleep, max(deadline - now, 0.0)))
        sleep = min(sleep * 2.0, _SLEEP_MAX)


def _timeout_error(policy, clocks, rank, bound, blockers, waited, timeout, stale_after):
    now_ns = time.monotonic_ns()
    parts, suspects = [], []
    for q in blockers:
        hb = int(clocks.heartbeat_ns[q])
        age = (now_ns - hb) / 1e9 if hb > 0 else math.inf
        state = STATES.get(int(clocks.state[q]), str(int(clocks.state[q])))
        desc = f"worker {q} (clock {int(clocks.iterations[q])}, state {state}, "
        desc += "never beat" if hb <= 0 else f"last beat {age:.2f} s ago"
        if age > stale_after:
            desc += f"; suspect: no heartbeat for > {stale_after:g} s"
            suspects.append(q)
        parts.append(desc + ")")
    c = int(clocks.iterations[rank])
    err = PolicyTimeout(
        f"{policy!r}: worker {rank} at clock {c} waited {waited:.3f} s (timeout={timeout:g} s) "
        f"for {', '.join(parts) or 'no identifiable worker'}; it needs every running worker "
        f"at clock >= {c - bound}. Raise timeout=..., loosen the bound, or look for a "
        f"stuck worker")
    err.rank = rank
    err.blockers = list(blockers)
    err.suspects = suspects
    return err


# --------------------------------------------------------------------------- SSP family

class _Value:
    """A policy's identity is its settings (``_key``): equality, hashing and
    pickling go through them; anything else an instance holds (DSSP's per-episode
    state) is per process and not shipped."""

    __slots__ = ()
    _key = ()                       # the attributes that are the settings

    def _values(self):
        return tuple(getattr(self, k) for k in self._key)

    def __eq__(self, other):
        return isinstance(other, self._family()) and other._values() == self._values()

    def __hash__(self):
        return hash((self._family().__name__,) + self._values())

    def __getstate__(self):
        return self._values()

    def __setstate__(self, values):
        for k, v in zip(self._key, values):
            setattr(self, k, v)
        self._fresh()

    def _family(self):
        return type(self)

    def _fresh(self):
        """Reset per-process state after unpickling (none by default)."""


class SSP(_Value):
    """Stale Synchronous Parallel (Ho et al., NIPS 2013): worker p at clock c proceeds
    only while ``c − min_q c_q ≤ s``.

    ``s`` is a non-negative int, or ``math.inf``. The two ends are classes of their
    own, and ``SSP`` builds them: ``SSP(0)`` is a :class:`BSP` and ``SSP(math.inf)`` an
    :class:`Async` (so ``isinstance(SSP(0), BSP)`` holds, and ``BSP() == SSP(0)``).
    Stateless: one instance may serve every worker (and thread).
    """

    __slots__ = ("s",)
    _key = ("s",)

    def __new__(cls, *args, **kwargs):
        if cls is SSP:
            s = args[0] if args else kwargs.get("s")
            if s.__class__ is not bool and isinstance(s, (int, float, np.integer)):
                cls = BSP if s == 0 else Async if s == math.inf else SSP
        return object.__new__(cls)

    def __init__(self, s):
        self.s = _check_bound("s", s, "staleness bound")

    @property
    def bound(self):
        """The staleness bound ``s`` (``math.inf`` for Async)."""
        return self.s

    @property
    def name(self) -> str:
        return "async" if self.s == math.inf else "bsp" if self.s == 0 else "ssp"

    def may_proceed(self, iterations, state, rank) -> bool:
        """Pure predicate of this policy on a clock vector (see :func:`may_proceed`)."""
        return may_proceed(iterations, state, rank, self.s)

    def wait(self, clocks, rank, *, timeout=60.0, stale_after=STALE_AFTER) -> float:
        """Block until worker ``rank`` may start its next iteration (or stop is asked).

        Returns the seconds waited. Raises WorkerFailed if a blocking peer is FAILED,
        PolicyTimeout after ``timeout`` seconds. The caller checks ``clocks.stopping()``.
        """
        if self.s == math.inf:
            return 0.0
        return self.wait_bound(clocks, rank, self.s, timeout=timeout,
                               stale_after=stale_after)

    def wait_bound(self, clocks, rank, bound, *, timeout=60.0, stale_after=STALE_AFTER):
        """Block until ``rank``'s lag is ``<= bound`` (or stop is asked): the wait the
        compiled step core hands back to Python when its admission test fails."""
        return _wait_loop(self, clocks, rank, timeout, stale_after, lambda: bound)

    def config(self) -> dict:
        return {"name": self.name, "s": None if self.s == math.inf else self.s}

    def __repr__(self):
        return {"async": "Async()", "bsp": "BSP()"}.get(self.name, f"SSP({self.s})")

    def _family(self):
        return SSP                  # BSP() == SSP(0): one family


class BSP(SSP):
    """Bulk Synchronous Parallel: wait until every worker has finished clock c−1.
    Exactly ``SSP(0)``."""

    __slots__ = ()

    def __init__(self, s=0):
        if s != 0:
            raise InvalidArgument(f"BSP is SSP(0); got s={s!r}: use SSP({s!r})")
        super().__init__(0)


class Async(SSP):
    """Asynchronous (ASP, Hogwild!): never wait. Exactly ``SSP(math.inf)``."""

    __slots__ = ()

    def __init__(self, s=math.inf):
        if s != math.inf:
            raise InvalidArgument(f"Async is SSP(math.inf); got s={s!r}: use SSP({s!r})")
        super().__init__(math.inf)


# --------------------------------------------------------------------------- DSSP

def dssp_extra(last_f, interval_f, last_s, interval_s, r_max) -> int:
    """DSSP's synchronization controller (Zhao et al., ICDCS 2019), pure: the r in
    ``[0, r_max]`` whose predicted finish ``last_f + r·interval_f`` of the fastest
    worker is closest to one of the slowest's ``last_s + k·interval_s`` (k ≥ 1; ties:
    the smaller r); 0 when an interval is not positive and finite
    (``hogkit.kernels.clock.dssp_extra``, the one definition)."""
    from hogkit.kernels.clock import dssp_extra as _extra
    return int(_extra(float(last_f), float(interval_f), float(last_s), float(interval_s),
                      int(r_max)))


class DSSP(_Value):
    """Dynamic SSP (Zhao et al., ICDCS 2019): the bound is chosen at run time in
    [s_lo, s_hi].

    Worker p at clock c, lag ``c − min`` (DONE workers excluded, as in :class:`SSP`):

    - lag ≤ s_lo: proceed (plain SSP(s_lo)); the current episode ends.
    - lag > s_lo and no grant yet in this episode: if p is the fastest (its clock is the
      maximum among running workers) the synchronization controller :func:`dssp_extra`
      picks r* ∈ [0, s_hi − s_lo] from the predicted finish times of p
      (``last_p + r·interval_p``) and of the slowest worker
      (``last_slow + k·interval_slow``); otherwise r* = 0. The grant is recorded; the
      episode's bound is ``s_lo + r*``.
    - p proceeds while lag ≤ s_lo + r*; past that it waits (as SSP(s_lo + r*)) and the
      grant is dropped once released, so the next iteration decides again with fresh
      timings. The bound in force is always in [s_lo, s_hi]; ``bound`` is s_hi.

    Timing (docs/algorithms.md §2: "intervals are each worker's latest iteration time"): every
    worker records, at each finish, its finish time (heartbeat) and how long that
    iteration took (``clocks.tick_iteration(rank, beat=True)``; the compiled step core
    does the same). The decision is ``hogkit.kernels.clock.dssp_decide`` on those
    slots: one definition for the live Python path, the compiled core and the
    simulator. A worker's own "now" is its last finish (it decides right after
    finishing).

    Per-rank episode state (the grant in force) lives in this object, so each spawned
    worker holds its own copy. :meth:`grants` gives the histogram of r* decisions.
    """

    _key = ("s_lo", "s_hi")

    def __init__(self, s_lo, s_hi):
        self.s_lo = _check_bound("s_lo", s_lo, "DSSP lower bound")
        self.s_hi = _check_bound("s_hi", s_hi, "DSSP upper bound")
        if self.s_lo == math.inf or self.s_hi == math.inf:
            raise InvalidArgument(f"DSSP bounds must be finite ints, got s_lo={s_lo}, "
                                  f"s_hi={s_hi}; use Async() for unbounded")
        if self.s_hi < self.s_lo:
            raise InvalidArgument(f"DSSP needs s_lo <= s_hi, got s_lo={self.s_lo}, "
                                  f"s_hi={self.s_hi}; swap them")
        self._extra = {}
        self._grants = {}

    @property
    def bound(self):
        """The largest lag DSSP ever allows (s_hi)."""
        return self.s_hi

    def may_proceed(self, iterations, state, rank) -> bool:
        """The guarantee only (lag ≤ s_hi); the run-time choice needs timings."""
        return may_proceed(iterations, state, rank, self.s_hi)

    def current_bound(self, rank):
        """The bound in force for ``rank`` now (s_lo outside a grant episode)."""
        extra = self._extra.get(rank)
        return self.s_lo if extra is None else self.s_lo + extra

    def decide(self, clocks, rank) -> int:
        """The grant r* for ``rank`` past s_lo (see the class doc), recorded in the
        histogram; the caller holds it for the episode."""
        from hogkit.kernels.clock import dssp_decide
        r = int(dssp_decide(clocks.slots, rank, int(clocks.heartbeat_ns[rank]),
                            self.s_lo, self.s_hi))
        hist = self._grants.setdefault(rank, {})
        hist[r] = hist.get(r, 0) + 1
        return r

    def wait(self, clocks, rank, *, timeout=60.0, stale_after=STALE_AFTER) -> float:
        """Block until ``rank`` may proceed under the run-time bound (see class doc)."""
        lag = clocks.lag(rank)
        if lag <= self.s_lo:
            self._extra[rank] = None
            return 0.0
        if self._extra.get(rank) is None:
            self._extra[rank] = self.decide(clocks, rank)
        bound = self.s_lo + self._extra[rank]
        if lag <= bound:
            return 0.0
        waited = self.wait_bound(clocks, rank, bound, timeout=timeout,
                                 stale_after=stale_after)
        self._extra[rank] = None       # released: decide again at the next sync point
        return waited

    def wait_bound(self, clocks, rank, bound, *, timeout=60.0, stale_after=STALE_AFTER):
        """Block until ``rank``'s lag is ``<= bound``; the compiled core's hand-back."""
        return _wait_loop(self, clocks, rank, timeout, stale_after, lambda: bound)

    def grants(self, rank=None) -> dict:
        """Histogram ``{r*: count}`` of the extra iterations granted (one per decision),
        for ``rank`` or summed over the ranks this instance served."""
        if rank is not None:
            return dict(sorted(self._grants.get(rank, {}).items()))
        out = {}
        for h in self._grants.values():
            for r, n in h.items():
                out[r] = out.get(r, 0) + n
        return dict(sorted(out.items()))

    def config(self) -> dict:
        return {"name": "dssp", "s_lo": self.s_lo, "s_hi": self.s_hi}

    def __repr__(self):
        return f"DSSP({self.s_lo}, {self.s_hi})"

    def _fresh(self):
        self._extra, self._grants = {}, {}          # episode state is not shipped


# --------------------------------------------------------------------------- LocalSGD

class LocalSGD(_Value):
    """Local SGD with h local steps between merges (HLSGD, Zhou et al. 2020).

    Each worker takes ``h`` steps on a private replica starting from ``base`` (the shared
    values it pulled), then merges its change ``Δ = replica − base`` into the shared
    model as ``shared += Δ / W`` (:mod:`hogkit.policy.local_sgd`): when all W workers merge
    deltas from the same base, the shared model becomes ``base + mean_w Δ_w``, the
    model average of local SGD. With ``overlap=True`` the merge of round k runs while
    round k+1's local phase goes on (the worker commits its replica, keeps stepping, and
    merges the committed delta); the runtime owns those mechanics.

    Waiting: merges are lock-free adds, so no barrier is needed for correctness;
    ``wait`` behaves as :func:`Async` (``bound`` is ∞). hogkit departs from synchronous
    local SGD here (it averages at a barrier every h steps): merges arrive asynchronously,
    each at most h local steps old, which is the overlap the HLSGD paper aims for.
    """

    __slots__ = ("h", "overlap")
    _key = ("h", "overlap")

    def __init__(self, h, overlap=False):
        self.h = check_int("local steps h", h, min_value=1,
                           fix="use h=1 to merge after every step")
        if not isinstance(overlap, bool):
            raise InvalidType(f"overlap={overlap!r} must be a bool")
        self.overlap = overlap

    bound = math.inf

    def may_proceed(self, iterations, state, rank) -> bool:
        return True

    def wait(self, clocks, rank, *, timeout=60.0, stale_after=STALE_AFTER) -> float:
        return 0.0

    def merges_after(self, step) -> bool:
        """True when iteration ``step`` (0-based) ends a local phase: ``(step+1) % h == 0``."""
        return (step + 1) % self.h == 0

    def config(self) -> dict:
        return {"name": "local", "h": self.h, "overlap": self.overlap}

    def __repr__(self):
        return f"LocalSGD({self.h}{', overlap=True' if self.overlap else ''})"

