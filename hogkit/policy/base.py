"""The policy contract: how a consistency policy admits a worker, said once.

Worker ``p``'s clock is ``c_p = clocks.iterations[p]`` (iterations finished). Before each
iteration a worker asks its policy whether it may start. A policy is a small picklable
object (:class:`Policy`) that

- **encodes itself**: :meth:`Policy.encode` gives a row of ``hogkit.kernels.clock``'s
  layout (``P_KIND, P_A, P_B``), and one admission state machine,
  ``hogkit.kernels.clock.admit``, reads it in every engine: the compiled step core
  (inlined in its loop), both simulator engines (at each virtual START; ``blocked``
  when a finish may wake a waiter) and :meth:`Policy.wait` below (the same kernel in a
  backoff loop, for the Python engine and for the compiled core's hand-back);
- **declares what the engines must know** as attributes, not as a class to ask
  ``isinstance`` of: ``local_steps`` (LocalSGD's h; 0 when the steps go to the shared
  model), ``overlap``, :meth:`Policy.merge_divisor` (what a merge divides a replica's
  change by: W, the average, by default), ``timing`` (the workers record each iteration's finish and
  length, which DSSP's controller reads), ``cluster_bound`` (the bound a cluster
  node's gate enforces against the other nodes; None: not supported across nodes),
  :meth:`Policy.simulable` (None, or why the simulator cannot model it);
- **is a value**: equality, hashing and pickling go through its settings (``_key``);
  the per-rank admission state (DSSP's grant in force, its histogram of grants) lives
  in small arrays on the instance, per process, and is not shipped;
- **is spelled** ``spell[:setting...]`` (``spell``, ``spell_args``): :func:`from_string`
  reads "ssp:4", "dssp:1:4", "delay:8"... through a registry that every subclass
  declaring ``spell`` joins, so the CLI and sweeps know a new policy unedited.

A policy of the user's own may still be duck-typed with only ``wait(clocks, rank, *,
timeout)``: the Python engine calls it; the compiled core and the simulator need
``encode()`` and say so (``hogkit.engine.step.compiled_support``,
``RunPlan.simulable``).

Choices made here (the papers leave them open):

- **DONE workers are excluded from the minimum** (treated as infinitely fast). A worker
  that finished its steps never ticks again; counting its frozen clock would block the
  others forever when workers run different numbers of steps. The waiting worker itself
  always counts, so ``lag = c_p − min`` is never negative. FAILED and IDLE workers count
  with their clocks as they are (an IDLE worker is about to start at 0).
- **Stop**: ``wait`` returns as soon as ``clocks.stopping()`` is true, without proceeding
  rights; the caller must check ``clocks.stopping()`` after ``wait`` (the runtime does).
- **Failure**: if a worker that blocks the waiter (one whose counter keeps the waiter's
  lead above the bound: ``hogkit.kernels.clock.holding_back``) is marked FAILED,
  ``wait`` raises :class:`~hogkit.errors.WorkerFailed` naming that rank at once.
  Otherwise, after ``timeout`` seconds it raises :class:`~hogkit.errors.PolicyTimeout`
  naming each blocking rank, its clock, state and heartbeat age, flagging as
  *suspect* any whose heartbeat is older than ``stale_after``. A frozen clock
  therefore never blocks anyone forever.
- **Waiting** re-checks without sleeping for the first 100 µs (a barrier between
  workers of equal speed usually opens within that), then sleeps from 20 µs doubling
  to a 0.5 ms cap, so a long wait costs no core and wakes at most ~0.5 ms late. With
  a 2 ms cap, LB-BSP's balanced barriers woke late often enough to cut its gain
  from 1.63x to 1.39x (benchmarks/RESULTS.md).
- **Release**: a worker whose wait ended proceeds once without a new check, and a
  DSSP grant in force is dropped (its next admission decides afresh).
- The check reads the clock vector slot by slot while others write it; it is not a
  snapshot, but every slot only grows, so a stale read can only make the waiter wait
  longer, never let it proceed past the bound.
"""

from __future__ import annotations

import math
import time

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType, PolicyTimeout, WorkerFailed
from hogkit.kernels import clock as _kc
from hogkit.state.clocks import DONE, FAILED, STATES
from hogkit.validation import check_float, check_int

__all__ = ["Policy", "clock_lag", "from_string", "STALE_AFTER"]

#: Backoff: immediate re-checks, then sleeps from _SLEEP_MIN doubling to _SLEEP_MAX (s).
_SPINS = 4
_SLEEP_MIN = 20e-6
_SLEEP_MAX = 5e-4
#: ...and re-check without sleeping for the first _SPIN_S seconds of a wait (s)
_SPIN_S = 1e-4
#: A blocking peer whose heartbeat is older than this (s) is named as suspect.
STALE_AFTER = 10.0

#: spell -> policy class (every subclass that declares ``spell``), in definition order
_REGISTRY: dict = {}


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


def check_bound(name, value, what):
    """A bound setting: a non-negative int, or ``math.inf`` (returned as is)."""
    if isinstance(value, float) and value == math.inf:
        return math.inf
    value = check_int(f"{what} {name}", value,
                      fix="pass a non-negative int, or use Async() for unbounded")
    if value < 0:
        raise InvalidArgument(f"{what} {name}={value} must be a non-negative int; "
                              f"use Async() for unbounded")
    return value


# --------------------------------------------------------------------------- spelling

def spellings() -> str:
    """Every registered string form, e.g. ``"async" | "bsp" | "ssp:S" | ...``."""
    return " | ".join(f'"{form}"' for cls in _REGISTRY.values()
                      for form in cls.spell_forms())


def from_string(text):
    """The policy a string names: ``spell[:setting...]``, case-insensitive, e.g.
    ``async``, ``bsp``, ``ssp:4``, ``dssp:1:4``, ``local:8``, ``local:8:overlap``,
    ``delay:8`` (:func:`spellings` lists every registered form)."""
    if not isinstance(text, str):
        raise InvalidType(f"policy must be a string such as 'ssp:2', got "
                          f"{type(text).__name__}")
    parts = [p.strip() for p in text.strip().lower().split(":")]
    cls = _REGISTRY.get(parts[0])
    if cls is None:
        raise InvalidArgument(f"unknown policy {text!r}; expected {spellings()}")
    return cls.from_fields(text, parts[1:])


def spelled_int(text, field, name):
    """One int setting of a policy's string form, or an error naming it."""
    try:
        return int(field)
    except ValueError:
        raise InvalidArgument(f"policy {text!r}: {name}={field!r} is not an int; "
                              f"expected {spellings()}") from None


# --------------------------------------------------------------------------- the contract

class Policy:
    """A consistency policy (the module docstring is the contract). Subclasses set
    ``_key`` (their settings), implement :meth:`encode`, :meth:`config` and
    ``__repr__``, and override the capability attributes that differ."""

    __slots__ = ("_ranks", "_row")
    _key = ()                       # the attributes that are the settings
    spell = None                    # the string form's first field ("ssp")
    spell_args = ()                 # names of its int settings, in order ("s",)
    local_steps = 0                 # LocalSGD's h: steps on a private replica per merge
    overlap = False                 # LocalSGD: a merge overlaps the next local phase
    timing = False                  # workers record each iteration's finish and length
    cluster_bound = None            # the bound a cluster gate enforces; None: refused
    bound = math.inf                # the largest lead it ever allows
    _counted = ("clock", "c")       # what the bound counts (for messages)

    def merge_divisor(self, workers: int) -> int:
        """A local phase's merge adds ``(replica − base) / merge_divisor(W)`` to the
        shared model: W (local SGD's average) unless the policy says otherwise."""
        return workers

    def __new__(cls, *args, **kwargs):
        self = object.__new__(cls)
        self._ranks, self._row = {}, None       # per-process admission state
        return self

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "spell" in cls.__dict__ and cls.spell is not None:
            _REGISTRY[cls.spell] = cls

    # ------------------------------------------------------------------ what it is
    def encode(self) -> np.ndarray:
        """This policy's row for ``hogkit.kernels.clock.admit`` (``NPOL`` int64)."""
        raise NotImplementedError(f"{type(self).__name__} must define encode() (see "
                                  f"hogkit.kernels.clock: P_KIND, P_A, P_B)")

    @staticmethod
    def row(kind, a=0, b=0) -> np.ndarray:
        """A policy row of kind ``kind`` (``hogkit.kernels.clock.K_*``) with settings
        ``a``, ``b``."""
        r = np.zeros(_kc.NPOL, np.int64)
        r[_kc.P_KIND], r[_kc.P_A], r[_kc.P_B] = kind, a, b
        return r

    def simulable(self):
        """None when the simulator can model this policy, else why not."""
        return None

    @classmethod
    def from_fields(cls, text, fields):
        """The policy of string form ``text`` from its fields after the spell: one int
        per ``spell_args`` (override for other settings)."""
        if len(fields) != len(cls.spell_args):
            raise InvalidArgument(f"policy {text!r} has {len(fields)} argument(s); "
                                  f"expected {spellings()}")
        return cls(*(spelled_int(text, f, n) for f, n in zip(fields, cls.spell_args)))

    @classmethod
    def spell_forms(cls):
        """The string forms of this class (for messages): ``spell:ARG...``."""
        return (":".join([cls.spell] + [n.upper() for n in cls.spell_args]),)

    def config(self) -> dict:
        return {"name": type(self).__name__.lower(),
                **{k: getattr(self, k) for k in self._key}}

    # ------------------------------------------------------------------ value
    def _values(self):
        return tuple(getattr(self, k) for k in self._key)

    def _family(self):
        return type(self)

    def __eq__(self, other):
        return isinstance(other, self._family()) and other._values() == self._values()

    def __hash__(self):
        return hash((self._family().__name__,) + self._values())

    def __getstate__(self):
        return self._values()

    def __setstate__(self, values):
        for k, v in zip(self._key, values):
            setattr(self, k, v)

    # ------------------------------------------------------------------ admission
    def _encoded(self):
        """``(row, never_waits)``, encoded once per instance (settings are values)."""
        if self._row is None:
            row = np.ascontiguousarray(self.encode(), np.int64)
            self._row = (row, bool(_kc.unbounded(row)))
        return self._row

    def admission(self, rank):
        """``(adm, grants)``: worker ``rank``'s admission state and histogram of DSSP
        grants in this process (``hogkit.kernels.clock`` layout)."""
        st = self._ranks.get(rank)
        if st is None:
            st = self._ranks[rank] = (_kc.admission_state(),
                                      np.zeros(_kc.GRANT_BINS, np.int64))
        return st

    def wait(self, clocks, rank, *, timeout=60.0, stale_after=STALE_AFTER) -> float:
        """Block until worker ``rank`` may start its next iteration (or stop is asked):
        ``hogkit.kernels.clock.admit``, then, if it says wait, the backoff loop of the
        module docstring until the lead is down to the bound, then the release.

        Returns the seconds waited. Raises WorkerFailed if a blocking peer is FAILED,
        PolicyTimeout after ``timeout`` seconds. The caller checks ``clocks.stopping()``.
        """
        pol, free = self._encoded()
        if free:
            return 0.0
        slots = _slots(clocks, rank)
        adm, grants = self.admission(rank)
        if _kc.admit_now(slots, rank, pol, adm, grants):
            return 0.0
        waited = self._block(clocks, rank, adm, timeout, stale_after)
        _kc.proceed_released(adm)
        return waited

    def wait_bound(self, clocks, rank, bound, *, timeout=60.0, stale_after=STALE_AFTER):
        """Block until ``rank``'s lead is ``<= bound`` (or stop is asked): the wait the
        compiled step core hands back to Python when its admission test fails (the
        caller then releases the core)."""
        _slots(clocks, rank)
        adm = self.admission(rank)[0]
        adm[_kc.A_WAIT] = bound
        return self._block(clocks, rank, adm, timeout, stale_after)

    def _block(self, clocks, rank, adm, timeout, stale_after):
        """The backoff loop over ``hogkit.kernels.clock.blocked``; seconds waited."""
        pol = self._encoded()[0]
        slots = clocks.slots
        if not _kc.blocked(slots, rank, pol, adm):
            return 0.0
        timeout = check_float("timeout", timeout, min_value=0.0,
                              fix="pass a timeout in seconds, e.g. timeout=60.0")
        t0 = time.monotonic()
        deadline = t0 + timeout
        spins, sleep = 0, _SLEEP_MIN
        while True:
            if not _kc.blocked(slots, rank, pol, adm) or clocks.stopping():
                return time.monotonic() - t0
            blockers = self._blockers(slots, rank, pol, adm)
            self._raise_if_failed(clocks, rank, pol, blockers)
            now = time.monotonic()
            if now >= deadline:
                raise self._timeout_error(clocks, rank, pol, adm, blockers, now - t0,
                                          timeout, stale_after)
            if spins < _SPINS or now - t0 < _SPIN_S:
                spins += 1
                continue
            time.sleep(min(sleep, max(deadline - now, 0.0)))
            sleep = min(sleep * 2.0, _SLEEP_MAX)

    @staticmethod
    def _blockers(slots, rank, pol, adm):
        out = np.empty(slots.shape[0], np.int64)
        return out[:_kc.holding_back(slots, rank, pol, adm, out)].tolist()

    def _raise_if_failed(self, clocks, rank, pol, blockers):
        col = _kc.counted(pol)
        for q in blockers:
            if clocks.state[q] == FAILED:
                what, sym = self._counted
                mine = int(clocks.slots[rank, col])
                raise WorkerFailed(
                    q, step=int(clocks.iterations[q]),
                    reason=(f"is marked FAILED; its frozen {what} {sym}="
                            f"{int(clocks.slots[q, col])} blocks worker {rank} ({what} "
                            f"{mine}) under {self!r}"))

    def _needs(self, mine, bound) -> str:
        """What the waiter needs, in words (the SSP family's minimum clock)."""
        return f"every running worker at {self._counted[0]} >= {mine - bound}"

    def _timeout_error(self, clocks, rank, pol, adm, blockers, waited, timeout,
                       stale_after):
        col = _kc.counted(pol)
        what = self._counted[0]
        now_ns = time.monotonic_ns()
        parts, suspects = [], []
        for q in blockers:
            hb = int(clocks.heartbeat_ns[q])
            age = (now_ns - hb) / 1e9 if hb > 0 else math.inf
            state = STATES.get(int(clocks.state[q]), str(int(clocks.state[q])))
            desc = f"worker {q} ({what} {int(clocks.slots[q, col])}, state {state}, "
            desc += "never beat" if hb <= 0 else f"last beat {age:.2f} s ago"
            if age > stale_after:
                desc += f"; suspect: no heartbeat for > {stale_after:g} s"
                suspects.append(q)
            parts.append(desc + ")")
        mine = int(clocks.slots[rank, col])
        err = PolicyTimeout(
            f"{self!r}: worker {rank} at {what} {mine} waited {waited:.3f} s "
            f"(timeout={timeout:g} s) for {', '.join(parts) or 'no identifiable worker'}; "
            f"it needs {self._needs(mine, int(adm[_kc.A_WAIT]))}. Raise timeout=..., "
            f"loosen the bound, or look for a stuck worker")
        err.rank = rank
        err.blockers = list(blockers)
        err.suspects = suspects
        return err


def _slots(clocks, rank):
    """The clock slots, once ``rank`` is checked (the kernels check nothing)."""
    slots = clocks.slots
    if not 0 <= rank < slots.shape[0]:
        raise InvalidArgument(f"rank={rank} is not a worker of these clocks (0 <= rank < "
                              f"{slots.shape[0]})")
    return slots
